#!/usr/bin/env python3
"""Checks packaging/grafana/framelink.json against a real framelinkd.

The dashboard must be valid JSON with a Prometheus data source variable that
every panel and query uses, and every framelink_* metric it queries must be
one the daemon exports: a framelinkd is started with --metrics on a free
loopback port and its /metrics scraped, so that renaming a metric without the
dashboard (or the other way round) fails here.

usage: check_grafana_dashboard.py DASHBOARD FRAMELINKD
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def fail(message):
    print("check_grafana_dashboard: " + message, file=sys.stderr)
    sys.exit(1)


def scrape(framelinkd):
    """The text of /metrics of a framelinkd started for it (check_metrics_exposition.py uses it too)."""
    with tempfile.TemporaryDirectory(prefix="fl-metrics") as tmp:
        ready = os.path.join(tmp, "ready")
        log = open(os.path.join(tmp, "daemon.log"), "w")
        # A configured peer that never answers, so that the per-peer series exist too.
        daemon = subprocess.Popen(
            [framelinkd, "--id", "grafana-check", "--socket", os.path.join(tmp, "d.sock"),
             "--ready-file", ready, "--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
             "--metrics", "127.0.0.1:0", "--hugepages", "off", "--peer", "nowhere=127.0.0.1:1"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            port = 0
            while time.monotonic() < deadline and port == 0:
                if daemon.poll() is not None:
                    fail("framelinkd exited with %d: %s" % (daemon.returncode,
                                                            open(os.path.join(tmp, "daemon.log")).read()))
                if os.path.exists(ready):
                    for line in open(ready):
                        if line.startswith("metrics_port="):
                            port = int(line.split("=", 1)[1])
                time.sleep(0.05)
            if port == 0:
                fail("framelinkd did not write its metrics port to the ready file within 20 s")
            # The data agent publishes its per-link gauges twice a second.
            time.sleep(1.2)
            return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()


def exported_metrics(framelinkd):
    """Names in the daemon's /metrics: samples, and every # TYPE (histograms with _bucket/_count)."""
    text = scrape(framelinkd)
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            names.add(name)
            if kind.strip() == "histogram":
                names.update({name + "_bucket", name + "_count"})
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names


def main():
    if len(sys.argv) != 3:
        fail(__doc__.strip().splitlines()[-1])
    dashboard_path, framelinkd = sys.argv[1], sys.argv[2]
    try:
        dashboard = json.load(open(dashboard_path, encoding="utf-8"))
    except (OSError, ValueError) as e:
        fail("%s is not valid JSON: %s" % (dashboard_path, e))

    variables = dashboard.get("templating", {}).get("list", [])
    ds_vars = [v for v in variables if v.get("type") == "datasource" and v.get("query") == "prometheus"]
    if len(ds_vars) != 1:
        fail("expected one Prometheus data source variable in templating.list, found %d" % len(ds_vars))
    ds_ref = "${%s}" % ds_vars[0]["name"]

    exprs = []
    ids = set()

    def walk(panels):
        for p in panels:
            if p.get("type") == "row":
                walk(p.get("panels", []))
                continue
            if p.get("id") in ids:
                fail("panel id %s is used twice" % p.get("id"))
            ids.add(p.get("id"))
            title = p.get("title", "?")
            if p.get("datasource", {}).get("uid") != ds_ref:
                fail("panel '%s' does not use the data source variable %s" % (title, ds_ref))
            targets = p.get("targets", [])
            if not targets:
                fail("panel '%s' has no query" % title)
            for t in targets:
                if t.get("datasource", {}).get("uid") != ds_ref:
                    fail("a query of panel '%s' does not use %s" % (title, ds_ref))
                if not t.get("expr"):
                    fail("a query of panel '%s' has no expr" % title)
                exprs.append((title, t["expr"]))

    walk(dashboard.get("panels", []))
    for v in variables:
        if v.get("type") == "query":
            q = v.get("query")
            exprs.append(("variable " + v["name"], q.get("query", "") if isinstance(q, dict) else q or ""))

    exported = exported_metrics(framelinkd)
    queried = set()
    missing = []
    for title, expr in exprs:
        for name in re.findall(r"\bframelink_[a-z0-9_]+", expr):
            queried.add(name)
            if name not in exported:
                missing.append("%s (in '%s')" % (name, title))
    if not queried:
        fail("the dashboard queries no framelink_* metric")
    if missing:
        fail("the dashboard queries metrics framelinkd does not export: " + ", ".join(sorted(set(missing))))
    print("%s: %d panels, %d queries, %d metrics, all exported by framelinkd" %
          (dashboard_path, len(ids), len(exprs), len(queried)))


if __name__ == "__main__":
    main()
