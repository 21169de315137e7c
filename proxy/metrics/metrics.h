// Counters the data agent updates and a Prometheus text / JSON endpoint
// (cpp-httplib) that reads them.  Counters are relaxed atomics: the agent is
// the only writer, the HTTP thread only reads.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "metrics/peer_problems.h"
#include "transport/transport.h"  // TransportCounters, a plain struct

namespace framelink {

class Metrics {
 public:
  struct Counters {
    std::atomic<uint64_t> clients_attached{0};
    std::atomic<uint64_t> clients_detached{0};
    std::atomic<uint64_t> frames_submitted{0};
    std::atomic<uint64_t> frames_delivered{0};
    std::atomic<uint64_t> frames_failed{0};
    std::atomic<uint64_t> bytes_sent{0};
    std::atomic<uint64_t> frames_received{0};
    std::atomic<uint64_t> bytes_received{0};
    std::atomic<uint64_t> frames_released{0};
    std::atomic<uint64_t> local_frames_lent{0};           // to a consumer on this host, without a copy
    std::atomic<uint64_t> local_frames_copied{0};         // to a consumer on this host, copied into its slot
    std::atomic<uint64_t> frames_dropped_slow_reader{0};  // a drop stream's subscriber skipped for a frame
    std::atomic<uint64_t> frames_subscribers_only{0};     // sent to a host for its subscribers only
    std::atomic<uint64_t> frames_no_subscriber{0};        // of those, refused there: no subscriber left
    std::atomic<uint64_t> lends_retired_for_room{0};  // a consumer's idle lent segment retired at FL_LEND_MAX
    std::atomic<uint64_t> local_frames_taken_back{0};  // a local reader held a frame past ack_timeout_ms
    std::atomic<uint64_t> local_frames_handed_on{0};   // a reader left before reading it: handed on
    std::atomic<uint64_t> bad_descriptors{0};
    std::atomic<uint64_t> credits_granted{0};
    std::atomic<uint64_t> credits_granted_whole{0};  // of those, not as a slot credit (design §4)
    std::atomic<uint64_t> credits_recalled{0};       // recalled to share a stream's slots among its senders
    std::atomic<uint64_t> control_records_sent{0};   // per-frame protocol records to peers' transports
    std::atomic<uint64_t> control_records_received{0};  // and from them
    std::atomic<uint64_t> peer_messages_received{0};    // per-frame messages of those records, handled
    std::atomic<uint64_t> nacks_sent{0};
    std::atomic<uint64_t> links_up{0};
    // [discovery]: gauges (whether the registry answered its last request;
    // the daemons found there), and what went wrong with it.
    std::atomic<uint64_t> discovery_registry_up{0};
    std::atomic<uint64_t> discovery_peers{0};
    std::atomic<uint64_t> discovery_registry_errors{0};  // requests to the registry that failed
    std::atomic<uint64_t> discovery_entries_refused{0};  // entries whose daemon was not who they named
    std::atomic<uint64_t> discovery_words_dropped{0};    // dns_srv: daemons' words of themselves not kept
    std::atomic<uint64_t> discovery_watch_restarts{0};   // etcd: watches that ended and were started again
    std::atomic<uint64_t> link_failures{0};
    std::atomic<uint64_t> auth_failures{0};
    std::atomic<uint64_t> peer_version_mismatches{0};  // Sessions refused: no protocol version in common
    std::atomic<uint64_t> peer_identity_refused{0};  // Hellos whose credentials do not prove their daemon id
    // a second instance of a peer id linked while one was up
    std::atomic<uint64_t> peer_instance_conflicts{0};
    // Hellos refused: a second instance of a linked id that only the shared token proves
    std::atomic<uint64_t> peer_instance_refused{0};
    // Hellos refused: their id had kMaxLinksPerPeer links up
    std::atomic<uint64_t> peer_links_over_limit{0};
    std::atomic<uint64_t> frames_replayed{0};           // sent again on a new link after a link broke
    std::atomic<uint64_t> frames_maybe_redelivered{0};  // replayed to a restarted receiving daemon
    std::atomic<uint64_t> frames_offered{0};            // pull: offered to a peer, for it to read
    std::atomic<uint64_t> frames_pulled{0};             // pull: read from a peer's offer into a slot here
    std::atomic<uint64_t> pull_reads_failed{0};         // pull: reads of an offer that failed
    std::atomic<uint64_t> links_stalled{0};             // links closed: their data path stopped delivering
    std::atomic<uint64_t> links_cut_busy{
        0};  // links closed: their peer's records kept the agent busy too long
    // times a link's turns were spaced out: its peer's control records had filled them for 2 ms
    std::atomic<uint64_t> links_throttled{0};
    std::atomic<uint64_t> duplicates_dropped{0};  // replays of frames this daemon already had
    // Sequences a receiving stream stopped waiting for: its sender never
    // resent them while kMaxRemembered later frames were answered.
    std::atomic<uint64_t> answer_gaps_forgotten{0};
    // what was remembered of a sender stream, forgotten: unused for long, or to make room
    std::atomic<uint64_t> sender_streams_forgotten{0};
    // peer ids no link, stream or replay state refers to any more, forgotten (not configured ones)
    std::atomic<uint64_t> peers_forgotten{0};
    // peers whose last problem made room for another peer's (PeerProblems::kMaxPeers)
    std::atomic<uint64_t> peer_problems_forgotten{0};
    std::atomic<uint64_t> frames_resent_crc{0};     // sent again after the peer found the CRC32C wrong
    std::atomic<uint64_t> frames_resent_credit{0};  // sent again after landing in a withdrawn credit
    // Data-channel handshakes (tcp listener, rdma listener) that did not
    // finish before their deadline, and those refused: too many at once.
    std::atomic<uint64_t> handshakes_timed_out_tcp{0};
    std::atomic<uint64_t> handshakes_timed_out_rdma{0};
    std::atomic<uint64_t> handshakes_refused_tcp{0};
    std::atomic<uint64_t> handshakes_refused_rdma{0};
    std::atomic<uint64_t> acks_for_replays{0};  // frames settled by an ACK repeated on a new link, not resent
    std::atomic<uint64_t> streams_forgotten{0};  // out-streams closed when their last producer left
    std::atomic<uint64_t> admin_requests{0};     // admin snapshots sent (framelink stats, clients, links)
    std::atomic<uint64_t> admin_refused{0};      // admin requests refused (not allowed, malformed)
  };
  static constexpr size_t kLatencyBuckets = 24;  // 2^0 .. 2^23 microseconds

  // Why the attach endpoint turned a connection away.
  enum class AttachReject : size_t {
    kHandshakeTimeout,  // connected and sent no request in time
    kTooManyPending,    // one uid had too many connections without a request
    kFdLimit,           // the daemon was out of file descriptors
    kInvalid,           // malformed request, refused by policy or over a size limit
    kTooManyClients,    // the uid has limits.max_clients_per_uid clients attached already
    kMemoryLimit,       // its segments would exceed limits.max_uid_bytes or max_total_bytes
    kCount,
  };
  static const char* attachRejectName(AttachReject reason) noexcept;
  void recordAttachReject(AttachReject reason) noexcept {
    attach_rejected_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t attachRejected(AttachReject reason) const noexcept {
    return attach_rejected_[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
  }

  Counters counters;
  PeerProblems peer_problems{counters.peer_problems_forgotten};

  void recordDeliveryLatency(uint64_t micros) noexcept;
  void recordFailure(int status) noexcept;
  // Per client / stream / link, from the agent: what renders the JSON of
  // /stats and the admin snapshot.  The agent hands over its snapshot and
  // this renderer; the JSON is made only when asked for, on the asker's
  // thread, not every publish period on the agent's.
  using DetailRenderer = std::function<std::string()>;
  void setDetail(DetailRenderer render);
  void setDetail(std::string json);

  // Gauges per link and of frames in flight, from the agent (with the detail).
  struct LinkGauge {
    std::string peer;
    std::string transport;  // empty: a configured peer with no link up
    uint64_t rtt_ns = 0;    // 0: not measured
    uint64_t in_flight = 0;
    uint64_t replayed = 0;
  };
  // Attached clients (not yet gone) and their slots, by role.
  struct RoleGauge {
    uint64_t clients = 0;
    uint64_t slots = 0;
  };
  // The streams of the clients attached here, each list sorted, a stream once.
  struct StreamsHere {
    std::vector<std::string> readers;    // the streams consumers here read
    std::vector<std::string> producers;  // and those producers here write
    // Of readers, those a subscriber here reads, and those a member of a
    // queue group here reads (a stream may be in both).
    std::vector<std::string> subscribed;
    std::vector<std::string> grouped;
    bool operator==(const StreamsHere&) const = default;
  };
  struct Gauges {
    std::vector<LinkGauge> links;
    RoleGauge producers;
    RoleGauge consumers;
    uint64_t frames_in_flight = 0;      // producers' frames submitted and not yet DELIVERED or FAILED
    uint64_t frames_held = 0;           // delivered to local consumers, not yet released
    uint64_t pull_reads_in_flight = 0;  // pull: reads of peers' offers posted, not yet complete
    uint64_t pull_reads_peak = 0;       // pull: the most one link ever had in flight at once
    uint64_t slots_fenced = 0;          // rdma: slots held back until a peer's window into them shut
    StreamsHere streams;
  };
  // Calls the streams watcher when Gauges::streams differ from the last.
  void setGauges(Gauges gauges);
  // Called when the streams here change (discovery publishes them at once,
  // not at its next poll); runs under the metrics' lock, so it must not call
  // back into Metrics.  Empty: none.
  void setStreamsWatcher(std::function<void()> watcher);
  // Gauges::streams as the agent published them last (the registry announces them).
  StreamsHere streamsHere() const;
  // What the links' transports did, summed over every link the agent had
  // (closed ones included, so the totals never go down), from the agent.
  void setTransportCounters(const transport::TransportCounters& totals);
  // The configuration running (framelinkd: set at start and by each reload), for /stats.
  struct ConfigInfo {
    std::string hash;        // configHash()
    uint64_t loaded_ns = 0;  // wall clock, when it was read
    uint64_t reloads = 0;    // reloads applied since start
  };
  void setConfigInfo(ConfigInfo info);
  ConfigInfo configInfo() const;

  std::string prometheus() const;
  std::string json() const;

  // How often the data agent publishes its state (setGauges, setDetail), from its own loop.
  static constexpr uint64_t kPublishPeriodNs = 500'000'000;
  // GET /healthz: healthy while the data agent published its state within
  // the window, 5 s unless a test sets another; the text says when it last
  // did, for a probe's log.
  struct Health {
    bool ok = false;
    std::string text;
  };
  // An idle agent publishes only what changed, so a state older than the
  // window first asks it for a fresh one (`ask`, which wakes it) and waits
  // up to a second: only an agent that does not answer is unhealthy.
  Health health() const;
  void setPublishRequest(std::function<void()> ask);
  void setHealthWindow(uint64_t window_ns) noexcept { health_window_ns_ = window_ns; }

  // One line for `systemctl status` (sd_notify STATUS=): "serving: 1 producer
  // and 2 consumers attached; links up to 1 of 2 peers; 1200 frames delivered,
  // 3 failed".
  std::string summary() const;

  // Starts the HTTP endpoint ("host:port"; port 0 = ephemeral).
  Status serve(const std::string& listen);
  uint16_t port() const noexcept { return port_; }
  void stop();
  Metrics();
  ~Metrics();

 private:
  std::array<std::atomic<uint64_t>, kLatencyBuckets> latency_{};
  std::atomic<uint64_t> latency_sum_us_{0};
  double start_time_s_;  // wall clock at construction: framelink_start_time_seconds
  std::array<std::atomic<uint64_t>, 512> failures_by_status_{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(AttachReject::kCount)> attach_rejected_{};
  mutable Mutex detail_mutex_;
  DetailRenderer detail_ FL_GUARDED_BY(detail_mutex_) = [] { return std::string("{}"); };
  uint64_t detail_at_ns_ FL_GUARDED_BY(detail_mutex_) = 0;  // steady clock; 0: never published
  mutable std::condition_variable published_;               // detail_at_ns_ moved
  std::function<void()> ask_publish_ FL_GUARDED_BY(detail_mutex_);
  std::function<void()> streams_watcher_ FL_GUARDED_BY(detail_mutex_);
  std::atomic<uint64_t> health_window_ns_{5'000'000'000};
  Gauges gauges_ FL_GUARDED_BY(detail_mutex_);
  transport::TransportCounters transport_ FL_GUARDED_BY(detail_mutex_);
  ConfigInfo config_ FL_GUARDED_BY(detail_mutex_);
  struct Server;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  uint16_t port_ = 0;
};

}  // namespace framelink
