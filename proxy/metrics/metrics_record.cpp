// What Metrics records for others to read: the latency and failure
// tallies, the agent's published state, the running configuration, health.
#include <chrono>

#include "metrics/metrics.h"

namespace framelink {

void Metrics::recordDeliveryLatency(uint64_t micros) noexcept {
  size_t bucket = 0;
  while (bucket + 1 < kLatencyBuckets && (uint64_t{1} << bucket) < micros) ++bucket;
  latency_[bucket].fetch_add(1, std::memory_order_relaxed);
  latency_sum_us_.fetch_add(micros, std::memory_order_relaxed);
}

void Metrics::recordFailure(int status) noexcept {
  if (status >= 0 && static_cast<size_t>(status) < failures_by_status_.size()) {
    failures_by_status_[static_cast<size_t>(status)].fetch_add(1, std::memory_order_relaxed);
  }
}

const char* Metrics::attachRejectName(AttachReject reason) noexcept {
  switch (reason) {
    case AttachReject::kHandshakeTimeout:
      return "handshake_timeout";
    case AttachReject::kTooManyPending:
      return "too_many_pending";
    case AttachReject::kFdLimit:
      return "fd_limit";
    case AttachReject::kInvalid:
      return "invalid";
    case AttachReject::kTooManyClients:
      return "too_many_clients";
    case AttachReject::kMemoryLimit:
      return "memory_limit";
    case AttachReject::kCount:
      break;
  }
  return "?";
}

namespace {

uint64_t steadyNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

void Metrics::setDetail(DetailRenderer render) {
  MutexLock lock(detail_mutex_);
  detail_ = std::move(render);
  detail_at_ns_ = steadyNs();
  published_.notify_all();
}

void Metrics::setPublishRequest(std::function<void()> ask) {
  MutexLock lock(detail_mutex_);
  ask_publish_ = std::move(ask);
}

void Metrics::setStreamsWatcher(std::function<void()> watcher) {
  MutexLock lock(detail_mutex_);
  streams_watcher_ = std::move(watcher);
}

void Metrics::setDetail(std::string json) {
  setDetail([json = std::move(json)] { return json; });
}

Metrics::Health Metrics::health() const {
  const uint64_t window_ns = health_window_ns_.load();
  uint64_t at = 0;
  std::function<void()> ask;
  {
    MutexLock lock(detail_mutex_);
    at = detail_at_ns_;
    if (at != 0 && steadyNs() - at > window_ns) ask = ask_publish_;
  }
  if (ask) {
    // Outside the lock: the agent publishes under it.
    ask();
    const uint64_t before = at;
    MutexLock lock(detail_mutex_);
    lock.waitFor(published_, std::chrono::seconds(1),
                 [&]() FL_REQUIRES(detail_mutex_) { return detail_at_ns_ != before; });
    at = detail_at_ns_;
  }
  if (at == 0) return {false, "starting: the data agent has not published its state yet\n"};
  const uint64_t age_ms = (steadyNs() - at) / 1'000'000;
  const uint64_t window_ms = window_ns / 1'000'000;
  if (age_ms > window_ms) {
    return {false, "unhealthy: the data agent last published its state " + std::to_string(age_ms) +
                       " ms ago and did not when asked (it does every " +
                       std::to_string(kPublishPeriodNs / 1'000'000) +
                       " ms while anything changes; more than " + std::to_string(window_ms) +
                       " ms and no answer means its loop is stuck)\n"};
  }
  return {true, "ok: the data agent published its state " + std::to_string(age_ms) + " ms ago\n"};
}

void Metrics::setGauges(Gauges gauges) {
  MutexLock lock(detail_mutex_);
  const bool streams_changed = !(gauges.streams == gauges_.streams);
  gauges_ = std::move(gauges);
  if (streams_changed && streams_watcher_) streams_watcher_();
}

Metrics::StreamsHere Metrics::streamsHere() const {
  MutexLock lock(detail_mutex_);
  return gauges_.streams;
}

void Metrics::setTransportCounters(const transport::TransportCounters& totals) {
  MutexLock lock(detail_mutex_);
  transport_ = totals;
}

void Metrics::setConfigInfo(ConfigInfo info) {
  MutexLock lock(detail_mutex_);
  config_ = std::move(info);
}

Metrics::ConfigInfo Metrics::configInfo() const {
  MutexLock lock(detail_mutex_);
  return config_;
}

}  // namespace framelink
