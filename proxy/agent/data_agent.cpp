#include "agent/data_agent.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <span>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "agent/idle_strategy.h"
#include "common/log_fields.h"
#include "framelink/framelink.h"
#include "framelink/status_name.hpp"
#include "metrics/metrics.h"

namespace framelink {

namespace {

// epoll tags: the top byte says what the low bits name.
constexpr uint64_t kTagCommands = 0;
constexpr uint64_t kTagClient = 1ULL << 56;
constexpr uint64_t kTagLink = 2ULL << 56;
constexpr uint64_t kTagMask = 0xFFULL << 56;

constexpr uint64_t kDeadlineCheckNs = 10'000'000;  // 10 ms
// How long a peer has to read the Fin of a link closed for a protocol error.
constexpr uint64_t kFinGraceNs = 1'000'000'000;
constexpr uint64_t kStatsNs = Metrics::kPublishPeriodNs;
// The longest sleep: credit and ACK deadlines are checked at least this often.
constexpr uint64_t kMaxSleepNs = 50'000'000;  // 50 ms
// With no client and no link: what it publishes cannot change but by a
// command, which wakes it (and the stats are published at their next
// period), so an idle agent sleeps until one comes; a health probe that finds
// its state old asks it for a new one (CmdPublishStats).
constexpr uint64_t kForeverNs = UINT64_MAX;

// Waits for epoll events at most `timeout_ns`; returns how many of `events`
// it filled.  epoll_pwait2 (Linux 5.11) takes nanoseconds, so an ACK held
// back for some microseconds is not sent a millisecond late; an older kernel
// gets epoll_wait, rounded up to a millisecond.
int waitEvents(int epoll_fd, uint64_t timeout_ns, std::span<epoll_event> events) {
  static std::atomic<bool> no_pwait2{false};
  const int max = static_cast<int>(events.size());
  const bool forever = timeout_ns == kForeverNs;
  if (!no_pwait2.load(std::memory_order_relaxed)) {
    timespec timeout{};
    timeout.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000ULL);
    timeout.tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000ULL);
    const int n = ::epoll_pwait2(epoll_fd, events.data(), max, forever ? nullptr : &timeout, nullptr);
    if (n >= 0) return n;
    if (errno != ENOSYS) return 0;
    no_pwait2.store(true, std::memory_order_relaxed);
  }
  const int n = ::epoll_wait(epoll_fd, events.data(), max,
                             forever ? -1 : static_cast<int>((timeout_ns + 999'999) / 1'000'000));
  return n > 0 ? n : 0;
}

}  // namespace

DataAgent::DataAgent(const Config& config, Metrics& metrics, const AgentClock& clock,
                     AgentHeartbeat heartbeat)
    : config_(config),
      metrics_(metrics),
      clock_(clock),
      epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)),
      clients_(metrics, names_),
      outbound_(config_, metrics, clock, clients_, peers_, links_),
      inbound_(metrics, clients_, links_, names_, clock, uint64_t{config.ack_delay_us} * 1000,
               inboundLimits(config)),
      local_(config_, metrics, clock, clients_,
             [this](AgentClient& producer, uint32_t slot, int status, const std::string& why,
                    uint32_t readers, uint32_t released) {
               outbound_.endLocalFrame(producer, slot, status, why, readers, released);
             }),
      heartbeat_(std::move(heartbeat)) {
  outbound_.setLocalDelivery(&local_);
  inbound_.setLocalDelivery(&local_);
  inbound_.setPullStreams(config.pull_streams);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagCommands;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, commands_.eventFd(), &ev);
  // A retracted offer's slot read no more wakes the agent as a command does.
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, outbound_.sourcesFd(), &ev);
}

DataAgent::~DataAgent() { stop(); }

void DataAgent::start() {
  running_ = true;
  thread_ = std::thread([this] { run(); });
}

void DataAgent::run() {
  ::pthread_setname_np(::pthread_self(), "fl-data-agent");
  if (config_.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(config_.cpu, &set);
    if (::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set) != 0) {
      spdlog::warn("cannot pin the data agent to CPU {}; running unpinned", config_.cpu);
    }
  }
  // Spin, yield a little, then sleep: on 2 cores a spinning agent would take
  // the CPU the applications (and a software RDMA device) need.
  IdleStrategy idle(uint64_t{config_.idle_spin_us} * 1000);
  while (running_) {
    uint64_t work = drainCommands();
    if (!running_) break;
    // A command changed what the stats show: an idle agent publishes them at
    // the next period, not kIdleSleepNs later.
    if (work != 0) stats_changed_ = true;
    work += doWork();
    checkDrain(clock_.nowNs());
    clients_.wakeReaders();
    if (!running_) break;
    // After a sleep that brought no work, sleep again at once: only work
    // re-arms the spin phase.
    if (idle.idle(work, clock_.nowNs())) sleep();
  }
  shutdown();
}

size_t DataAgent::doWork() {
  size_t work = 0;
  work += clients_.drainRings([this](AgentClient& c, const fl_submit_desc& d) { onDescriptor(c, d); });
  work += pollLinks();
  work += inbound_.flushControl();
  work += outbound_.pumpAll();
  work += local_.pump();
  const uint64_t now = clock_.nowNs();
  if (now >= next_deadline_check_ns_) {
    outbound_.checkDeadlines();
    local_.checkDeadlines();
    for (const auto& failed : inbound_.checkDeadlines()) {
      AgentLink* l = links_.find(failed.link_id);
      if (l == nullptr) continue;
      if (failed.violation) {
        protocolError(*l, failed.why);
      } else {
        closeLink(*l, v1::ERROR_CODE_TIMEOUT, failed.why);
      }
    }
    cutOverdueSessions(now);
    checkDataPaths(now);
    if (!reroute_waiting_.empty()) retryReroutes();
    next_deadline_check_ns_ = now + kDeadlineCheckNs;
    // Here, not on a timer of its own: a beat costs the busy loop nothing
    // more than this check, and it comes only from rounds that get this far.
    if (heartbeat_.enabled() && now >= next_heartbeat_ns_) {
      heartbeat_.beat();
      next_heartbeat_ns_ = now + heartbeat_.period_ns;
    }
  }
  if (now >= next_stats_ns_) {
    forgetIdlePeers();
    publishStats();
    stats_changed_ = false;
    next_stats_ns_ = now + kStatsNs;
  }
  // Last: whatever this round decided for a peer (ACKs, grants, NACKs) goes
  // before the agent may sleep.
  work += flushLinkControl();
  return work;
}

size_t DataAgent::flushLinkControl() {
  size_t records = 0;
  for (auto& [id, l] : links_) {
    if (l.control.messages_size() == 0 && l.controlQueued().empty()) continue;
    std::string failed;
    const size_t n = l.flushControl(&failed);
    records += n;
    l.data_sent += n;
    metrics_.counters.control_records_sent.fetch_add(n, std::memory_order_relaxed);
    // A link already closing may overflow again until it is down: once said is enough.
    if (!failed.empty() && !l.closing) protocolError(l, failed);
  }
  return records;
}

bool DataAgent::runUntilIdle(size_t max_rounds) {
  for (size_t i = 0; i < max_rounds; ++i) {
    size_t work = drainCommands();
    work += doWork();
    clients_.wakeReaders();
    if (work == 0 && nextBusyTurnNs() == 0) return true;
  }
  return false;
}

void DataAgent::sleep() {
  // Announce sleep on every submit ring, then re-check: a client that
  // pushed meanwhile sees the flag and rings the doorbell, or we see its entry.
  if (clients_.prepareSleep()) {
    // Bounded so that credit and ACK deadlines are noticed, and never past
    // the moment the oldest ACK held back for coalescing is due, nor a
    // throttled link's next turn (what it left no event announces).
    uint64_t timeout_ns = kMaxSleepNs;
    const uint64_t now = clock_.nowNs();
    // With no client and no link nothing can come due but the stats and the
    // watchdog's beat: an idle daemon sleeps until a command comes, not 20
    // times a second (a fleet of them idles).
    if (clients_.all().empty() && links_.size() == 0) {
      timeout_ns = stats_changed_ ? (next_stats_ns_ > now ? next_stats_ns_ - now : 0) : kForeverNs;
      if (heartbeat_.enabled()) {
        timeout_ns = next_heartbeat_ns_ > now ? std::min(timeout_ns, next_heartbeat_ns_ - now) : 0;
      }
    }
    for (const uint64_t due : {inbound_.nextControlDeadlineNs(), nextBusyTurnNs()}) {
      if (due != 0) timeout_ns = due <= now ? 0 : std::min(timeout_ns, due - now);
    }
    std::array<epoll_event, 32> events{};
    const int n = waitEvents(epoll_fd_.get(), timeout_ns, events);
    for (int i = 0; i < n; ++i) {
      if ((events[i].data.u64 & kTagMask) == kTagClient) rang_.push_back(events[i].data.u64 & ~kTagMask);
    }
  }
  // Only the doorbells that rang are read (reading all after every sleep made
  // a slow stream's frames wait for them all); a later one after the next.
  clients_.endSleep(rang_);
  rang_.clear();
}

size_t DataAgent::drainCommands() {
  std::deque<AgentCommand> batch;
  const size_t n = commands_.drain(batch);
  for (auto& command : batch) {
    std::visit(
        [this](auto& cmd) {
          using T = std::decay_t<decltype(cmd)>;
          if constexpr (std::is_same_v<T, CmdClientAttached>) {
            onClientAttached(std::move(cmd.client));
          } else if constexpr (std::is_same_v<T, CmdClientGone>) {
            onClientGone(cmd.client_id);
          } else if constexpr (std::is_same_v<T, CmdLinkUp>) {
            onLinkUp(cmd);
          } else if constexpr (std::is_same_v<T, CmdLinkDown>) {
            onLinkDown(cmd.link_id, cmd.reason);
          } else if constexpr (std::is_same_v<T, CmdPeerMessage>) {
            if (cmd.backlog) {
              cmd.backlog->messages.fetch_sub(1, std::memory_order_relaxed);
              cmd.backlog->bytes.fetch_sub(cmd.bytes, std::memory_order_relaxed);
            }
            AgentLink* l = links_.find(cmd.link_id);
            if (l == nullptr) return;
            const LogScope scope(LogFields{.peer = l->peer_name});
            if (cmd.from_session && isPerFrameMessage(*cmd.message)) {
              protocolError(
                  *l,
                  "a per-frame message (credit grant, revoke or low, ACK, NACK, offer) came on the Session; "
                  "the peer protocol carries those on the data transport only");
              return;
            }
            onPeerMessage(*l, *cmd.message);
          } else if constexpr (std::is_same_v<T, CmdLinkKeepalive>) {
            const KeepaliveNews::Said said = cmd.news->take();
            AgentLink* l = links_.find(cmd.link_id);
            if (l == nullptr) return;
            if (said.rtt_ns != 0) l->rtt_ns = said.rtt_ns;
            if (said.has_data) {
              // Any progress restarts the wait: a slow path that still
              // delivers (one large frame takes long) is no stalled one.
              if (!l->peer_counts_data || said.data_received != l->peer_data_received) {
                l->unconfirmed_since_ns = 0;
              }
              l->peer_counts_data = true;
              l->peer_data_received = said.data_received;
            }
          } else if constexpr (std::is_same_v<T, CmdStop>) {
            beginStop(cmd);
          } else if constexpr (std::is_same_v<T, CmdReconfigure>) {
            reconfigure(*cmd.config);
          } else if constexpr (std::is_same_v<T, CmdPublishStats>) {
            next_stats_ns_ = 0;
          }
        },
        command);
  }
  return n;
}

void DataAgent::takeAttaches() {
  std::deque<AgentCommand> attaches;
  commands_.drainIf([](const AgentCommand& c) { return std::holds_alternative<CmdClientAttached>(c); },
                    attaches);
  for (auto& command : attaches) onClientAttached(std::move(std::get<CmdClientAttached>(command).client));
}

void DataAgent::onDescriptor(AgentClient& c, const fl_submit_desc& desc) {
  const LogScope scope(LogFields{.client = c.session->id, .stream = c.session->stream});
  if (c.session->role == FL_ROLE_PRODUCER) {
    // Where the frame goes depends on the readers attached here: those whose
    // attach came before the frame count (map nodes stay put: `c` survives).
    if (attaches_posted_.load(std::memory_order_acquire) != attaches_taken_) takeAttaches();
    outbound_.onSubmit(c, desc);
  } else {
    inbound_.onRelease(c, desc);
  }
}

// ---------------------------------------------------------------- clients

void DataAgent::onClientAttached(std::shared_ptr<ClientSession> session) {
  ++attaches_taken_;
  const LogScope scope(LogFields{.client = session->id, .stream = session->stream});
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagClient | session->id;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, session->submit_doorbell.get(), &ev);
  metrics_.counters.clients_attached.fetch_add(1, std::memory_order_relaxed);
  AgentClient& c = clients_.add(std::move(session));
  if (c.session->role == FL_ROLE_CONSUMER) {
    inbound_.onConsumerAttached(c);
  } else {
    outbound_.onProducerAttached(c);
  }
}

void DataAgent::onClientGone(uint64_t client_id) {
  AgentClient* c = clients_.find(client_id);
  if (c == nullptr) return;
  ClientSession& s = *c->session;
  // A copy: the client may be forgotten (and its session freed) below.
  const std::string stream = s.stream;
  const LogScope scope(LogFields{.client = client_id, .stream = stream});
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, s.submit_doorbell.get(), nullptr);
  // What the client put in its ring before it went away still counts: a
  // consumer's last releases (so their frames are ACKed, not failed) and a
  // producer's last submits (which are still sent).
  if (!s.gone) {
    clients_.drainAll(*c, [this](AgentClient& ac, const fl_submit_desc& d) { onDescriptor(ac, d); });
  }
  s.gone = true;
  metrics_.counters.clients_detached.fetch_add(1, std::memory_order_relaxed);
  clients_.detachLog().info("client {} detached (pid {}, stream '{}', {} frames, {} bytes)", s.id, s.pid,
                            s.stream, s.frames, s.bytes);
  if (s.role == FL_ROLE_CONSUMER) inbound_.onConsumerGone(*c);
  if (s.role == FL_ROLE_PRODUCER) local_.producerGone(s);
  outbound_.maybeForget(*c);
}

// ---------------------------------------------------------------- links

void DataAgent::onLinkUp(CmdLinkUp& cmd) {
  AgentLink& l = links_.add(cmd.link_id);
  static_cast<LinkIdentity&>(l) = cmd.identity;
  l.peer = peers_.resolve(l.peer_name);
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  l.up_since_ns = uint64_t(now.tv_sec) * 1'000'000'000ULL + uint64_t(now.tv_nsec);
  l.transport = std::move(cmd.transport);
  l.session = std::move(cmd.session);
  const LogScope scope(LogFields{.peer = l.peer_name});
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagLink | l.id;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, l.transport->eventFd(), &ev);
  metrics_.counters.links_up.fetch_add(1, std::memory_order_relaxed);
  log_link_up_.info("link {} to peer {} is up over {}{}", l.id, l.peer_name, l.transport_name,
                    l.transport_reason.empty() ? "" : " (" + l.transport_reason + ")");
  inbound_.onLinkUp(l);
  outbound_.onLinkUp(l);
}

size_t DataAgent::forgetIdlePeers() {
  std::unordered_set<PeerId> linked;  // a link being replaced or closed still names its peer
  for (const auto& [link_id, l] : links_) linked.insert(l.peer);
  std::vector<PeerId> idle;
  for (const auto& [name, id] : peers_.byName()) {
    if (linked.count(id) != 0 || outbound_.sendsTo(id) || inbound_.remembers(id)) continue;
    const bool configured = std::any_of(config_.peers.begin(), config_.peers.end(),
                                        [&name = name](const PeerConfig& p) { return p.name == name; });
    if (!configured) idle.push_back(id);
  }
  for (const PeerId id : idle) {
    spdlog::debug("peer {} forgotten: no link, stream or replay state refers to it", peers_[id].name);
    outbound_.forgetPeer(id);
    peers_.forget(id);
  }
  metrics_.counters.peers_forgotten.fetch_add(idle.size(), std::memory_order_relaxed);
  return idle.size();
}

void DataAgent::onLinkDown(uint64_t link_id, const std::string& reason) {
  AgentLink* l = links_.find(link_id);
  if (l == nullptr) return;
  // A copy: the link is erased below, and what follows may still log.
  const std::string peer_name = l->peer_name;
  const LogScope scope(LogFields{.peer = peer_name});
  log_link_down_.warn("link {} to peer {} is down: {}", l->id, l->peer_name, reason);
  metrics_.peer_problems.record(
      l->peer_name, PeerProblems::Cause::kLinkDown,
      "link " + std::to_string(l->id) + " over " + l->transport_name + " went down: " + reason);
  metrics_.counters.links_up.fetch_sub(1, std::memory_order_relaxed);
  metrics_.counters.link_failures.fetch_add(1, std::memory_order_relaxed);
  if (l->transport) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, l->transport->eventFd(), nullptr);
    l->transport->shutdown();
    // Sends still posted complete with FL_ERR_LINK_LOST; deliver those
    // events, and those taken off the transport before that waited for
    // the link's turn.
    for (transport::TransportEvent& ev : l->events_waiting) {
      if (ev.kind == transport::TransportEvent::Kind::kSendComplete) outbound_.onSendComplete(ev);
    }
    l->events_waiting.clear();
    transport::TransportEvent* events = events_.get();
    size_t n;
    while ((n = l->transport->poll(events, kMaxEventsPerRound)) > 0) {
      for (size_t i = 0; i < n; ++i) {
        if (events[i].kind == transport::TransportEvent::Kind::kSendComplete) {
          outbound_.onSendComplete(events[i]);
        }
      }
    }
    closed_links_transport_ += l->transport->counters();
  }
  outbound_.forgetPostsOf(link_id);
  outbound_.onLinkDown(*l, reason);
  std::shared_ptr<transport::Transport> transport = std::move(l->transport);
  inbound_.onLinkDown(*l);
  links_.erase(link_id);
  inbound_.retractCreditsOfLink(link_id);
  // Clients that were only waiting for posts on this link may go now.
  std::vector<uint64_t> gone;
  for (auto& [id, c] : clients_.all()) {
    if (c.session->gone) gone.push_back(id);
  }
  for (uint64_t id : gone) {
    if (AgentClient* c = clients_.find(id)) outbound_.maybeForget(*c);
  }
}

void DataAgent::onTransportEvent(AgentLink& l, transport::TransportEvent& ev) {
  if (ev.kind == transport::TransportEvent::Kind::kFrameArrived ||
      ev.kind == transport::TransportEvent::Kind::kControl) {
    ++l.data_received;  // refused or not, it came
    if (l.session.writer) l.session.writer->setDataReceived(l.data_received);
  }
  switch (ev.kind) {
    case transport::TransportEvent::Kind::kSendComplete:
      outbound_.onSendComplete(ev);
      return;
    case transport::TransportEvent::Kind::kFrameArrived:
      inbound_.onFrameArrived(l, ev);
      return;
    case transport::TransportEvent::Kind::kControl:
      onControlRecord(l, ev.control);
      return;
    case transport::TransportEvent::Kind::kReadComplete:
      inbound_.onReadComplete(l, ev);
      return;
    case transport::TransportEvent::Kind::kLinkError:
      if (!l.closing) {
        log_link_closing_.warn("link {} to peer {}: transport {} failed: {}: {}", l.id, l.peer_name,
                               l.transport_name, statusName(ev.status), ev.message);
        l.closing = true;
        if (l.session.cancel) l.session.cancel();
      }
      return;
  }
}

void DataAgent::protocolError(AgentLink& l, const std::string& why) {
  if (l.violated) return;  // said once per link: a peer cannot make it repeat
  l.violated = true;
  const LogScope scope(LogFields{.peer = l.peer_name});
  log_link_closing_.error("link {} to peer {}: protocol error: {}; closing the link", l.id, l.peer_name, why);
  closeLink(l, v1::ERROR_CODE_PROTOCOL, why);
}

void DataAgent::closeLink(AgentLink& l, v1::ErrorCode code, const std::string& why) {
  if (l.closing) return;
  if (code != v1::ERROR_CODE_PROTOCOL) {
    const LogScope scope(LogFields{.peer = l.peer_name});
    log_link_closing_.warn("link {} to peer {}: {}; closing the link", l.id, l.peer_name, why);
  }
  l.closing = true;
  v1::PeerMessage fin;
  fin.mutable_fin()->set_code(code);
  fin.mutable_fin()->set_reason(why);
  // The call ends once the Fin is written, so the peer learns why; one that
  // does not read it is cut at the deadline (cutOverdueSessions).
  if (l.session.writer && l.session.writer->sendLast(std::move(fin))) {
    l.cut_at_ns = clock_.nowNs() + kFinGraceNs;
  } else if (l.session.cancel) {
    l.session.cancel();
  }
}

void DataAgent::checkDataPaths(uint64_t now_ns) {
  if (config_.link_timeout_ms == 0) return;
  const uint64_t limit_ns = uint64_t{config_.link_timeout_ms} * 1'000'000;
  for (auto& [id, l] : links_) {
    if (l.closing || !l.peer_counts_data) continue;
    if (l.unconfirmed_since_ns == 0) {
      // The peer is short of what was handed over: its count must move
      // within limit_ns.
      if (l.data_sent > l.peer_data_received) {
        l.unconfirmed_to = l.data_sent;
        l.unconfirmed_since_ns = now_ns;
      }
      continue;
    }
    if (now_ns - l.unconfirmed_since_ns < limit_ns) continue;
    metrics_.counters.links_stalled.fetch_add(1, std::memory_order_relaxed);
    closeLink(l, v1::ERROR_CODE_TIMEOUT,
              "the peer took " + std::to_string(l.peer_data_received) +
                  " frames and control records off the " + l.transport_name + " transport, short of the " +
                  std::to_string(l.unconfirmed_to) + " handed to it, and took none for " +
                  std::to_string((now_ns - l.unconfirmed_since_ns) / 1'000'000) +
                  " ms (link_timeout_ms): the data path stalled while the Session still carries keepalives");
  }
}

void DataAgent::cutOverdueSessions(uint64_t now_ns) {
  for (auto& [id, l] : links_) {
    if (l.cut_at_ns == 0 || now_ns < l.cut_at_ns) continue;
    l.cut_at_ns = 0;
    const LogScope scope(LogFields{.peer = l.peer_name});
    log_link_closing_.warn("link {} to peer {}: the peer did not read the Fin in {} ms; ending its session",
                           l.id, l.peer_name, kFinGraceNs / 1'000'000);
    if (l.session.cancel) l.session.cancel();
  }
}

}  // namespace framelink
