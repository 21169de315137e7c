#include "bench_case.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <string>
#include <vector>

#include "admin.h"
#include "child_process.h"
#include "cli_util.h"
#include "consumer.h"
#include "frame_pattern.h"
#include "pattern_clients.h"
#include "producer.h"

namespace framelink::cli {
namespace {

// Written by the parent, read by every producer of a case.
struct CaseControl {
  std::atomic<uint64_t> go_ns{0};  // monotonic time at which all producers start their timed runs
  // followed by one CaseShared per pair, then the latency samples (ns) of pair 0
};

struct CaseShared {
  std::atomic<bool> stop_consumer{false};
  std::atomic<bool> abort{false};
  std::atomic<int> consumer_state{0};  // 0 starting, 1 attached, 2 failed
  std::atomic<int> producer_phase{0};  // 0 starting, 1 verifying, 2 ready, 3 timed, 4 done
  std::atomic<uint64_t> verified{0};
  std::atomic<uint64_t> verify_bad{0};
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> delivered{0};
  std::atomic<uint64_t> delivered_bytes{0};
  std::atomic<uint64_t> failed{0};
  std::atomic<int> first_failure{0};
  std::atomic<uint64_t> first_submit_ns{0};
  std::atomic<uint64_t> last_completion_ns{0};
  std::atomic<uint64_t> latency_count{0};
  std::atomic<uint32_t> extra_attached{0};  // subscribers beyond the first that attached
  std::atomic<uint64_t> extra_received{0};
  SharedText<768> consumer_error;
  SharedText<768> producer_error;
  SharedText<512> first_bad;
};
static_assert(sizeof(CaseControl) % alignof(CaseShared) == 0 && sizeof(CaseShared) % alignof(uint64_t) == 0,
              "the pairs and the latency samples follow CaseControl in one mapping");

// Consumer process of one pair: checks the first kVerifyFrames frames byte-for-byte, then (for a
// latency case) records the submit -> receive time of each frame after the warm-up into `lat`.
int benchConsumer(CaseShared& sh, uint64_t* lat, uint64_t lat_cap, const std::string& socket,
                  const std::string& stream, const CaseConfig& c) {
  std::string err;
  auto consumer = attachPatternConsumer(socket, stream, c.slots, c.size, err, c.subscribe || c.readers > 1);
  if (!consumer) {
    sh.consumer_error.set(err);
    sh.consumer_state.store(2);
    return 1;
  }
  sh.consumer_state.store(1);
  FrameChecker checker(patternChecks(c.size));
  ReceiveLoopOptions lo;
  lo.stop = &sh.stop_consumer;
  uint64_t n = 0;
  auto onFrame = [&](const fl_frame& f, uint64_t rx_real, std::string&) -> bool {
    if (n < kVerifyFrames) {
      const std::string why = checker.check(f);
      if (why.empty()) {
        sh.verified.fetch_add(1);
      } else {
        sh.verify_bad.fetch_add(1);
        sh.first_bad.set(why);
      }
    } else if (c.latency && f.frame_id >= kVerifyFrames + kLatencyWarmup) {
      const uint64_t i = sh.latency_count.load(std::memory_order_relaxed);
      if (i < lat_cap) {
        lat[i] = rx_real > f.timestamp_ns ? rx_real - f.timestamp_ns : 0;
        sh.latency_count.store(i + 1, std::memory_order_release);
      }
    }
    ++n;
    sh.received.store(n, std::memory_order_relaxed);
    return true;
  };
  ReceiveLoopStats st = receiveLoop(*consumer, lo, onFrame);
  if (!st.error.empty()) sh.consumer_error.set(st.error);
  return st.error.empty() ? 0 : 1;
}

// A subscriber beyond the first of a stream: receives and releases every frame, looking at none.
int extraReader(CaseShared& sh, const std::string& socket, const std::string& stream, const CaseConfig& c) {
  std::string err;
  auto consumer = attachPatternConsumer(socket, stream, c.slots, c.size, err, true);
  if (!consumer) {
    sh.consumer_error.set("subscriber: " + err);
    return 1;
  }
  sh.extra_attached.fetch_add(1);
  ReceiveLoopOptions lo;
  lo.stop = &sh.stop_consumer;
  auto onFrame = [&](const fl_frame&, uint64_t, std::string&) -> bool {
    sh.extra_received.fetch_add(1, std::memory_order_relaxed);
    return true;
  };
  ReceiveLoopStats st = receiveLoop(*consumer, lo, onFrame);
  if (!st.error.empty()) sh.consumer_error.set("subscriber: " + st.error);
  return st.error.empty() ? 0 : 1;
}

// The first failed completion of a pair is the one its error names.
void recordFailure(CaseShared& sh, const fl_completion& comp) {
  if (comp.status != FL_OK) {
    int expected = 0;
    sh.first_failure.compare_exchange_strong(expected, comp.status);
  }
}

// Phase 1: a few frames with the full pattern, checked byte-for-byte by the consumer; then every
// slot gets a pattern once, so that the timed frames only change metadata.  False on failure.
bool verifyAndPrefill(Producer& producer, CaseShared& sh, const CaseConfig& c) {
  sh.producer_phase.store(1);
  auto prepareFull = [&](uint64_t index, fl_slot& slot, FrameSpec& spec, std::string&) -> bool {
    describePatternFrame(index, c.size, spec);
    pattern::fillPattern(index, slot.data, c.size);
    return true;
  };
  auto onCompletion = [&](const fl_completion& comp) { recordFailure(sh, comp); };
  ProducerStats v =
      producer.run([](uint64_t i) { return i < kVerifyFrames; }, prepareFull, onCompletion, &sh.abort);
  if (!v.allDelivered()) {
    sh.producer_error.set(v.error.empty() ? "the verification frames were not all delivered" : v.error);
    sh.failed.store(v.failed);
    return false;
  }
  std::string err;
  if (!producer.prefillAllSlots([&](fl_slot& s) { pattern::fillPattern(s.index, s.data, c.size); }, err)) {
    sh.producer_error.set(err);
    return false;
  }
  return true;
}

// Every pair starts (and, when timed, stops) at the same moment, so that N pairs share the
// daemons for the whole measured interval: waits for the parent's go.  False when aborted.
bool awaitGo(const CaseControl& ctl, CaseShared& sh) {
  sh.producer_phase.store(2);
  while (ctl.go_ns.load() == 0) {
    if (sh.abort.load()) return false;
    usleep(500);
  }
  return true;
}

// Phase 2, timed: frames in the pre-filled slots for `seconds` after the go (or `count` frames);
// the pair's figures go to `sh`.
int timedRun(Producer& producer, const CaseControl& ctl, CaseShared& sh, const CaseConfig& c) {
  const uint64_t deadline_ns = c.seconds > 0 ? ctl.go_ns.load() + static_cast<uint64_t>(c.seconds * 1e9) : 0;
  auto more = [&](uint64_t i) {
    if (c.seconds > 0) return monotonicNs() < deadline_ns;
    return i < c.count;
  };
  auto prepareMeta = [&](uint64_t index, fl_slot&, FrameSpec& spec, std::string&) -> bool {
    describePatternFrame(kVerifyFrames + index, c.size, spec);
    return true;
  };
  auto onCompletion = [&](const fl_completion& comp) { recordFailure(sh, comp); };
  sh.producer_phase.store(3);
  ProducerStats st = producer.run(more, prepareMeta, onCompletion, &sh.abort);
  sh.producer_phase.store(4);
  sh.delivered.store(st.delivered);
  sh.delivered_bytes.store(st.bytes_delivered);
  sh.failed.store(st.failed);
  sh.first_submit_ns.store(st.first_submit_ns);
  sh.last_completion_ns.store(st.last_completion_ns);
  if (!st.error.empty()) sh.producer_error.set(st.error);
  return st.allDelivered() ? 0 : 1;
}

// Producer process of one pair: verification frames, the common go, the timed run.
int benchProducer(const CaseControl& ctl, CaseShared& sh, const std::string& socket,
                  const std::string& stream, const CaseConfig& c) {
  ProducerOptions po = patternProducerOptions(socket, stream, c.slots, c.size);
  po.stall_timeout_ms = 60000;
  po.max_in_flight = c.max_in_flight;  // 1 for latency: submit, wait for DELIVERED, next
  std::string err;
  auto producer = Producer::attach(po, err);
  if (!producer) {
    sh.producer_error.set(err);
    return 1;
  }
  if (!verifyAndPrefill(*producer, sh, c) || !awaitGo(ctl, sh)) return 1;
  return timedRun(*producer, ctl, sh, c);
}

}  // namespace

uint32_t slotsFor(uint64_t size) {
  // Keep ~32 MiB in flight so small frames are not limited by one ack round trip per slot.
  const uint64_t want = (32ull << 20) / std::max<uint64_t>(size, 1);
  return static_cast<uint32_t>(std::clamp<uint64_t>(want, 8, 64));
}

uint32_t pairSlotsFor(uint64_t size, uint32_t pairs) { return std::max<uint32_t>(8, slotsFor(size) / pairs); }

CaseConfig throughputCase(uint64_t size, double seconds) {
  CaseConfig c;
  c.size = size;
  c.slots = slotsFor(size);
  c.seconds = seconds;
  return c;
}

CaseConfig latencyCase(uint64_t samples) {
  CaseConfig c;
  c.size = 4096;
  c.slots = 8;
  c.count = samples + kLatencyWarmup;
  c.max_in_flight = 1;
  c.latency = true;
  return c;
}

namespace {

// What went wrong in one pair, or "".  Every one of its `extra_readers` subscribers beyond the first
// must have had every frame the first had: a frame one of them missed would count for all readers.
std::string pairError(const CaseShared& sh, int producer_rc, uint32_t extra_readers) {
  std::string e;
  const uint64_t want = extra_readers * sh.received.load();
  if (const uint64_t got = sh.extra_received.load(); got != want) {
    e = "the other subscribers received " + std::to_string(got) + " frames, not " + std::to_string(want);
  }
  if (!sh.producer_error.get().empty()) {
    e += std::string(e.empty() ? "" : "; ") + "producer: " + sh.producer_error.get();
  }
  if (const int s = sh.first_failure.load(); s != 0) {
    e += std::string(e.empty() ? "" : "; ") + fl_status_str(s);
  }
  if (!sh.consumer_error.get().empty()) {
    e += std::string(e.empty() ? "" : "; ") + "consumer: " + sh.consumer_error.get();
  }
  if (!sh.first_bad.get().empty()) e += std::string(e.empty() ? "" : "; ") + "verify: " + sh.first_bad.get();
  if (producer_rc != 0 && e.empty()) e = "producer exited with status " + std::to_string(producer_rc);
  return e;
}

// CPU time and sleeps of both daemons at one moment.
struct DaemonUsage {
  ProcessCpu cpu_a;
  ProcessCpu cpu_b;
  long long sleeps_a = -1;
  long long sleeps_b = -1;
};

DaemonUsage daemonUsage(const DaemonPair& pair) {
  DaemonUsage u;
  u.cpu_a = processCpu(pair.a().pid);
  u.cpu_b = processCpu(pair.b().pid);
  u.sleeps_a = processSleeps(pair.a().pid);
  u.sleeps_b = processSleeps(pair.b().pid);
  return u;
}

// One run of N pairs: the mapping the children report through (CaseControl, one CaseShared per
// pair, pair 0's latency samples), their pids, and the daemons' usage around the timed part.
struct StreamsRun {
  StreamsRun(DaemonPair& daemons, const std::vector<std::string>& names, const CaseConfig& config)
      : pair(daemons),
        streams(names),
        c(config),
        n(names.size()),
        lat_cap(config.latency ? config.count : 0),
        ctl(n * sizeof(CaseShared) + lat_cap * sizeof(uint64_t)),
        sh(n),
        sock_a(daemons.a().socket),
        sock_b(daemons.b().socket),
        sock_c(daemons.c().socket),
        consumers(n, -1),
        extra_readers(n * (config.readers > 1 ? config.readers - 1 : 0), -1),
        producers(n, -1),
        producer_rc(n, -1) {
    auto* base = static_cast<char*>(ctl.extra());
    for (size_t i = 0; i < n; ++i) sh[i] = new (base + i * sizeof(CaseShared)) CaseShared();
    lat = reinterpret_cast<uint64_t*>(base + n * sizeof(CaseShared));
  }
  // What an error of pair `i` starts with: its stream, unless it is the only one.
  std::string label(size_t i) const { return n == 1 ? std::string() : streams[i] + ": "; }

  DaemonPair& pair;
  const std::vector<std::string>& streams;
  const CaseConfig& c;
  const size_t n;
  const uint64_t lat_cap;
  SharedRegion<CaseControl> ctl;
  std::vector<CaseShared*> sh;
  uint64_t* lat = nullptr;
  const std::string sock_a;
  const std::string sock_b;
  const std::string sock_c;
  std::vector<pid_t> consumers;
  std::vector<pid_t> extra_readers;  // subscribers beyond the first of each stream
  std::vector<pid_t> producers;
  std::vector<int> producer_rc;  // -1 while the producer runs
  uint64_t w0 = 0;               // monotonic start of the timed part (the go), 0 before
  uint64_t w1 = 0;               // monotonic end of the timed part, 0 before
  DaemonUsage at_w0;
  DaemonUsage at_w1;
};

// Asks every consumer to stop and waits `wait_ms` for all of them together; a consumer still
// running then is killed.
void stopConsumers(StreamsRun& run, int wait_ms) {
  for (auto* s : run.sh) s->stop_consumer.store(true);
  const uint64_t deadline = monotonicNs() + static_cast<uint64_t>(wait_ms) * 1000000ull;
  std::vector<pid_t> all = run.consumers;
  all.insert(all.end(), run.extra_readers.begin(), run.extra_readers.end());
  for (const pid_t p : all) {
    const uint64_t now = monotonicNs();
    const int left = now < deadline ? static_cast<int>((deadline - now) / 1000000) : 0;
    if (waitChild(p, left) < 0) stopChild(p, 2000);
  }
}

// Forks a consumer per stream and waits until each has attached; false, with `error` set and the
// consumers stopped, when one did not.
bool startConsumers(StreamsRun& run, std::string& error) {
  const std::string& socket = run.c.local ? run.sock_a : run.sock_b;
  const std::string& others = run.c.others_on_c ? run.sock_c : socket;
  const uint32_t extra = run.c.readers > 1 ? run.c.readers - 1 : 0;
  for (size_t i = 0; i < run.n; ++i) {
    run.consumers[i] = forkChild([&run, &socket, i] {
      return benchConsumer(*run.sh[i], i == 0 ? run.lat : nullptr, i == 0 ? run.lat_cap : 0, socket,
                           run.streams[i], run.c);
    });
    for (uint32_t k = 0; k < extra; ++k) {
      run.extra_readers[i * extra + k] =
          forkChild([&run, &others, i] { return extraReader(*run.sh[i], others, run.streams[i], run.c); });
    }
  }
  const uint64_t attach_deadline = monotonicNs() + 10'000'000'000ull;
  for (size_t i = 0; i < run.n; ++i) {
    while (run.sh[i]->extra_attached.load() < extra && monotonicNs() < attach_deadline &&
           run.sh[i]->consumer_error.get().empty()) {
      usleep(1000);
    }
    if (run.sh[i]->extra_attached.load() < extra) {
      error =
          run.label(i) + (run.sh[i]->consumer_error.get().empty() ? std::string("a subscriber did not attach")
                                                                  : run.sh[i]->consumer_error.get());
      stopConsumers(run, 2000);
      return false;
    }
    if (waitForAttach(run.sh[i]->consumer_state, attach_deadline)) continue;
    error = run.label(i) + "consumer: " +
            (run.sh[i]->consumer_error.get().empty() ? std::string("did not attach within 10 s")
                                                     : run.sh[i]->consumer_error.get());
    stopConsumers(run, 2000);
    return false;
  }
  return true;
}

// Forks a producer per stream; each verifies its first frames, then waits for the go.
void startProducers(StreamsRun& run) {
  for (size_t i = 0; i < run.n; ++i) {
    run.producers[i] = forkChild(
        [&run, i] { return benchProducer(*run.ctl, *run.sh[i], run.sock_a, run.streams[i], run.c); });
  }
}

// True when every producer still running has reached `min_phase` (CaseShared::producer_phase).
bool everyProducerAt(const StreamsRun& run, int min_phase) {
  for (size_t i = 0; i < run.n; ++i) {
    if (run.producer_rc[i] < 0 && run.sh[i]->producer_phase.load() < min_phase) return false;
  }
  return true;
}

// Reaps the producers that exited; returns how many still run.
size_t reapProducers(StreamsRun& run) {
  size_t running = 0;
  for (size_t i = 0; i < run.n; ++i) {
    if (run.producer_rc[i] < 0) run.producer_rc[i] = waitChild(run.producers[i], 0);
    if (run.producer_rc[i] < 0) ++running;
  }
  return running;
}

// Samples the daemons and gives the go once every producer is ready; samples them again once
// every producer is done.
void sampleTimedPart(StreamsRun& run) {
  if (run.w0 == 0 && everyProducerAt(run, 2)) {
    run.at_w0 = daemonUsage(run.pair);
    run.w0 = monotonicNs();
    run.ctl->go_ns.store(run.w0);
  }
  if (run.w0 != 0 && run.w1 == 0 && everyProducerAt(run, 4)) {
    run.w1 = monotonicNs();
    run.at_w1 = daemonUsage(run.pair);
  }
}

// Tells every producer and consumer to stop early.
void abortPairs(StreamsRun& run) {
  for (auto* s : run.sh) s->abort.store(true);
}

// Watches the producers until every one has exited, timing the part they run together; passes
// Ctrl-C on, and when a daemon dies, says so in `error` and stops everything.
void superviseProducers(StreamsRun& run, std::string& error) {
  while (true) {
    const size_t running = reapProducers(run);
    sampleTimedPart(run);
    if (running == 0) break;
    if (g_interrupted.load()) abortPairs(run);
    const std::string dead = run.pair.checkAlive();
    if (!dead.empty()) {
      error = dead;
      abortPairs(run);
      for (size_t i = 0; i < run.n; ++i) {
        if (run.producer_rc[i] < 0) {
          stopChild(run.producers[i], 2000);
          run.producer_rc[i] = 1;
        }
      }
      break;
    }
    // Poll quickly until the timed part starts (every producer waits for it), lightly after.
    usleep(run.w0 == 0 ? 1000 : 20000);
  }
}

// Bytes and frames of every pair together over the earliest first submit .. the latest last
// completion, and each pair's own GB/s.
void gatherThroughput(const StreamsRun& run, PairsResult& res) {
  CaseResult& r = res.total;
  uint64_t bytes = 0, first = 0, last = 0;
  for (size_t i = 0; i < run.n; ++i) {
    const CaseShared& s = *run.sh[i];
    r.verified += s.verified.load();
    r.verify_bad += s.verify_bad.load();
    r.delivered += s.delivered.load();
    r.failed += s.failed.load();
    bytes += s.delivered_bytes.load();
    const uint64_t f = s.first_submit_ns.load();
    const uint64_t l = s.last_completion_ns.load();
    if (f != 0 && (first == 0 || f < first)) first = f;
    last = std::max(last, l);
    res.pair_gbps.push_back(l > f && f != 0 ? s.delivered_bytes.load() / ((l - f) / 1e9) / 1e9 : 0);
  }
  r.seconds = last > first && first != 0 ? (last - first) / 1e9 : 0;
  if (r.seconds > 0) {
    r.gbps = bytes / r.seconds / 1e9;
    r.fps = r.delivered / r.seconds;
  }
}

// The daemons' CPU over the timed part: share of a core, and CPU time and sleeps per frame.
void gatherDaemonCost(const StreamsRun& run, CaseResult& r) {
  const DaemonUsage& u0 = run.at_w0;
  const DaemonUsage& u1 = run.at_w1;
  if (run.w0 != 0 && run.w1 > run.w0 && u0.cpu_a.total() >= 0 && u1.cpu_a.total() >= 0 &&
      u0.cpu_b.total() >= 0 && u1.cpu_b.total() >= 0) {
    const double wall = (run.w1 - run.w0) / 1e9;
    r.cpu_a = (u1.cpu_a.total() - u0.cpu_a.total()) / wall * 100;
    r.cpu_b = (u1.cpu_b.total() - u0.cpu_b.total()) / wall * 100;
    if (r.delivered > 0) {
      const double per_frame = 1e6 / static_cast<double>(r.delivered);
      r.cpu_us_per_frame_a = (u1.cpu_a.total() - u0.cpu_a.total()) * per_frame;
      r.cpu_us_per_frame_b = (u1.cpu_b.total() - u0.cpu_b.total()) * per_frame;
      r.user_us_per_frame_a = (u1.cpu_a.user - u0.cpu_a.user) * per_frame;
      r.user_us_per_frame_b = (u1.cpu_b.user - u0.cpu_b.user) * per_frame;
    }
  }
  if (run.w0 != 0 && run.w1 > run.w0 && r.delivered > 0 && u0.sleeps_a >= 0 && u1.sleeps_a >= 0 &&
      u0.sleeps_b >= 0 && u1.sleeps_b >= 0) {
    r.sleeps_per_frame_a = static_cast<double>(u1.sleeps_a - u0.sleeps_a) / static_cast<double>(r.delivered);
    r.sleeps_per_frame_b = static_cast<double>(u1.sleeps_b - u0.sleeps_b) / static_cast<double>(r.delivered);
  }
}

// Pair 0's submit -> receive times (latency case), as percentiles.
void gatherLatency(const StreamsRun& run, CaseResult& r) {
  std::vector<double> v;
  const uint64_t got =
      std::min<uint64_t>(run.sh[0]->latency_count.load(std::memory_order_acquire), run.lat_cap);
  for (uint64_t i = 0; i < got; ++i) v.push_back(run.lat[i] / 1e3);
  r.samples = got;
  r.p50_us = percentile(v, 50);
  r.p99_us = percentile(v, 99);
}

// What went wrong in the pairs: the first three in full, then how many more.
void gatherPairErrors(const StreamsRun& run, CaseResult& r) {
  size_t failed_pairs = 0;
  for (size_t i = 0; i < run.n; ++i) {
    const std::string e =
        pairError(*run.sh[i], run.producer_rc[i], run.c.readers > 1 ? run.c.readers - 1 : 0);
    if (e.empty()) continue;
    if (++failed_pairs <= 3) r.error += (r.error.empty() ? "" : "; ") + run.label(i) + e;
  }
  if (failed_pairs > 3) r.error += "; and " + std::to_string(failed_pairs - 3) + " more pairs failed";
}

// The daemon publishes its transport counters every 0.5 s (the data agent's stats round, which
// runs at least every 50 ms): a snapshot taken this long after a frame was sent counts it.
constexpr uint64_t kCountersSettleNs = 600'000'000;

// What daemon `d`'s transports sent so far (payload bytes), read from its metrics (the attach
// socket's snapshot: the counters /metrics shows) once they count every frame sent before this
// call; "" or what went wrong.
std::string linkBytesSent(const DaemonProcess& d, uint64_t& bytes) {
  sleepNs(kCountersSettleNs);
  const AdminReply reply = fetchSnapshot(d.socket);
  if (reply.status != FL_OK) return "metrics of " + d.id + ": " + reply.message();
  const Json::json_pointer counter("/metrics/counters/transport_bytes_sent");
  if (!reply.snapshot.contains(counter) || !reply.snapshot.at(counter).is_number_unsigned()) {
    return "metrics of " + d.id + " have no " + counter.to_string();
  }
  bytes = reply.snapshot.at(counter).get<uint64_t>();
  return {};
}

// Bytes A's transports sent over the case per frame its producers sent (verification frames and
// timed ones alike: both cross the link).
void gatherLinkBytes(const StreamsRun& run, uint64_t before, CaseResult& r) {
  uint64_t after = 0;
  const std::string err = linkBytesSent(run.pair.a(), after);
  if (!err.empty()) {
    r.error += (r.error.empty() ? "" : "; ") + err;
    return;
  }
  const uint64_t produced = run.n * kVerifyFrames + r.delivered + r.failed;
  if (produced > 0 && after >= before) {
    r.link_bytes_per_frame = static_cast<double>(after - before) / static_cast<double>(produced);
  }
}

// Consumers first (attached before any frame is sent), then producers; the timed part, then the
// figures of all pairs together.
PairsResult runStreams(DaemonPair& pair, const std::vector<std::string>& streams, const CaseConfig& c) {
  PairsResult res;
  uint64_t link_before = 0;
  if (c.count_link) res.total.error = linkBytesSent(pair.a(), link_before);
  if (!res.total.error.empty()) return res;
  StreamsRun run(pair, streams, c);
  if (!startConsumers(run, res.total.error)) return res;
  startProducers(run);
  superviseProducers(run, res.total.error);
  stopConsumers(run, 10000);
  gatherThroughput(run, res);
  gatherDaemonCost(run, res.total);
  if (c.latency) gatherLatency(run, res.total);
  if (res.total.error.empty()) gatherPairErrors(run, res.total);
  if (c.count_link) gatherLinkBytes(run, link_before, res.total);
  return res;
}

}  // namespace

CaseResult runCase(DaemonPair& pair, const std::string& stream, const CaseConfig& c) {
  return runStreams(pair, {stream}, c).total;
}

PairsResult runPairs(DaemonPair& pair, const std::string& stream_prefix, const CaseConfig& c,
                     uint32_t pairs) {
  std::vector<std::string> streams;
  for (uint32_t i = 0; i < pairs; ++i) streams.push_back(stream_prefix + std::to_string(i));
  return runStreams(pair, streams, c);
}

IdleCpu measureIdle(DaemonPair& pair, double seconds) {
  IdleCpu r;
  const double a0 = processCpu(pair.a().pid).total();
  const double b0 = processCpu(pair.b().pid).total();
  const uint64_t t0 = monotonicNs();
  sleepNs(static_cast<uint64_t>(seconds * 1e9));
  const double wall = (monotonicNs() - t0) / 1e9;
  const double a1 = processCpu(pair.a().pid).total();
  const double b1 = processCpu(pair.b().pid).total();
  if (a0 >= 0 && a1 >= 0) r.a = (a1 - a0) / wall * 100;
  if (b0 >= 0 && b1 >= 0) r.b = (b1 - b0) / wall * 100;
  return r;
}

}  // namespace framelink::cli
