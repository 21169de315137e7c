#include "metrics/metrics.h"

#include <spdlog/spdlog.h>

#include <sstream>
#include <utility>

#include "framelink/framelink.h"

#ifdef FRAMELINK_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace framelink {

struct Metrics::Server {
#ifdef FRAMELINK_HAVE_HTTPLIB
  httplib::Server http;
#endif
};

Metrics::Metrics() = default;
Metrics::~Metrics() { stop(); }

void Metrics::recordDeliveryLatency(uint64_t micros) noexcept {
  size_t bucket = 0;
  while (bucket + 1 < kLatencyBuckets && (uint64_t{1} << bucket) < micros) ++bucket;
  latency_[bucket].fetch_add(1, std::memory_order_relaxed);
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
    case AttachReject::kCount:
      break;
  }
  return "?";
}

void Metrics::setDetail(std::string json) {
  MutexLock lock(detail_mutex_);
  detail_ = std::move(json);
}

void Metrics::setGauges(Gauges gauges) {
  MutexLock lock(detail_mutex_);
  gauges_ = std::move(gauges);
}

void Metrics::setTransportCounters(const transport::TransportCounters& totals) {
  MutexLock lock(detail_mutex_);
  transport_ = totals;
}

namespace {

// The transport counters, exported as framelink_transport_<name>_total and
// in the JSON's "counters" as transport_<name>.
struct TransportCounterInfo {
  const char* name;
  const char* help;
  uint64_t transport::TransportCounters::*value;
};
constexpr TransportCounterInfo kTransportCounters[] = {
    {"frames_sent", "Frames the links' transports sent (their send completed FL_OK).",
     &transport::TransportCounters::frames_sent},
    {"bytes_sent", "Payload bytes of the frames the links' transports sent.",
     &transport::TransportCounters::bytes_sent},
    {"frames_received", "Frames that landed in a credited buffer of this daemon.",
     &transport::TransportCounters::frames_received},
    {"bytes_received", "Payload bytes of the frames that landed in a credited buffer.",
     &transport::TransportCounters::bytes_received},
    {"unknown_credit_frames", "Frames that arrived for an unknown or retracted credit.",
     &transport::TransportCounters::unknown_credit_frames},
    {"backpressure",
     "Frames and control records a transport turned away for a full queue (posted again later).",
     &transport::TransportCounters::backpressure},
    {"control_sent", "Control records the links' transports sent.",
     &transport::TransportCounters::control_sent},
    {"control_received", "Control records the links' transports received.",
     &transport::TransportCounters::control_received},
};

// A label value as the text format wants it: backslash, quote and newline
// escaped (peer names on the listening side come from the peer's Hello).
std::string labelValue(const std::string& in) {
  std::string out;
  for (char ch : in) {
    if (ch == '\\' || ch == '"') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

}  // namespace

std::string Metrics::prometheus() const {
  std::ostringstream out;
  auto counterValue = [&](const std::string& name, const char* help, uint64_t v) {
    out << "# HELP framelink_" << name << ' ' << help << "\n# TYPE framelink_" << name
        << " counter\nframelink_" << name << ' ' << v << '\n';
  };
  auto counter = [&](const char* name, const char* help, const std::atomic<uint64_t>& v) {
    counterValue(name, help, v.load(std::memory_order_relaxed));
  };
  counter("clients_attached_total", "Clients that attached.", counters.clients_attached);
  counter("clients_detached_total", "Clients that detached or died.", counters.clients_detached);
  counter("frames_submitted_total", "Frames producers submitted.", counters.frames_submitted);
  counter("frames_delivered_total", "Frames acknowledged by the remote consumer.", counters.frames_delivered);
  counter("frames_failed_total", "Frames that ended FAILED.", counters.frames_failed);
  counter("bytes_sent_total", "Payload bytes of delivered frames.", counters.bytes_sent);
  counter("frames_received_total", "Frames delivered to local consumers.", counters.frames_received);
  counter("bytes_received_total", "Payload bytes delivered to local consumers.", counters.bytes_received);
  counter("frames_released_total", "Frames local consumers released.", counters.frames_released);
  counter("bad_descriptors_total", "Ring entries or slot headers rejected.", counters.bad_descriptors);
  counter("credits_granted_total", "Receive slots granted to peers.", counters.credits_granted);
  counter("credits_granted_whole_total",
          "Of those, granted as a whole credit rather than a slot credit of an announced region.",
          counters.credits_granted_whole);
  counter("credits_recalled_total",
          "Credits recalled from a peer to share a stream's slots with its other senders.",
          counters.credits_recalled);
  counter("control_records_sent_total",
          "Control records (credit grants, ACKs, NACKs of one round) sent on data transports.",
          counters.control_records_sent);
  counter("control_records_received_total", "Control records received on data transports.",
          counters.control_records_received);
  counter("nacks_sent_total", "Frames this daemon refused.", counters.nacks_sent);
  counter("link_failures_total", "Peer sessions that ended.", counters.link_failures);
  counter("auth_failures_total", "Peers refused for a wrong token or version.", counters.auth_failures);
  counter("frames_replayed_total", "Unacknowledged frames sent again after a link broke.",
          counters.frames_replayed);
  counter(
      "frames_maybe_redelivered_total",
      "Frames sent again to a restarted receiving daemon, flagged to the consumer as possible redeliveries.",
      counters.frames_maybe_redelivered);
  counter("duplicates_dropped_total", "Replayed frames this daemon already had (not delivered again).",
          counters.duplicates_dropped);
  counter("acks_for_replays_total",
          "Frames waiting to be replayed that their receiver's repeated ACK settled (released before the "
          "link broke).",
          counters.acks_for_replays);
  counter("streams_forgotten_total", "Out-streams closed on the link when their last producer left.",
          counters.streams_forgotten);
  counter("frames_resent_crc_total", "Frames sent again after the peer found their CRC32C wrong.",
          counters.frames_resent_crc);
  counter("frames_resent_credit_total",
          "Frames sent again after they reached a receive slot withdrawn meanwhile (its consumer left).",
          counters.frames_resent_credit);
  out << "# HELP framelink_links_up Peer links currently up.\n# TYPE framelink_links_up "
         "gauge\nframelink_links_up "
      << counters.links_up.load(std::memory_order_relaxed) << '\n';
  auto byTransport = [&](const char* name, const char* help, const std::atomic<uint64_t>& tcp,
                         const std::atomic<uint64_t>& rdma) {
    out << "# HELP framelink_" << name << ' ' << help << "\n# TYPE framelink_" << name << " counter\n"
        << "framelink_" << name << "{transport=\"tcp\"} " << tcp.load(std::memory_order_relaxed) << '\n'
        << "framelink_" << name << "{transport=\"rdma\"} " << rdma.load(std::memory_order_relaxed) << '\n';
  };
  byTransport("handshakes_timed_out_total",
              "Data-channel handshakes (tcp, rdma listeners) that did not finish before their deadline.",
              counters.handshakes_timed_out_tcp, counters.handshakes_timed_out_rdma);
  byTransport("handshakes_refused_total",
              "Data-channel connections refused: too many handshakes at once (in all, or from one address).",
              counters.handshakes_refused_tcp, counters.handshakes_refused_rdma);
  counter("admin_requests_total", "Admin requests answered (framelink stats, clients, links).",
          counters.admin_requests);
  counter("admin_refused_total",
          "Admin requests refused: not root, the daemon's user or group, or the admin group; or malformed.",
          counters.admin_refused);
  out << "# HELP framelink_attach_rejected_total Attach connections turned away, by reason.\n"
         "# TYPE framelink_attach_rejected_total counter\n";
  for (size_t i = 0; i < attach_rejected_.size(); ++i) {
    out << "framelink_attach_rejected_total{reason=\"" << attachRejectName(static_cast<AttachReject>(i))
        << "\"} " << attach_rejected_[i].load(std::memory_order_relaxed) << '\n';
  }
  out << "# HELP framelink_frames_failed_by_status Failed frames by fl_status.\n"
         "# TYPE framelink_frames_failed_by_status counter\n";
  for (size_t i = 0; i < failures_by_status_.size(); ++i) {
    uint64_t v = failures_by_status_[i].load(std::memory_order_relaxed);
    if (v != 0) out << "framelink_frames_failed_by_status{status=\"" << i << "\"} " << v << '\n';
  }
  {
    MutexLock lock(detail_mutex_);
    for (const auto& c : kTransportCounters) {
      counterValue(std::string("transport_") + c.name + "_total", c.help, transport_.*c.value);
    }
    out << "# HELP framelink_frames_in_flight Producers' frames submitted and not yet DELIVERED or FAILED.\n"
           "# TYPE framelink_frames_in_flight gauge\nframelink_frames_in_flight "
        << gauges_.frames_in_flight << '\n';
    out << "# HELP framelink_frames_held Frames delivered to local consumers and not yet released.\n"
           "# TYPE framelink_frames_held gauge\nframelink_frames_held "
        << gauges_.frames_held << '\n';
    out << "# HELP framelink_link_up Peer links by peer and transport: 1 up; 0 a configured peer with no "
           "link.\n# TYPE framelink_link_up gauge\n";
    for (const auto& l : gauges_.links) {
      out << "framelink_link_up{peer=\"" << labelValue(l.peer) << "\",transport=\""
          << (l.transport.empty() ? "none" : labelValue(l.transport)) << "\"} "
          << (l.transport.empty() ? 0 : 1) << '\n';
    }
    out << "# HELP framelink_link_rtt_seconds Round trip of the link's last echoed keepalive.\n"
           "# TYPE framelink_link_rtt_seconds gauge\n";
    for (const auto& l : gauges_.links) {
      if (l.rtt_ns != 0) {
        out << "framelink_link_rtt_seconds{peer=\"" << labelValue(l.peer) << "\"} " << l.rtt_ns / 1e9 << '\n';
      }
    }
    out << "# HELP framelink_link_frames_in_flight Frames posted or sent on the link, not yet acknowledged.\n"
           "# TYPE framelink_link_frames_in_flight gauge\n";
    for (const auto& l : gauges_.links) {
      if (!l.transport.empty()) {
        out << "framelink_link_frames_in_flight{peer=\"" << labelValue(l.peer) << "\"} " << l.in_flight
            << '\n';
      }
    }
    out << "# HELP framelink_link_frames_replayed_total Frames sent again after a link to this peer broke.\n"
           "# TYPE framelink_link_frames_replayed_total counter\n";
    for (const auto& l : gauges_.links) {
      out << "framelink_link_frames_replayed_total{peer=\"" << labelValue(l.peer) << "\"} " << l.replayed
          << '\n';
    }
  }
  out << "# HELP framelink_delivery_latency_us Submit to ACK latency.\n"
         "# TYPE framelink_delivery_latency_us histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kLatencyBuckets; ++i) {
    cumulative += latency_[i].load(std::memory_order_relaxed);
    out << "framelink_delivery_latency_us_bucket{le=\"" << (uint64_t{1} << i) << "\"} " << cumulative << '\n';
  }
  out << "framelink_delivery_latency_us_bucket{le=\"+Inf\"} " << cumulative << '\n';
  out << "framelink_delivery_latency_us_count " << cumulative << '\n';
  return out.str();
}

std::string Metrics::json() const {
  transport::TransportCounters transport;
  {
    MutexLock lock(detail_mutex_);
    transport = transport_;
  }
  std::ostringstream out;
  out << "{\"frames_submitted\":" << counters.frames_submitted.load()
      << ",\"frames_delivered\":" << counters.frames_delivered.load()
      << ",\"frames_failed\":" << counters.frames_failed.load()
      << ",\"frames_received\":" << counters.frames_received.load()
      << ",\"frames_released\":" << counters.frames_released.load()
      << ",\"bytes_sent\":" << counters.bytes_sent.load()
      << ",\"bytes_received\":" << counters.bytes_received.load()
      << ",\"links_up\":" << counters.links_up.load() << ",\"attach_rejected\":{";
  for (size_t i = 0; i < attach_rejected_.size(); ++i) {
    out << (i == 0 ? "" : ",") << '"' << attachRejectName(static_cast<AttachReject>(i))
        << "\":" << attach_rejected_[i].load(std::memory_order_relaxed);
  }
  out << "},\"handshakes_timed_out\":{\"tcp\":" << counters.handshakes_timed_out_tcp.load()
      << ",\"rdma\":" << counters.handshakes_timed_out_rdma.load() << '}'
      << ",\"streams_forgotten\":" << counters.streams_forgotten.load() << ",\"counters\":{";
  // Every counter, by its Prometheus name without framelink_ and _total.
  const std::pair<const char*, const std::atomic<uint64_t>*> all[] = {
      {"clients_attached", &counters.clients_attached},
      {"clients_detached", &counters.clients_detached},
      {"frames_submitted", &counters.frames_submitted},
      {"frames_delivered", &counters.frames_delivered},
      {"frames_failed", &counters.frames_failed},
      {"bytes_sent", &counters.bytes_sent},
      {"frames_received", &counters.frames_received},
      {"bytes_received", &counters.bytes_received},
      {"frames_released", &counters.frames_released},
      {"bad_descriptors", &counters.bad_descriptors},
      {"credits_granted", &counters.credits_granted},
      {"credits_granted_whole", &counters.credits_granted_whole},
      {"credits_recalled", &counters.credits_recalled},
      {"control_records_sent", &counters.control_records_sent},
      {"control_records_received", &counters.control_records_received},
      {"nacks_sent", &counters.nacks_sent},
      {"links_up", &counters.links_up},
      {"link_failures", &counters.link_failures},
      {"auth_failures", &counters.auth_failures},
      {"frames_replayed", &counters.frames_replayed},
      {"frames_maybe_redelivered", &counters.frames_maybe_redelivered},
      {"duplicates_dropped", &counters.duplicates_dropped},
      {"frames_resent_crc", &counters.frames_resent_crc},
      {"frames_resent_credit", &counters.frames_resent_credit},
      {"handshakes_timed_out_tcp", &counters.handshakes_timed_out_tcp},
      {"handshakes_timed_out_rdma", &counters.handshakes_timed_out_rdma},
      {"handshakes_refused_tcp", &counters.handshakes_refused_tcp},
      {"handshakes_refused_rdma", &counters.handshakes_refused_rdma},
      {"acks_for_replays", &counters.acks_for_replays},
      {"streams_forgotten", &counters.streams_forgotten},
      {"admin_requests", &counters.admin_requests},
      {"admin_refused", &counters.admin_refused},
  };
  bool first = true;
  for (const auto& [name, value] : all) {
    out << (first ? "" : ",") << '"' << name << "\":" << value->load(std::memory_order_relaxed);
    first = false;
  }
  for (const auto& c : kTransportCounters) out << ",\"transport_" << c.name << "\":" << transport.*c.value;
  out << "},\"failed_by_status\":{";
  first = true;
  for (size_t i = 0; i < failures_by_status_.size(); ++i) {
    uint64_t v = failures_by_status_[i].load(std::memory_order_relaxed);
    if (v == 0) continue;
    out << (first ? "" : ",") << '"' << i << "\":" << v;
    first = false;
  }
  out << "},\"detail\":";
  MutexLock lock(detail_mutex_);
  out << detail_ << '}';
  return out.str();
}

Status Metrics::serve(const std::string& listen) {
#ifdef FRAMELINK_HAVE_HTTPLIB
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return makeError(FL_EINVAL, "metrics listen address '" + listen + "' must be HOST:PORT");
  }
  std::string host = listen.substr(0, colon);
  int port = std::stoi(listen.substr(colon + 1));
  server_ = std::make_unique<Server>();
  server_->http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus(), "text/plain; version=0.0.4");
  });
  server_->http.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json(), "application/json");
  });
  int bound =
      port == 0 ? server_->http.bind_to_any_port(host) : (server_->http.bind_to_port(host, port) ? port : -1);
  if (bound < 0) return makeError(FL_ERR_RESOURCES, "cannot listen for metrics on " + listen);
  port_ = static_cast<uint16_t>(bound);
  thread_ = std::thread([this] { server_->http.listen_after_bind(); });
  return {};
#else
  return makeError(FL_EINVAL, "metrics endpoint not built (cpp-httplib missing); remove --metrics " + listen);
#endif
}

void Metrics::stop() {
#ifdef FRAMELINK_HAVE_HTTPLIB
  if (server_) server_->http.stop();
#endif
  if (thread_.joinable()) thread_.join();
}

}  // namespace framelink
