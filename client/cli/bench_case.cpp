#include "bench_case.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
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

struct CaseShared {
  std::atomic<bool> stop_consumer{false};
  std::atomic<bool> abort{false};
  std::atomic<int> consumer_state{0};  // 0 starting, 1 attached, 2 failed
  std::atomic<int> producer_phase{0};  // 0 starting, 1 verifying, 2 timed, 3 done
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
  // followed by latency samples (ns)
};

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

int benchProducer(CaseShared& sh, const std::string& socket, const std::string& stream, const CaseConfig& c) {
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
  const uint64_t deadline_ns = c.seconds > 0 ? monotonicNs() + static_cast<uint64_t>(c.seconds * 1e9) : 0;
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
  sh.producer_phase.store(2);
  ProducerStats st = producer->run(more, prepareMeta, recordFailure, &sh.abort);
  sh.producer_phase.store(3);
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

CaseResult runCase(DaemonPair& pair, const std::string& stream, const CaseConfig& c) {
  CaseResult r;
  const uint64_t lat_cap = c.latency ? c.count : 0;
  SharedRegion<CaseShared> sh(lat_cap * sizeof(uint64_t));
  auto* lat = static_cast<uint64_t*>(sh.extra());
  const std::string sock_a = pair.a().socket;
  const std::string sock_b = pair.b().socket;
  const pid_t consumer = forkChild([&] { return benchConsumer(*sh, lat, lat_cap, sock_b, stream, c); });
  const uint64_t attach_deadline = monotonicNs() + 10'000'000'000ull;
  while (sh->consumer_state.load() == 0 && monotonicNs() < attach_deadline && !g_interrupted.load()) {
    usleep(2000);
  }
  if (sh->consumer_state.load() != 1) {
    r.error = "consumer: " + (sh->consumer_error.get().empty() ? std::string("did not attach within 10 s")
                                                               : sh->consumer_error.get());
    sh->stop_consumer.store(true);
    stopChild(consumer, 2000);
    return r;
  }
  const pid_t producer = forkChild([&] { return benchProducer(*sh, sock_a, stream, c); });

  double cpu_a0 = -1, cpu_b0 = -1, cpu_a1 = -1, cpu_b1 = -1;
  uint64_t w0 = 0, w1 = 0;
  int producer_rc = -1;
  while (producer_rc < 0) {
    producer_rc = waitChild(producer, 20);
    if (w0 == 0 && sh->producer_phase.load() >= 2) {
      w0 = monotonicNs();
      cpu_a0 = processCpuSeconds(pair.a().pid);
      cpu_b0 = processCpuSeconds(pair.b().pid);
    }
    if (w1 == 0 && sh->producer_phase.load() >= 3) {
      w1 = monotonicNs();
      cpu_a1 = processCpuSeconds(pair.a().pid);
      cpu_b1 = processCpuSeconds(pair.b().pid);
    }
    if (g_interrupted.load()) sh->abort.store(true);
    const std::string dead = pair.checkAlive();
    if (!dead.empty()) {
      r.error = dead;
      sh->abort.store(true);
      stopChild(producer, 2000);
      producer_rc = 1;
    }
  }
  sh->stop_consumer.store(true);
  if (waitChild(consumer, 10000) < 0) stopChild(consumer, 2000);

  r.verified = sh->verified.load();
  r.verify_bad = sh->verify_bad.load();
  r.delivered = sh->delivered.load();
  r.failed = sh->failed.load();
  const uint64_t first = sh->first_submit_ns.load();
  const uint64_t last = sh->last_completion_ns.load();
  r.seconds = last > first ? (last - first) / 1e9 : 0;
  if (r.seconds > 0) {
    r.gbps = sh->delivered_bytes.load() / r.seconds / 1e9;
    r.fps = r.delivered / r.seconds;
  }
  if (w0 != 0 && w1 > w0 && cpu_a0 >= 0 && cpu_a1 >= 0) {
    const double wall = (w1 - w0) / 1e9;
    r.cpu_a = (cpu_a1 - cpu_a0) / wall * 100;
    r.cpu_b = (cpu_b1 - cpu_b0) / wall * 100;
  }
  if (c.latency) {
    std::vector<double> v;
    const uint64_t n = std::min<uint64_t>(sh->latency_count.load(std::memory_order_acquire), lat_cap);
    for (uint64_t i = 0; i < n; ++i) v.push_back(lat[i] / 1e3);
    r.samples = n;
    r.p50_us = percentile(v, 50);
    r.p99_us = percentile(v, 99);
  }
  if (r.error.empty()) {
    std::string e;
    if (!sh->producer_error.get().empty()) e += "producer: " + sh->producer_error.get();
    if (const int s = sh->first_failure.load(); s != 0) {
      e += std::string(e.empty() ? "" : "; ") + fl_status_str(s);
    }
    if (!sh->consumer_error.get().empty()) {
      e += std::string(e.empty() ? "" : "; ") + "consumer: " + sh->consumer_error.get();
    }
    if (!sh->first_bad.get().empty()) {
      e += std::string(e.empty() ? "" : "; ") + "verify: " + sh->first_bad.get();
    }
    if (producer_rc != 0 && e.empty()) e = "producer exited with status " + std::to_string(producer_rc);
    r.error = e;
  }
  return r;
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
