#!/usr/bin/python3
"""Checks a live framelinkd's /metrics with Prometheus' own parser, and the alert rules against it.

A framelinkd is started as check_grafana_dashboard.py starts one, its /metrics is parsed with
prometheus_client.parser (Debian: python3-prometheus-client), and the conventions the
hand-written exposition must keep are asserted: every counter's name ends in _total, every
histogram has _bucket, _sum and _count with its buckets in seconds, framelink_build_info is
there, and a status label is an fl_status name, never a bare code. Then the alert rules file must
be valid YAML (python3-yaml) whose expressions name only metrics the daemon exports.
Where Prometheus' promtool is installed (Debian's prometheus package; not a dependency), its
`check metrics` lint and `check rules` must pass too.

usage: check_metrics_exposition.py ALERT_RULES FRAMELINKD
"""
import math
import os
import re
import shutil
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_grafana_dashboard import scrape  # noqa: E402  (the same daemon, started the same way)

errors = []


def check(ok, message):
    if not ok:
        errors.append(message)


def typed_names(text):
    """name -> type from the # TYPE lines, as exposed (the parser drops a counter's _total)."""
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind.strip()
    return types


def check_exposition(text):
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and others on malformed input
        print("check_metrics_exposition: the parser refused /metrics: %r" % e, file=sys.stderr)
        sys.exit(1)
    check(families, "no metric families in /metrics")
    types = typed_names(text)
    for name, kind in types.items():
        check(name.startswith("framelink_"), "%s: not prefixed framelink_" % name)
        if kind == "counter":
            check(name.endswith("_total"), "counter %s does not end in _total" % name)
        else:
            check(not name.endswith("_total"), "%s %s ends in _total but is no counter" % (kind, name))

    sample_names = set()
    by_name = {}
    for f in families:
        by_name[f.name] = f
        check(f.documentation, "%s has no HELP" % f.name)
        for s in f.samples:
            sample_names.add(s.name)
            status = s.labels.get("status")
            if status is not None:
                check(not status.isdigit(), "%s{status=\"%s\"}: a bare code, not its name" % (s.name, status))
                check(re.fullmatch(r"FL_[A-Z0-9_]+", status) is not None,
                      "%s{status=\"%s\"}: not an fl_status name" % (s.name, status))
        if f.type == "counter":
            for s in f.samples:
                check(s.name.endswith("_total"), "counter sample %s does not end in _total" % s.name)
        if f.type == "histogram":
            check_histogram(f)
    check(any(f.type == "histogram" for f in families), "no histogram in /metrics")

    info = by_name.get("framelink_build_info")
    check(info is not None, "framelink_build_info is missing")
    if info is not None:
        check(len(info.samples) == 1 and info.samples[0].value == 1,
              "framelink_build_info must be one sample of value 1")
        version = info.samples[0].labels.get("version", "") if info.samples else ""
        check(re.fullmatch(r"\d+\.\d+\.\d+", version) is not None,
              "framelink_build_info{version=\"%s\"} is no MAJOR.MINOR.PATCH" % version)
    failed = by_name.get("framelink_frames_failed")
    check(failed is not None and failed.type == "counter" and
          any(s.labels.get("status") == "FL_ERR_NO_CONSUMER" for s in failed.samples),
          "framelink_frames_failed_total{status=\"FL_ERR_NO_CONSUMER\"} is missing")
    return sample_names


def check_histogram(f):
    suffixes = {s.name[len(f.name):] for s in f.samples}
    for suffix in ("_bucket", "_sum", "_count"):
        check(suffix in suffixes, "histogram %s has no %s" % (f.name, suffix))
    check(f.name.endswith("_seconds"), "histogram %s is not in seconds (name ends _seconds)" % f.name)
    bounds = [float(s.labels["le"]) for s in f.samples if s.name == f.name + "_bucket"]
    check(bounds and bounds[-1] == math.inf, "histogram %s has no le=\"+Inf\" bucket" % f.name)
    finite = [b for b in bounds if b != math.inf]
    check(finite == sorted(finite), "histogram %s: buckets not in order" % f.name)
    # In seconds, a delivery's bounds run from microseconds to seconds; a bound of a minute or
    # more (microseconds would reach 8388608) means another unit.
    check(finite and 0 < finite[0] < 1e-3 and finite[-1] < 60,
          "histogram %s: buckets %s..%s are not seconds" % (f.name, finite[:1], finite[-1:]))
    count = [s.value for s in f.samples if s.name == f.name + "_count"]
    inf = [s.value for s in f.samples if s.name == f.name + "_bucket" and s.labels["le"] in ("+Inf", "inf")]
    check(count == inf, "histogram %s: _count %s is not the +Inf bucket %s" % (f.name, count, inf))


def check_alerts(path, sample_names):
    try:
        rules = yaml.safe_load(open(path, encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        print("check_metrics_exposition: %s is not valid YAML: %s" % (path, e), file=sys.stderr)
        sys.exit(1)
    alerts = [r for g in rules.get("groups", []) for r in g.get("rules", [])]
    check(alerts, "%s has no rules" % path)
    named = set()
    for r in alerts:
        check(r.get("alert") and r.get("expr"), "a rule without alert or expr: %r" % r)
        check(r.get("annotations", {}).get("summary"), "alert %s has no summary" % r.get("alert"))
        for name in re.findall(r"\bframelink_[a-z0-9_]+", str(r.get("expr", ""))):
            named.add(name)
            check(name in sample_names, "alert %s: %s is not in framelinkd's /metrics" % (r.get("alert"), name))
    return len(alerts), len(named)


def promtool(args, stdin=None):
    """promtool's verdict, or None when it is not installed."""
    tool = shutil.which("promtool")
    if tool is None:
        return None
    r = subprocess.run([tool] + args, input=stdin, capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, "promtool %s: %s" % (" ".join(args), (r.stdout + r.stderr).strip()))
    return r.returncode == 0


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    alerts_path, framelinkd = sys.argv[1], sys.argv[2]
    text = scrape(framelinkd)
    sample_names = check_exposition(text)
    alerts, named = check_alerts(alerts_path, sample_names)
    linted = promtool(["check", "metrics"], stdin=text)
    promtool(["check", "rules", alerts_path])
    if errors:
        print("check_metrics_exposition:\n  " + "\n  ".join(errors), file=sys.stderr)
        sys.exit(1)
    print("/metrics: %d series names, parsed by prometheus_client%s; %s: %d alerts naming %d metrics, all exported" %
          (len(sample_names), "" if linted is None else ", promtool check metrics/rules clean",
           alerts_path, alerts, named))


if __name__ == "__main__":
    main()
