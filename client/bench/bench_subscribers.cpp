// The fan-out cases of `framelink-bench run`: one stream with one subscriber
// against one with N (runSubscribers), on one host or two (runTwoHosts), each
// measured in halves by runCase and combined.
#include <string>
#include <vector>

#include "bench_case.h"
#include "cli_util.h"

namespace framelink::cli {

double SubscribersResult::aggregateRatio() const {
  return one.fps > 0 && many.fps > 0 ? many.fps * subscribers / one.fps : 0;
}

namespace {

// The streams of runSubscribers after their prefix: the halves with one reader, and with N.
constexpr char kOneFirst[] = "1a";
constexpr char kOneSecond[] = "1b";
constexpr char kManyFirst[] = "Na";
constexpr char kManySecond[] = "Nb";

// The mean of the measured ones (>= 0) of `x` and `y`, weighted by `wx` and `wy`; -1 when neither is.
double weighted(double x, double wx, double y, double wy) {
  if (x < 0) wx = 0;
  if (y < 0) wy = 0;
  return wx + wy > 0 ? (x * wx + y * wy) / (wx + wy) : -1;
}

// Two runs of one case as one: frames and bytes over both timed parts, the daemons' share of a core
// weighted by time, the per-frame figures by frames.
CaseResult combine(const CaseResult& a, const CaseResult& b) {
  CaseResult r;
  r.seconds = a.seconds + b.seconds;
  r.delivered = a.delivered + b.delivered;
  r.failed = a.failed + b.failed;
  r.verified = a.verified + b.verified;
  r.verify_bad = a.verify_bad + b.verify_bad;
  if (r.seconds > 0) {
    r.gbps = (a.gbps * a.seconds + b.gbps * b.seconds) / r.seconds;
    r.fps = static_cast<double>(r.delivered) / r.seconds;
  }
  r.cpu_a = weighted(a.cpu_a, a.seconds, b.cpu_a, b.seconds);
  r.cpu_b = weighted(a.cpu_b, a.seconds, b.cpu_b, b.seconds);
  const auto fa = static_cast<double>(a.delivered);
  const auto fb = static_cast<double>(b.delivered);
  r.cpu_us_per_frame_a = weighted(a.cpu_us_per_frame_a, fa, b.cpu_us_per_frame_a, fb);
  r.cpu_us_per_frame_b = weighted(a.cpu_us_per_frame_b, fa, b.cpu_us_per_frame_b, fb);
  r.user_us_per_frame_a = weighted(a.user_us_per_frame_a, fa, b.user_us_per_frame_a, fb);
  r.user_us_per_frame_b = weighted(a.user_us_per_frame_b, fa, b.user_us_per_frame_b, fb);
  r.sleeps_per_frame_a = weighted(a.sleeps_per_frame_a, fa, b.sleeps_per_frame_a, fb);
  r.sleeps_per_frame_b = weighted(a.sleeps_per_frame_b, fa, b.sleeps_per_frame_b, fb);
  r.link_bytes_per_frame =
      weighted(a.link_bytes_per_frame, fa + kVerifyFrames, b.link_bytes_per_frame, fb + kVerifyFrames);
  r.error = a.error + (a.error.empty() || b.error.empty() ? "" : "; ") + b.error;
  return r;
}

}  // namespace

SubscribersResult runSubscribers(DaemonPair& pair, const std::string& stream_prefix, CaseConfig c,
                                 uint32_t subscribers) {
  SubscribersResult r;
  r.subscribers = subscribers;
  c.subscribe = true;
  c.seconds /= 2;
  CaseConfig one = c;
  CaseConfig many = c;
  many.readers = subscribers;
  // One, N, N, one, each for half the time: when the machine's speed drifts (other load on a
  // shared host), both sides of the ratio see the same drift.  The link is counted in the first
  // half of each (its figure does not drift).
  r.one = runCase(pair, stream_prefix + kOneFirst, one);
  if (g_interrupted.load()) return r;
  r.many = runCase(pair, stream_prefix + kManyFirst, many);
  one.count_link = false;
  many.count_link = false;
  if (g_interrupted.load()) return r;
  r.many = combine(r.many, runCase(pair, stream_prefix + kManySecond, many));
  if (g_interrupted.load()) return r;
  r.one = combine(r.one, runCase(pair, stream_prefix + kOneSecond, one));
  return r;
}

std::vector<std::string> twoHostsRoutes(const std::string& stream_prefix) {
  const std::string one = "=hostB";
  const std::string both = "=hostB,hostC";
  return {"--route", stream_prefix + kOneFirst + one,   "--route", stream_prefix + kOneSecond + one,
          "--route", stream_prefix + kManyFirst + both, "--route", stream_prefix + kManySecond + both};
}

SubscribersResult runTwoHosts(DaemonPair& daemons, const std::string& stream_prefix, CaseConfig c) {
  c.others_on_c = true;
  return runSubscribers(daemons, stream_prefix, c, 2);
}

}  // namespace framelink::cli
