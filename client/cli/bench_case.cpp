#include "bench_case.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "child_process.h"
#include "cli_util.h"
#include "consumer.h"
#include "frame_pattern.h"
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
  SharedText<768> consumer_error;
  SharedText<768> producer_error;
  SharedText<512> first_bad;
};
static_assert(sizeof(CaseControl) % alignof(CaseShared) == 0 && sizeof(CaseShared) % alignof(uint64_t) == 0,
              "the pairs and the latency samples follow CaseControl in one mapping");

uint64_t pageRound(uint64_t v) { return (v + 4095) / 4096 * 4096; }

int benchConsumer(CaseShared& sh, uint64_t* lat, uint64_t lat_cap, const std::string& socket,
                  const std::string& stream, const CaseConfig& c) {
  ConsumerOptions co;
  co.socket_path = socket;
  co.stream = stream;
  co.slot_count = c.slots;
  co.slot_size = pageRound(c.size);
  std::string err;
  auto consumer = Consumer::attach(co, err);
  if (!consumer) {
    sh.consumer_error.set(err);
    sh.consumer_state.store(2);
    return 1;
  }
  sh.consumer_state.store(1);
  CheckOptions checks;
  checks.verify = true;
  checks.expect_order = true;
  checks.sizes.emplace(c.size);
  FrameChecker checker(std::move(checks));
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

int benchProducer(const CaseControl& ctl, CaseShared& sh, const std::string& socket,
                  const std::string& stream, const CaseConfig& c) {
  ProducerOptions po;
  po.socket_path = socket;
  po.stream = stream;
  po.slot_count = c.slots;
  po.slot_size = pageRound(c.size);
  po.stall_timeout_ms = 60000;
  po.max_in_flight = c.max_in_flight;  // 1 for latency: submit, wait for DELIVERED, next
  std::string err;
  auto producer = Producer::attach(po, err);
  if (!producer) {
    sh.producer_error.set(err);
    return 1;
  }
  auto recordFailure = [&](const fl_completion& comp) {
    if (comp.status != FL_OK) {
      int expected = 0;
      sh.first_failure.compare_exchange_strong(expected, comp.status);
    }
  };
  // Phase 1: a few frames with the full pattern, checked byte-for-byte by the consumer.
  sh.producer_phase.store(1);
  auto prepareFull = [&](uint64_t index, fl_slot& slot, FrameSpec& spec, std::string&) -> bool {
    spec.frame_id = index;
    spec.wafer_id = pattern::waferOf(index);
    spec.length = c.size;
    spec.attrs = pattern::makeAttrs(index);
    pattern::fillPattern(index, slot.data, c.size);
    return true;
  };
  ProducerStats v =
      producer->run([](uint64_t i) { return i < kVerifyFrames; }, prepareFull, recordFailure, &sh.abort);
  if (!v.allDelivered()) {
    sh.producer_error.set(v.error.empty() ? "the verification frames were not all delivered" : v.error);
    sh.failed.store(v.failed);
    return 1;
  }
  // Phase 2: slots already hold a pattern; only metadata changes per frame.
  if (!producer->prefillAllSlots([&](fl_slot& s) { pattern::fillPattern(s.index, s.data, c.size); }, err)) {
    sh.producer_error.set(err);
    return 1;
  }
  // Every pair starts (and, when timed, stops) at the same moment, so that N pairs share the
  // daemons for the whole measured interval.
  sh.producer_phase.store(2);
  while (ctl.go_ns.load() == 0) {
    if (sh.abort.load()) return 1;
    usleep(500);
  }
  const uint64_t deadline_ns = c.seconds > 0 ? ctl.go_ns.load() + static_cast<uint64_t>(c.seconds * 1e9) : 0;
  auto more = [&](uint64_t i) {
    if (c.seconds > 0) return monotonicNs() < deadline_ns;
    return i < c.count;
  };
  auto prepareMeta = [&](uint64_t index, fl_slot&, FrameSpec& spec, std::string&) -> bool {
    const uint64_t id = kVerifyFrames + index;
    spec.frame_id = id;
    spec.wafer_id = pattern::waferOf(id);
    spec.length = c.size;
    spec.attrs = pattern::makeAttrs(id);
    return true;
  };
  sh.producer_phase.store(3);
  ProducerStats st = producer->run(more, prepareMeta, recordFailure, &sh.abort);
  sh.producer_phase.store(4);
  sh.delivered.store(st.delivered);
  sh.delivered_bytes.store(st.bytes_delivered);
  sh.failed.store(st.failed);
  sh.first_submit_ns.store(st.first_submit_ns);
  sh.last_completion_ns.store(st.last_completion_ns);
  if (!st.error.empty()) sh.producer_error.set(st.error);
  return st.allDelivered() ? 0 : 1;
}

}  // namespace

uint32_t slotsFor(uint64_t size) {
  // Keep ~32 MiB in flight so small frames are not limited by one ack round trip per slot.
  const uint64_t want = (32ull << 20) / std::max<uint64_t>(size, 1);
  return static_cast<uint32_t>(std::clamp<uint64_t>(want, 8, 64));
}

namespace {

// What went wrong in one pair, or "".
std::string pairError(const CaseShared& sh, int producer_rc) {
  std::string e;
  if (!sh.producer_error.get().empty()) e += "producer: " + sh.producer_error.get();
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

PairsResult runStreams(DaemonPair& pair, const std::vector<std::string>& streams, const CaseConfig& c) {
  PairsResult res;
  CaseResult& r = res.total;
  const size_t n = streams.size();
  const uint64_t lat_cap = c.latency ? c.count : 0;
  SharedRegion<CaseControl> ctl(n * sizeof(CaseShared) + lat_cap * sizeof(uint64_t));
  auto* base = static_cast<char*>(ctl.extra());
  std::vector<CaseShared*> sh(n);
  for (size_t i = 0; i < n; ++i) sh[i] = new (base + i * sizeof(CaseShared)) CaseShared();
  auto* lat = reinterpret_cast<uint64_t*>(base + n * sizeof(CaseShared));
  const std::string sock_a = pair.a().socket;
  const std::string sock_b = pair.b().socket;
  auto label = [&](size_t i) { return n == 1 ? std::string() : streams[i] + ": "; };

  std::vector<pid_t> consumers(n, -1);
  auto stopConsumers = [&](int wait_ms) {
    for (auto* s : sh) s->stop_consumer.store(true);
    const uint64_t deadline = monotonicNs() + static_cast<uint64_t>(wait_ms) * 1000000ull;
    for (const pid_t p : consumers) {
      const uint64_t now = monotonicNs();
      const int left = now < deadline ? static_cast<int>((deadline - now) / 1000000) : 0;
      if (waitChild(p, left) < 0) stopChild(p, 2000);
    }
  };
  for (size_t i = 0; i < n; ++i) {
    consumers[i] = forkChild([&, i] {
      return benchConsumer(*sh[i], i == 0 ? lat : nullptr, i == 0 ? lat_cap : 0, sock_b, streams[i], c);
    });
  }
  const uint64_t attach_deadline = monotonicNs() + 10'000'000'000ull;
  for (size_t i = 0; i < n; ++i) {
    while (sh[i]->consumer_state.load() == 0 && monotonicNs() < attach_deadline && !g_interrupted.load()) {
      usleep(2000);
    }
    if (sh[i]->consumer_state.load() != 1) {
      r.error = label(i) + "consumer: " +
                (sh[i]->consumer_error.get().empty() ? std::string("did not attach within 10 s")
                                                     : sh[i]->consumer_error.get());
      stopConsumers(2000);
      return res;
    }
  }
  std::vector<pid_t> producers(n, -1);
  for (size_t i = 0; i < n; ++i) {
    producers[i] = forkChild([&, i] { return benchProducer(*ctl, *sh[i], sock_a, streams[i], c); });
  }

  double cpu_a0 = -1, cpu_b0 = -1, cpu_a1 = -1, cpu_b1 = -1;
  long long sleeps_a0 = -1, sleeps_b0 = -1, sleeps_a1 = -1, sleeps_b1 = -1;
  uint64_t w0 = 0, w1 = 0;
  std::vector<int> producer_rc(n, -1);
  auto every = [&](int min_phase) {
    for (size_t i = 0; i < n; ++i) {
      if (producer_rc[i] < 0 && sh[i]->producer_phase.load() < min_phase) return false;
    }
    return true;
  };
  while (true) {
    size_t running = 0;
    for (size_t i = 0; i < n; ++i) {
      if (producer_rc[i] < 0) producer_rc[i] = waitChild(producers[i], 0);
      if (producer_rc[i] < 0) ++running;
    }
    if (w0 == 0 && every(2)) {
      cpu_a0 = processCpuSeconds(pair.a().pid);
      cpu_b0 = processCpuSeconds(pair.b().pid);
      sleeps_a0 = processSleeps(pair.a().pid);
      sleeps_b0 = processSleeps(pair.b().pid);
      w0 = monotonicNs();
      ctl->go_ns.store(w0);
    }
    if (w0 != 0 && w1 == 0 && every(4)) {
      w1 = monotonicNs();
      cpu_a1 = processCpuSeconds(pair.a().pid);
      cpu_b1 = processCpuSeconds(pair.b().pid);
      sleeps_a1 = processSleeps(pair.a().pid);
      sleeps_b1 = processSleeps(pair.b().pid);
    }
    if (running == 0) break;
    if (g_interrupted.load()) {
      for (auto* s : sh) s->abort.store(true);
    }
    const std::string dead = pair.checkAlive();
    if (!dead.empty()) {
      r.error = dead;
      for (auto* s : sh) s->abort.store(true);
      for (size_t i = 0; i < n; ++i) {
        if (producer_rc[i] < 0) {
          stopChild(producers[i], 2000);
          producer_rc[i] = 1;
        }
      }
      break;
    }
    // Poll quickly until the timed part starts (every producer waits for it), lightly after.
    usleep(w0 == 0 ? 1000 : 20000);
  }
  stopConsumers(10000);

  uint64_t bytes = 0, first = 0, last = 0;
  for (size_t i = 0; i < n; ++i) {
    const CaseShared& s = *sh[i];
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
  if (w0 != 0 && w1 > w0 && cpu_a0 >= 0 && cpu_a1 >= 0 && cpu_b0 >= 0 && cpu_b1 >= 0) {
    const double wall = (w1 - w0) / 1e9;
    r.cpu_a = (cpu_a1 - cpu_a0) / wall * 100;
    r.cpu_b = (cpu_b1 - cpu_b0) / wall * 100;
    if (r.delivered > 0) {
      r.cpu_us_per_frame_a = (cpu_a1 - cpu_a0) * 1e6 / static_cast<double>(r.delivered);
      r.cpu_us_per_frame_b = (cpu_b1 - cpu_b0) * 1e6 / static_cast<double>(r.delivered);
    }
  }
  if (w0 != 0 && w1 > w0 && r.delivered > 0 && sleeps_a0 >= 0 && sleeps_a1 >= 0 && sleeps_b0 >= 0 &&
      sleeps_b1 >= 0) {
    r.sleeps_per_frame_a = static_cast<double>(sleeps_a1 - sleeps_a0) / static_cast<double>(r.delivered);
    r.sleeps_per_frame_b = static_cast<double>(sleeps_b1 - sleeps_b0) / static_cast<double>(r.delivered);
  }
  if (c.latency) {
    std::vector<double> v;
    const uint64_t got = std::min<uint64_t>(sh[0]->latency_count.load(std::memory_order_acquire), lat_cap);
    for (uint64_t i = 0; i < got; ++i) v.push_back(lat[i] / 1e3);
    r.samples = got;
    r.p50_us = percentile(v, 50);
    r.p99_us = percentile(v, 99);
  }
  if (r.error.empty()) {
    size_t failed_pairs = 0;
    for (size_t i = 0; i < n; ++i) {
      const std::string e = pairError(*sh[i], producer_rc[i]);
      if (e.empty()) continue;
      if (++failed_pairs <= 3) r.error += (r.error.empty() ? "" : "; ") + label(i) + e;
    }
    if (failed_pairs > 3) r.error += "; and " + std::to_string(failed_pairs - 3) + " more pairs failed";
  }
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
  const double a0 = processCpuSeconds(pair.a().pid);
  const double b0 = processCpuSeconds(pair.b().pid);
  const uint64_t t0 = monotonicNs();
  sleepNs(static_cast<uint64_t>(seconds * 1e9));
  const double wall = (monotonicNs() - t0) / 1e9;
  const double a1 = processCpuSeconds(pair.a().pid);
  const double b1 = processCpuSeconds(pair.b().pid);
  if (a0 >= 0 && a1 >= 0) r.a = (a1 - a0) / wall * 100;
  if (b0 >= 0 && b1 >= 0) r.b = (b1 - b0) / wall * 100;
  return r;
}

}  // namespace framelink::cli
