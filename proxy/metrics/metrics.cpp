#include "metrics/metrics.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <span>
#include <string_view>
#include <utility>

#include "framelink/framelink.h"
#include "framelink/status_name.hpp"

namespace framelink {

namespace {

using Counter = std::atomic<uint64_t> Metrics::Counters::*;

// One of Counters: framelink_<name>_total in the text format (links_up, a
// gauge: framelink_links_up; frames_failed, by status: writeFailuresByStatus)
// and <name> in the JSON's "counters".
struct CounterInfo {
  const char* name;
  const char* help;
  Counter value;
};

// The text format and the JSON list the counters in different orders, both
// kept as dashboards and scripts know them: each group is a run the two
// share, and writeCounters and writeJsonCounters put the groups in order.
constexpr CounterInfo kFrameCounters[] = {
    {"clients_attached", "Clients that attached.", &Metrics::Counters::clients_attached},
    {"clients_detached", "Clients that detached or died.", &Metrics::Counters::clients_detached},
    {"frames_submitted", "Frames producers submitted.", &Metrics::Counters::frames_submitted},
    {"frames_delivered", "Frames acknowledged by the remote consumer.", &Metrics::Counters::frames_delivered},
    {"frames_failed", "Frames that ended FAILED.", &Metrics::Counters::frames_failed},
    {"bytes_sent", "Payload bytes of delivered frames.", &Metrics::Counters::bytes_sent},
    {"frames_received", "Frames delivered to local consumers.", &Metrics::Counters::frames_received},
    {"bytes_received", "Payload bytes delivered to local consumers.", &Metrics::Counters::bytes_received},
    {"frames_released", "Frames local consumers released.", &Metrics::Counters::frames_released},
    {"local_frames_lent", "Frames of local producers lent to local consumers (no copy).",
     &Metrics::Counters::local_frames_lent},
    {"local_frames_copied", "Frames of local producers copied into local consumers' slots.",
     &Metrics::Counters::local_frames_copied},
    {"frames_dropped_slow_reader",
     "Frames a subscriber of a drop stream was skipped for, too far behind with no free slot (it is told the "
     "gap).",
     &Metrics::Counters::frames_dropped_slow_reader},
    {"frames_subscribers_only",
     "Frames sent to a daemon for its subscribers only: a member of the stream's queue group on another "
     "daemon got them.",
     &Metrics::Counters::frames_subscribers_only},
    {"frames_no_subscriber",
     "Frames sent to a daemon for its subscribers only that found none there (they left): delivered to none "
     "there.",
     &Metrics::Counters::frames_no_subscriber},
    {"lends_retired_for_room",
     "Lent segments a consumer held nothing of, retired to lend it another (it holds at most 64).",
     &Metrics::Counters::lends_retired_for_room},
    {"local_frames_taken_back",
     "Frames a local reader held unreleased past ack_timeout_ms: the frame ended for it (FL_ERR_TIMEOUT) and "
     "the producer's slot came back.",
     &Metrics::Counters::local_frames_taken_back},
    {"local_frames_handed_on",
     "Frames given to a local reader that had left before it read them: a queue member's go to another "
     "member, and one that reached nobody else waits for the readers attached.",
     &Metrics::Counters::local_frames_handed_on},
    {"bad_descriptors", "Ring entries or slot headers rejected.", &Metrics::Counters::bad_descriptors},
    {"credits_granted", "Receive slots granted to peers.", &Metrics::Counters::credits_granted},
    {"credits_granted_whole",
     "Of those, granted as a whole credit rather than a slot credit of an announced region.",
     &Metrics::Counters::credits_granted_whole},
    {"credits_recalled", "Credits recalled from a peer to share a stream's slots with its other senders.",
     &Metrics::Counters::credits_recalled},
    {"control_records_sent",
     "Control records (credit grants, ACKs, NACKs of one round) sent on data transports.",
     &Metrics::Counters::control_records_sent},
    {"control_records_received", "Control records received on data transports.",
     &Metrics::Counters::control_records_received},
    {"peer_messages_received",
     "Per-frame messages (credit grants, revokes and lows, ACKs, NACKs, offers) of those records handled.",
     &Metrics::Counters::peer_messages_received},
    {"nacks_sent", "Frames this daemon refused.", &Metrics::Counters::nacks_sent},
};
constexpr CounterInfo kLinksUp = {
    "links_up",
    "Peer link sessions open now, to any peer (two for one peer while a new link replaces the old). A "
    "peer's own state is framelink_link_up.",
    &Metrics::Counters::links_up};
constexpr CounterInfo kDiscoveryGauges[] = {
    {"discovery_registry_up",
     "1 while the registry ([discovery] etcd or dns_srv) answers, 0 while it does not (or none).",
     &Metrics::Counters::discovery_registry_up},
    {"discovery_peers", "Daemons found in the registry and linked to as peers (the written [[peer]]s apart).",
     &Metrics::Counters::discovery_peers},
};
constexpr CounterInfo kLinkCounters[] = {
    {"link_failures", "Peer sessions that ended.", &Metrics::Counters::link_failures},
    {"discovery_registry_errors", "Requests to the registry that failed (it keeps the daemons it found).",
     &Metrics::Counters::discovery_registry_errors},
    {"discovery_entries_refused",
     "Registry entries left out: not well formed, or their daemon proved another id (its HelloAck, its "
     "certificate, its Describe answer): not linked.",
     &Metrics::Counters::discovery_entries_refused},
    {"discovery_words_dropped",
     "dns_srv: what daemons said of themselves in Describe calls and was not kept: malformed, more than "
     "4096 streams, or past the 4096 daemons kept between two reads of the records.",
     &Metrics::Counters::discovery_words_dropped},
    {"discovery_watch_restarts",
     "etcd: watches of the registry that ended (etcd restarted, a keep-alive failed) and were started "
     "again, the registry read again first.",
     &Metrics::Counters::discovery_watch_restarts},
    {"auth_failures", "Peers refused for a wrong token or certificate.", &Metrics::Counters::auth_failures},
    {"peer_version_mismatches", "Peer sessions refused: no protocol version in common (the log names both).",
     &Metrics::Counters::peer_version_mismatches},
    {"peer_identity_refused",
     "Peers refused for claiming a daemon id their token or certificate does not prove (another peer's).",
     &Metrics::Counters::peer_identity_refused},
    {"peer_instance_conflicts",
     "Links of a peer id from a new instance while one from another instance was up (a restart not yet "
     "noticed, or another daemon using that id).",
     &Metrics::Counters::peer_instance_conflicts},
    {"peer_instance_refused",
     "Peers refused for claiming a linked daemon id from another instance while only the shared token proves "
     "that id (another daemon using it; a restart waits for its old link to end).",
     &Metrics::Counters::peer_instance_refused},
    {"peer_links_over_limit", "Peers refused because their daemon id had the most links one id may have up.",
     &Metrics::Counters::peer_links_over_limit},
    {"frames_replayed", "Unacknowledged frames sent again after a link broke.",
     &Metrics::Counters::frames_replayed},
    {"frames_offered", "Frames offered to a peer that takes its stream by pull, for it to read.",
     &Metrics::Counters::frames_offered},
    {"frames_pulled", "Frames read from a peer's offer into a consumer's slot here (pull).",
     &Metrics::Counters::frames_pulled},
    {"pull_reads_failed",
     "Reads of a peer's offer that failed (its source gone: the frame was answered or offered anew), or "
     "that ended after their stream closed on the link or moved to another (the frame refused; its slot "
     "waited for the read to end).",
     &Metrics::Counters::pull_reads_failed},
    {"links_stalled",
     "Links closed because their data transport stopped delivering while the Session still carried "
     "keepalives: what was handed to it link_timeout_ms ago had not reached the peer, or reads of offers "
     "were in flight and none completed; their frames go again on the next link.",
     &Metrics::Counters::links_stalled},
    {"links_cut_busy",
     "Links closed because their peer sent more than the data agent handles for one link in a round, round "
     "after round, for link_timeout_ms: the other links keep their turn.",
     &Metrics::Counters::links_cut_busy},
    {"links_throttled",
     "Times the data agent began to space out a link's turns: its peer's control records had filled them "
     "for 2 ms, leaving more each time, so it waits seven times its last turn before the next (an eighth "
     "of the agent); the turns come back as soon as a turn leaves none. Frames are never held back.",
     &Metrics::Counters::links_throttled},
    {"frames_maybe_redelivered",
     "Frames sent again to a restarted receiving daemon, flagged to the consumer as possible redeliveries.",
     &Metrics::Counters::frames_maybe_redelivered},
    {"duplicates_dropped", "Replayed frames this daemon already had (not delivered again).",
     &Metrics::Counters::duplicates_dropped},
    {"answer_gaps_forgotten",
     "Sequences of a sender's stream that never arrived while 4096 later ones did; a late replay of one "
     "is answered as of unknown outcome.",
     &Metrics::Counters::answer_gaps_forgotten},
    {"sender_streams_forgotten",
     "What was kept to answer a sender stream's replays, forgotten: open on no link and unused for a few "
     "ack timeouts, or the oldest such to make room for a new stream of a peer at its cap.",
     &Metrics::Counters::sender_streams_forgotten},
    {"peers_forgotten",
     "Peer daemon ids forgotten: not configured, no link to them, no stream and nothing kept to answer "
     "their replays (their dedup state goes a few ack timeouts after their last link).",
     &Metrics::Counters::peers_forgotten},
    {"peer_problems_forgotten",
     "Peers whose last problem was forgotten to keep another's: the oldest goes once 1024 peers have one.",
     &Metrics::Counters::peer_problems_forgotten},
};
// Frames and streams a link let go of without sending them.
constexpr CounterInfo kSettledCounters[] = {
    {"acks_for_replays",
     "Frames waiting to be replayed that their receiver's repeated ACK settled (released before the link "
     "broke).",
     &Metrics::Counters::acks_for_replays},
    {"streams_forgotten", "Out-streams closed on the link when their last producer left.",
     &Metrics::Counters::streams_forgotten},
};
constexpr CounterInfo kResentCounters[] = {
    {"frames_resent_crc", "Frames sent again after the peer found their CRC32C wrong.",
     &Metrics::Counters::frames_resent_crc},
    {"frames_resent_credit",
     "Frames sent again after they reached a receive slot withdrawn meanwhile (its consumer left).",
     &Metrics::Counters::frames_resent_credit},
};
constexpr CounterInfo kAdminCounters[] = {
    {"admin_requests", "Admin requests answered (framelink stats, clients, links).",
     &Metrics::Counters::admin_requests},
    {"admin_refused",
     "Admin requests refused: not root, the daemon's user or group, or the admin group; or malformed.",
     &Metrics::Counters::admin_refused},
};

// Counted per data listener: framelink_<name>_total{transport="tcp"|"rdma"} in
// the text format, <name>_tcp and <name>_rdma in the JSON's "counters".
struct ByTransportInfo {
  const char* name;
  const char* help;
  Counter tcp;
  Counter rdma;
};
constexpr ByTransportInfo kHandshakeCounters[] = {
    {"handshakes_timed_out",
     "Data-channel handshakes (tcp, rdma listeners) that did not finish before their deadline.",
     &Metrics::Counters::handshakes_timed_out_tcp, &Metrics::Counters::handshakes_timed_out_rdma},
    {"handshakes_refused",
     "Data-channel connections refused: too many handshakes at once (in all, or from one address).",
     &Metrics::Counters::handshakes_refused_tcp, &Metrics::Counters::handshakes_refused_rdma},
};

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
    {"reads_completed", "Reads (pull) of a peer's offered frame that landed in a buffer of this daemon.",
     &transport::TransportCounters::reads_completed},
    {"bytes_read", "Payload bytes of the reads that landed.", &transport::TransportCounters::bytes_read},
    {"reads_served", "Peers' reads of a frame this daemon offered that its transports answered (tcp, grpc).",
     &transport::TransportCounters::reads_served},
    {"unknown_source_reads", "Peers' reads of a source this daemon did not expose (answered with an error).",
     &transport::TransportCounters::unknown_source_reads},
    {"zerocopy_sends", "tcp: sendmsg calls that sent a frame's payload from its slot with MSG_ZEROCOPY.",
     &transport::TransportCounters::zerocopy_sends},
    {"zerocopy_copied",
     "tcp: of those the kernel has notified, the calls it copied all the same (a local path: loopback, "
     "veth).",
     &transport::TransportCounters::zerocopy_copied},
    {"batched_sends", "grpc: messages that carried several small frames at once (both daemons read batches).",
     &transport::TransportCounters::batched_sends},
    {"batched_frames", "grpc: the frames those messages carried.",
     &transport::TransportCounters::batched_frames},
};

uint64_t load(const Metrics::Counters& counters, Counter counter) {
  return (counters.*counter).load(std::memory_order_relaxed);
}

// ---- the Prometheus text format: families for prometheus-cpp's TextSerializer ----

using Families = std::vector<prometheus::MetricFamily>;
using Labels = std::vector<prometheus::ClientMetric::Label>;

// A new family at the end of `out`; the reference holds until the next one is added.
prometheus::MetricFamily& family(Families& out, std::string_view name, std::string_view help,
                                 prometheus::MetricType type) {
  out.push_back(prometheus::MetricFamily{"framelink_" + std::string(name), std::string(help), type, {}});
  return out.back();
}

// One sample of a counter or gauge family.
void sample(prometheus::MetricFamily& f, double value, Labels labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

// A family of one sample without labels.
void plainFamily(Families& out, std::string_view name, std::string_view help, prometheus::MetricType type,
                 double value) {
  sample(family(out, name, help, type), value);
}

void addCounterGroup(Families& out, std::span<const CounterInfo> group, const Metrics::Counters& counters) {
  for (const auto& c : group) {
    // The same count, with a status label, is addFailuresByStatus's family.
    if (c.value == &Metrics::Counters::frames_failed) continue;
    plainFamily(out, std::string(c.name) + "_total", c.help, prometheus::MetricType::Counter,
                static_cast<double>(load(counters, c.value)));
  }
}

void addCounters(Families& out, const Metrics::Counters& counters) {
  addCounterGroup(out, kFrameCounters, counters);
  addCounterGroup(out, kLinkCounters, counters);
  addCounterGroup(out, kSettledCounters, counters);
  addCounterGroup(out, kResentCounters, counters);
  plainFamily(out, kLinksUp.name, kLinksUp.help, prometheus::MetricType::Gauge,
              static_cast<double>(load(counters, kLinksUp.value)));
  for (const auto& g : kDiscoveryGauges) {
    plainFamily(out, g.name, g.help, prometheus::MetricType::Gauge,
                static_cast<double>(load(counters, g.value)));
  }
  for (const auto& h : kHandshakeCounters) {
    auto& f = family(out, std::string(h.name) + "_total", h.help, prometheus::MetricType::Counter);
    sample(f, static_cast<double>(load(counters, h.tcp)), {{"transport", "tcp"}});
    sample(f, static_cast<double>(load(counters, h.rdma)), {{"transport", "rdma"}});
  }
  addCounterGroup(out, kAdminCounters, counters);
}

void addAttachRejected(Families& out, std::span<const std::atomic<uint64_t>> rejected) {
  auto& f = family(out, "attach_rejected_total", "Attach connections turned away, by reason.",
                   prometheus::MetricType::Counter);
  for (size_t i = 0; i < rejected.size(); ++i) {
    sample(f, static_cast<double>(rejected[i].load(std::memory_order_relaxed)),
           {{"reason", Metrics::attachRejectName(static_cast<Metrics::AttachReject>(i))}});
  }
}

// framelink_frames_failed_total{status=...}: every failed frame counted once,
// under the status it failed with.  The statuses a frame can fail with (one
// frame's, 1xx; the transport's, 4xx) are there from the start, at 0, so that
// rate() sees their first failure; any other status once it happened.
void addFailuresByStatus(Families& out, std::span<const std::atomic<uint64_t>> failures) {
  auto& f = family(out, "frames_failed_total", "Frames that ended FAILED, by their fl_status.",
                   prometheus::MetricType::Counter);
  for (size_t i = 0; i < failures.size(); ++i) {
    const uint64_t v = failures[i].load(std::memory_order_relaxed);
    const int status = static_cast<int>(i);
    const bool frame_status = (status >= 100 && status < 200) || (status >= 400 && status < 500);
    std::string label = statusName(status);
    if (v == 0 && !(frame_status && label.rfind("FL_ERR_", 0) == 0)) continue;
    sample(f, static_cast<double>(v), {{"status", std::move(label)}});
  }
}

void addTransportCounters(Families& out, const transport::TransportCounters& transport) {
  for (const auto& c : kTransportCounters) {
    plainFamily(out, std::string("transport_") + c.name + "_total", c.help, prometheus::MetricType::Counter,
                static_cast<double>(transport.*c.value));
  }
}

// Peer names on the listening side come from the peer's Hello: the
// serializer escapes them as label values.
void addLinkGauges(Families& out, const std::vector<Metrics::LinkGauge>& links) {
  auto& up = family(
      out, "link_up",
      "One series per peer, configured or linked: 1 while a link to it is up (transport: its transport), 0 "
      "for a configured peer with no link (transport=\"none\"). The count of link sessions is "
      "framelink_links_up.",
      prometheus::MetricType::Gauge);
  for (const auto& l : links) {
    sample(up, l.transport.empty() ? 0 : 1,
           {{"peer", l.peer}, {"transport", l.transport.empty() ? "none" : l.transport}});
  }
  auto& rtt = family(out, "link_rtt_seconds", "Round trip of the link's last echoed keepalive.",
                     prometheus::MetricType::Gauge);
  for (const auto& l : links) {
    if (l.rtt_ns != 0) sample(rtt, static_cast<double>(l.rtt_ns) / 1e9, {{"peer", l.peer}});
  }
  auto& in_flight =
      family(out, "link_frames_in_flight", "Frames posted or sent on the link, not yet acknowledged.",
             prometheus::MetricType::Gauge);
  for (const auto& l : links) {
    if (!l.transport.empty()) sample(in_flight, static_cast<double>(l.in_flight), {{"peer", l.peer}});
  }
  auto& replayed =
      family(out, "link_frames_replayed_total", "Frames sent again after a link to this peer broke.",
             prometheus::MetricType::Counter);
  for (const auto& l : links) sample(replayed, static_cast<double>(l.replayed), {{"peer", l.peer}});
}

void addGauges(Families& out, const Metrics::Gauges& gauges) {
  using prometheus::MetricType;
  plainFamily(out, "frames_in_flight", "Producers' frames submitted and not yet DELIVERED or FAILED.",
              MetricType::Gauge, static_cast<double>(gauges.frames_in_flight));
  plainFamily(out, "frames_held", "Frames delivered to local consumers and not yet released.",
              MetricType::Gauge, static_cast<double>(gauges.frames_held));
  plainFamily(out, "pull_reads_in_flight", "Reads of peers' offers (pull) posted and not yet complete.",
              MetricType::Gauge, static_cast<double>(gauges.pull_reads_in_flight));
  plainFamily(out, "pull_reads_in_flight_peak",
              "The most reads of peers' offers one link had in flight at once since the daemon started "
              "(at most pull_reads_per_link).",
              MetricType::Gauge, static_cast<double>(gauges.pull_reads_peak));
  plainFamily(out, "slots_fenced",
              "Consumers' slots granted to no sender until the rdma window through which a peer could still "
              "write into them has shut (its invalidation waits on a send queue the peer does not drain).",
              MetricType::Gauge, static_cast<double>(gauges.slots_fenced));
  const std::pair<const char*, const Metrics::RoleGauge*> roles[] = {{"producer", &gauges.producers},
                                                                     {"consumer", &gauges.consumers}};
  auto byRole = [&](std::string_view name, std::string_view help, uint64_t Metrics::RoleGauge::*value) {
    auto& f = family(out, name, help, MetricType::Gauge);
    for (const auto& [role, g] : roles) sample(f, static_cast<double>(g->*value), {{"role", role}});
  };
  byRole("clients", "Clients attached now, by role.", &Metrics::RoleGauge::clients);
  byRole(
      "client_slots",
      "Slots of the clients attached now, by role: of a producer's, framelink_frames_in_flight are busy; of "
      "a consumer's, framelink_frames_held.",
      &Metrics::RoleGauge::slots);
  addLinkGauges(out, gauges.links);
}

// framelink_delivery_latency_seconds: the agent records microseconds into
// power-of-two buckets (1 us .. 8.4 s) and their sum; exposed in seconds.
void addLatencyHistogram(Families& out, std::span<const std::atomic<uint64_t>> buckets, uint64_t sum_us) {
  auto& f = family(out, "delivery_latency_seconds", "Submit to ACK latency of delivered frames.",
                   prometheus::MetricType::Histogram);
  prometheus::ClientMetric m;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    cumulative += buckets[i].load(std::memory_order_relaxed);
    m.histogram.bucket.push_back({cumulative, static_cast<double>(uint64_t{1} << i) / 1e6});
  }
  m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = static_cast<double>(sum_us) / 1e6;
  f.metric.push_back(std::move(m));
}

void addBuildInfo(Families& out, double start_time_s) {
#ifdef FRAMELINK_HAVE_RDMA
  constexpr const char* kRdma = "true";
#else
  constexpr const char* kRdma = "false";
#endif
  sample(family(out, "build_info", "Always 1: the framelinkd version and what it was built with.",
                prometheus::MetricType::Gauge),
         1,
         {{"version", std::to_string(FL_VERSION_MAJOR) + '.' + std::to_string(FL_VERSION_MINOR) + '.' +
                          std::to_string(FL_VERSION_PATCH)},
          {"rdma", kRdma}});
  // A restart shows as a change of this (the counters' resets miss one that is idle).
  plainFamily(out, "start_time_seconds", "When framelinkd started, in seconds since the Unix epoch.",
              prometheus::MetricType::Gauge, start_time_s);
}

// ---- the JSON ----

// The JSON's "counters": every counter by its Prometheus name without
// framelink_ and _total, then the transports'.
nlohmann::ordered_json jsonCounters(const Metrics::Counters& counters,
                                    const transport::TransportCounters& transport) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  auto group = [&](std::span<const CounterInfo> infos) {
    for (const auto& c : infos) out[c.name] = load(counters, c.value);
  };
  group(kFrameCounters);
  out[kLinksUp.name] = load(counters, kLinksUp.value);
  group(kDiscoveryGauges);
  group(kLinkCounters);
  group(kResentCounters);
  for (const auto& h : kHandshakeCounters) {
    out[std::string(h.name) + "_tcp"] = load(counters, h.tcp);
    out[std::string(h.name) + "_rdma"] = load(counters, h.rdma);
  }
  group(kSettledCounters);
  group(kAdminCounters);
  for (const auto& c : kTransportCounters) out[std::string("transport_") + c.name] = transport.*c.value;
  return out;
}

}  // namespace

std::string Metrics::prometheus() const {
  Families families;
  addCounters(families, counters);
  addAttachRejected(families, attach_rejected_);
  addFailuresByStatus(families, failures_by_status_);
  {
    MutexLock lock(detail_mutex_);
    addTransportCounters(families, transport_);
    addGauges(families, gauges_);
  }
  addLatencyHistogram(families, latency_, latency_sum_us_.load(std::memory_order_relaxed));
  addBuildInfo(families, start_time_s_);
  return prometheus::TextSerializer().Serialize(families);
}

std::string Metrics::summary() const {
  Gauges g;
  {
    MutexLock lock(detail_mutex_);
    g = gauges_;
  }
  const auto count = [](uint64_t n, const char* one, const char* many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
  };
  const auto up = static_cast<uint64_t>(
      std::count_if(g.links.begin(), g.links.end(), [](const LinkGauge& l) { return !l.transport.empty(); }));
  return "serving: " + count(g.producers.clients, "producer", "producers") + " and " +
         count(g.consumers.clients, "consumer", "consumers") + " attached; links up to " +
         std::to_string(up) + " of " + count(g.links.size(), "peer", "peers") + "; " +
         std::to_string(counters.frames_delivered.load(std::memory_order_relaxed)) + " frames delivered, " +
         std::to_string(counters.frames_failed.load(std::memory_order_relaxed)) + " failed";
}

std::string Metrics::json() const {
  transport::TransportCounters transport;
  DetailRenderer render;
  {
    MutexLock lock(detail_mutex_);
    transport = transport_;
    render = detail_;
  }
  const std::string detail = render();
  nlohmann::ordered_json out;
  const std::pair<const char*, const std::atomic<uint64_t>*> totals[] = {
      {"frames_submitted", &counters.frames_submitted},
      {"frames_delivered", &counters.frames_delivered},
      {"frames_failed", &counters.frames_failed},
      {"frames_received", &counters.frames_received},
      {"frames_released", &counters.frames_released},
      {"local_frames_lent", &counters.local_frames_lent},
      {"local_frames_copied", &counters.local_frames_copied},
      {"frames_dropped_slow_reader", &counters.frames_dropped_slow_reader},
      {"frames_subscribers_only", &counters.frames_subscribers_only},
      {"frames_no_subscriber", &counters.frames_no_subscriber},
      {"lends_retired_for_room", &counters.lends_retired_for_room},
      {"local_frames_taken_back", &counters.local_frames_taken_back},
      {"local_frames_handed_on", &counters.local_frames_handed_on},
      {"bytes_sent", &counters.bytes_sent},
      {"bytes_received", &counters.bytes_received},
      {"links_up", &counters.links_up}};
  for (const auto& [name, value] : totals) out[name] = value->load(std::memory_order_relaxed);
  nlohmann::ordered_json& rejected = out["attach_rejected"] = nlohmann::ordered_json::object();
  for (size_t i = 0; i < attach_rejected_.size(); ++i) {
    rejected[attachRejectName(static_cast<AttachReject>(i))] =
        attach_rejected_[i].load(std::memory_order_relaxed);
  }
  out["handshakes_timed_out"] = {{"tcp", counters.handshakes_timed_out_tcp.load()},
                                 {"rdma", counters.handshakes_timed_out_rdma.load()}};
  out["streams_forgotten"] = counters.streams_forgotten.load();
  out["counters"] = jsonCounters(counters, transport);
  nlohmann::ordered_json& failed = out["failed_by_status"] = nlohmann::ordered_json::object();
  for (size_t i = 0; i < failures_by_status_.size(); ++i) {
    const uint64_t v = failures_by_status_[i].load(std::memory_order_relaxed);
    if (v != 0) failed[std::to_string(i)] = v;
  }
  // The last problem with each peer: peer names and messages are any bytes
  // (invalid UTF-8 is replaced when dumped, never thrown on).
  nlohmann::ordered_json& problems = out["peer_problems"] = nlohmann::ordered_json::object();
  for (const auto& [peer, p] : peer_problems.snapshot()) {
    problems[peer] = {{"last_error", p.what},
                      {"cause", PeerProblems::causeName(p.cause)},
                      {"last_error_ns", p.at_ns},
                      {"errors", p.count}};
  }
  const ConfigInfo config = configInfo();
  out["config"] = {{"hash", config.hash}, {"loaded_ns", config.loaded_ns}, {"reloads", config.reloads}};
  // The agent's snapshot (agent_stats.cpp, written with nlohmann too), kept in its order.
  out["detail"] = nlohmann::ordered_json::parse(detail, nullptr, /*allow_exceptions=*/false);
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace framelink
