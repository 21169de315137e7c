#include "data_agent.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "idle_strategy.h"
#include "metrics.h"

namespace framelink {

namespace {

// epoll tags: the top byte says what the low bits name.
constexpr uint64_t kTagCommands = 0;
constexpr uint64_t kTagClient = 1ULL << 56;
constexpr uint64_t kTagLink = 2ULL << 56;

constexpr size_t kMaxSubmitsPerRound = 64;
constexpr size_t kMaxEventsPerRound = 64;
constexpr uint64_t kDeadlineCheckNs = 10'000'000;  // 10 ms
constexpr uint64_t kStatsNs = 500'000'000;         // 0.5 s
constexpr size_t kMaxCreditsPerStream = 65536;     // bound on what a peer may grant us
constexpr size_t kMaxAcksPerMessage = 4096;
constexpr size_t kMaxRefusedRemembered = 4096;
// A frame the receiver refused without delivering it -- its CRC32C was wrong,
// or it landed in a credit withdrawn meanwhile (its consumer went away) -- is
// sent this many more times before it fails with that code (a CRC mismatch is
// then in the producer's slot).
constexpr uint32_t kMaxResends = 3;

bool resendable(int code) { return code == FL_ERR_CRC_MISMATCH || code == FL_ERR_UNKNOWN_CREDIT; }

// A string as the inside of a JSON string literal.
std::string jsonEscape(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (char ch : in) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
    } else {
      out += ch;
    }
  }
  return out;
}

// "FL_ERR_TOO_LARGE" (the code's name, without fl_status_str's description).
std::string statusName(int status) {
  const char* s = fl_status_str(status);
  if (s == nullptr) return std::to_string(status);
  std::string text(s);
  return text.substr(0, text.find(':'));
}

}  // namespace

DataAgent::DataAgent(const Config& config, Metrics& metrics)
    : config_(config), metrics_(metrics), epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagCommands;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, commands_.eventFd(), &ev);
}

DataAgent::~DataAgent() { stop(); }

void DataAgent::start() {
  running_ = true;
  thread_ = std::thread([this] { run(); });
}

void DataAgent::stop() {
  if (!thread_.joinable()) return;
  post(CmdStop{});
  thread_.join();
}

uint64_t DataAgent::nowNs() const {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec);
}

ClientSession* DataAgent::client(uint64_t id) {
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : it->second.get();
}

DataAgent::Link* DataAgent::link(uint64_t id) {
  auto it = links_.find(id);
  return it == links_.end() ? nullptr : &it->second;
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
    work += doWork();
    // After a sleep that brought no work, sleep again at once: only work
    // re-arms the spin phase.
    if (idle.idle(work, nowNs())) sleep();
  }
  // Shutdown: every frame still in progress ends FAILED(shutdown), also
  // those still in a ring and those of a client attached at the last moment.
  shutting_down_ = true;
  drainCommands();
  pollClients();
  for (auto& [id, c] : clients_) {
    if (c->role == FL_ROLE_PRODUCER) {
      for (uint32_t s = 0; s < c->slots.size(); ++s) {
        if (c->slots[s].state != SlotState::kFree)
          finishFrame(*c, s, FL_ERR_SHUTDOWN, "the daemon is shutting down");
      }
    }
    // After the last completion: from here the client fails whatever it
    // still has in flight itself.
    __atomic_store_n(&c->segments->header()->daemon_state, uint32_t{FL_DAEMON_DETACHED}, __ATOMIC_RELEASE);
  }
  for (auto& [id, l] : links_) {
    v1::PeerMessage fin;
    fin.mutable_fin()->set_code(v1::ERROR_CODE_SHUTDOWN);
    fin.mutable_fin()->set_reason("daemon shutting down");
    if (l.session.writer) l.session.writer->send(std::move(fin));
    if (l.transport) l.transport->shutdown();
  }
}

size_t DataAgent::doWork() {
  size_t work = 0;
  work += pollClients();
  work += pollLinks();
  flushControl();
  work += pumpAll();
  uint64_t now = nowNs();
  if (now >= next_deadline_check_ns_) {
    checkDeadlines();
    next_deadline_check_ns_ = now + kDeadlineCheckNs;
  }
  if (now >= next_stats_ns_) {
    publishStats();
    next_stats_ns_ = now + kStatsNs;
  }
  return work;
}

bool DataAgent::runUntilIdle(size_t max_rounds) {
  for (size_t i = 0; i < max_rounds; ++i) {
    size_t work = drainCommands();
    work += doWork();
    if (work == 0) return true;
  }
  return false;
}

void DataAgent::sleep() {
  // Announce sleep on every submit ring, then re-check: a client that
  // pushed meanwhile sees the flag and rings the doorbell, or we see its entry.
  bool ready = false;
  for (auto& [id, c] : clients_) {
    if (c->gone) continue;
    if (!fl_ring_prepare_sleep(c->segments->submitRing())) ready = true;
  }
  if (!ready) {
    epoll_event events[32];
    // Bounded so that credit and ACK deadlines are noticed.
    int timeout_ms = 50;
    ::epoll_wait(epoll_fd_.get(), events, 32, timeout_ms);
  }
  for (auto& [id, c] : clients_) {
    if (c->gone) continue;
    fl_ring_end_sleep(c->segments->submitRing());
    drainDoorbell(c->submit_doorbell.get());
  }
}

size_t DataAgent::drainCommands() {
  std::deque<AgentCommand> batch;
  size_t n = commands_.drain(batch);
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
            if (Link* l = link(cmd.link_id)) onPeerMessage(*l, *cmd.message);
          } else if constexpr (std::is_same_v<T, CmdStop>) {
            running_ = false;
          }
        },
        command);
  }
  return n;
}

// ---------------------------------------------------------------- clients

void DataAgent::onClientAttached(std::shared_ptr<ClientSession> c) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagClient | c->id;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, c->submit_doorbell.get(), &ev);
  metrics_.counters.clients_attached.fetch_add(1, std::memory_order_relaxed);
  if (c->role == FL_ROLE_PRODUCER) headers_[c->id].resize(c->slots.size());
  std::string stream = c->stream;
  uint32_t role = c->role;
  uint64_t id = c->id;
  clients_.emplace(id, std::move(c));
  if (role == FL_ROLE_CONSUMER) {
    grantCredits(stream);
  } else {
    std::string peer = config_.routeFor(stream);
    if (!peer.empty()) {
      Peer& p = peers_[peer];
      p.name = peer;
      outStream(p, stream);  // announces it when the link is up
    }
  }
}

void DataAgent::detachClient(ClientSession& c, int status, const std::string& why) {
  if (c.gone) return;
  log_detached_.error("client {} (pid {}, stream '{}'): {}: {}; detaching it", c.id, c.pid, c.stream,
                      statusName(status), why);
  __atomic_store_n(&c.segments->header()->daemon_state, uint32_t{FL_DAEMON_DETACHED}, __ATOMIC_RELEASE);
  // The attach thread sees the shutdown as a hang-up and reports CmdClientGone.
  ::shutdown(c.socket.get(), SHUT_RDWR);
  c.gone = true;
}

void DataAgent::onClientGone(uint64_t client_id) {
  ClientSession* c = client(client_id);
  if (c == nullptr) return;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c->submit_doorbell.get(), nullptr);
  if (!c->gone) {
    // What the client put in its ring before it went away still counts: a
    // consumer's last releases (so their frames are ACKed, not failed) and a
    // producer's last submits (which are still sent).
    fl_ring_header* ring = c->segments->submitRing();
    fl_submit_desc desc;
    while (!c->gone && fl_ring_pop(ring, c->ring_capacity, sizeof(desc), &desc) == FL_RING_OK) {
      if (c->role == FL_ROLE_PRODUCER) {
        onSubmit(*c, desc);
      } else {
        onRelease(*c, desc);
      }
    }
  }
  c->gone = true;
  metrics_.counters.clients_detached.fetch_add(1, std::memory_order_relaxed);
  log_detached_.info("client {} detached (pid {}, stream '{}', {} frames, {} bytes)", c->id, c->pid,
                     c->stream, c->frames, c->bytes);
  if (c->role == FL_ROLE_CONSUMER) {
    std::map<std::pair<uint64_t, uint64_t>, v1::PeerMessage> revokes;
    for (uint32_t s = 0; s < c->slots.size(); ++s) {
      SlotEntry& e = c->slots[s];
      if (e.state == SlotState::kCredited) {
        auto it = credits_.find(e.credit_id);
        if (it != credits_.end()) {
          if (Link* l = link(it->second.link_id)) {
            if (l->transport) l->transport->retractCredit(e.credit_id);
            auto& msg = revokes[{l->id, it->second.stream_id}];
            msg.mutable_credit_revoke()->set_stream_id(it->second.stream_id);
            msg.mutable_credit_revoke()->add_credit_ids(e.credit_id);
          }
          credits_.erase(it);
        }
      } else if (e.state == SlotState::kDelivered) {
        // Not held any more; a replay of it (the NACK may be lost with the
        // link) gets the same refusal instead of waiting for a release.
        auto ist = in_states_.find(e.in_state);
        if (ist != in_states_.end()) {
          ist->second.held.erase(e.sequence);
          ist->second.refused[e.sequence] = FL_ERR_NO_CONSUMER;
        }
        if (Link* l = link(e.peer_key)) {
          sendNack(*l, e.stream_id, e.sequence, FL_ERR_NO_CONSUMER,
                   "the consumer died before releasing the frame");
        }
      }
      e = SlotEntry{};
    }
    for (auto& [key, msg] : revokes) {
      if (Link* l = link(key.first)) l->session.writer->send(std::move(msg));
    }
  }
  maybeForget(*c);
}

void DataAgent::maybeForget(ClientSession& c) {
  // A producer that went away stays until each frame it submitted has ended
  // (delivered, or failed by a NACK, the link or a deadline): the frames are
  // still sent, and a transport may still be reading its slots.  Nobody
  // reads the completions any more; the counters still count them.
  if (!c.gone) return;
  if (c.role == FL_ROLE_PRODUCER && c.in_progress > 0) return;
  uint64_t id = c.id;
  const bool producer = c.role == FL_ROLE_PRODUCER;
  std::string stream = c.stream;
  headers_.erase(id);
  clients_.erase(id);  // c is gone now
  if (producer) maybeForgetStream(stream);
}

void DataAgent::maybeForgetStream(const std::string& name) {
  for (const auto& [id, c] : clients_) {
    if (c->role == FL_ROLE_PRODUCER && c->stream == name) return;  // attached, or gone with frames in flight
  }
  auto pit = peers_.find(config_.routeFor(name));
  if (pit == peers_.end()) return;
  Peer& p = pit->second;
  auto nit = p.out_by_name.find(name);
  if (nit == p.out_by_name.end()) return;
  auto sit = p.out_streams.find(nit->second);
  if (sit != p.out_streams.end()) {
    const OutStream& s = sit->second;
    if (!s.pending.empty() || !s.unacked.empty()) return;
    metrics_.counters.streams_forgotten.fetch_add(1, std::memory_order_relaxed);  // counted before it is said
    if (Link* l = link(p.link_id); l != nullptr && s.announced) {
      v1::PeerMessage msg;
      msg.mutable_stream_close()->set_stream_id(s.id);
      l->session.writer->send(std::move(msg));
    }
    p.out_streams.erase(sit);
  }
  p.out_by_name.erase(nit);
}

size_t DataAgent::pollClients() {
  size_t work = 0;
  // Iterate over a snapshot of ids: handlers may detach clients.
  std::vector<uint64_t> ids;
  ids.reserve(clients_.size());
  for (auto& [id, c] : clients_) {
    if (!c->gone) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    ClientSession* c = client(id);
    if (c == nullptr || c->gone) continue;
    fl_ring_header* ring = c->segments->submitRing();
    for (size_t i = 0; i < kMaxSubmitsPerRound; ++i) {
      fl_submit_desc desc;  // private copy: validated before use
      fl_ring_result r = fl_ring_pop(ring, c->ring_capacity, sizeof(desc), &desc);
      if (r == FL_RING_EMPTY) break;
      if (r == FL_RING_CORRUPT) {
        metrics_.counters.bad_descriptors.fetch_add(1, std::memory_order_relaxed);
        detachClient(*c, FL_ERR_RING_CORRUPT,
                     "its submit ring indices are corrupt (tail beyond head + capacity)");
        break;
      }
      ++work;
      if (c->role == FL_ROLE_PRODUCER) {
        onSubmit(*c, desc);
      } else {
        onRelease(*c, desc);
      }
      if (c->gone) break;
    }
  }
  return work;
}

// ---------------------------------------------------------------- producer

DataAgent::OutStream& DataAgent::outStream(Peer& p, const std::string& name) {
  auto it = p.out_by_name.find(name);
  if (it != p.out_by_name.end()) return p.out_streams[it->second];
  uint64_t id = next_stream_id_++;
  OutStream& s = p.out_streams[id];
  s.id = id;
  s.name = name;
  p.out_by_name[name] = id;
  if (Link* l = link(p.link_id)) {
    v1::PeerMessage msg;
    msg.mutable_stream_open()->set_stream_id(id);
    msg.mutable_stream_open()->set_name(name);
    l->session.writer->send(std::move(msg));
    s.announced = true;
  }
  return s;
}

void DataAgent::onSubmit(ClientSession& c, const fl_submit_desc& desc) {
  auto reject = [&](uint32_t slot, int status, const std::string& why) {
    metrics_.counters.bad_descriptors.fetch_add(1, std::memory_order_relaxed);
    metrics_.counters.frames_failed.fetch_add(1, std::memory_order_relaxed);
    metrics_.recordFailure(status);
    ++c.errors;
    log_client_errors_.warn("client {} stream '{}' slot {}: {}: {}", c.id, c.stream, slot, statusName(status),
                            why);
    if (!c.complete(slot, status, 0, desc.length, 0)) {
      detachClient(c, FL_ERR_RING_CORRUPT, "its completion ring is full or corrupt");
    }
  };
  if (shutting_down_ && desc.slot < c.slots.size() && c.slots[desc.slot].state == SlotState::kFree) {
    metrics_.counters.frames_failed.fetch_add(1, std::memory_order_relaxed);
    metrics_.recordFailure(FL_ERR_SHUTDOWN);
    // frame_id is only echoed back to the client, so reading it unvalidated is harmless.
    uint64_t frame_id = c.segments->slotHeader(desc.slot)->frame_id;
    if (!c.complete(desc.slot, FL_ERR_SHUTDOWN, 0, desc.length, frame_id)) {
      detachClient(c, FL_ERR_RING_CORRUPT, "its completion ring is full or corrupt");
    }
    return;
  }
  if (desc.slot >= c.slots.size()) {
    reject(desc.slot, FL_ERR_BAD_SLOT,
           "slot index out of range (the client has " + std::to_string(c.slots.size()) + " slots)");
    return;
  }
  SlotEntry& e = c.slots[desc.slot];
  if (desc.flags != 0) {
    reject(desc.slot, FL_ERR_BAD_DESCRIPTOR, "reserved descriptor flags are set");
    return;
  }
  if (e.state != SlotState::kFree) {
    reject(desc.slot, FL_ERR_SLOT_NOT_OWNED,
           std::string("the slot is already in flight (") + slotStateName(e.state) + "), submitted twice?");
    return;
  }
  if (desc.length > c.segments->slotSize()) {
    reject(desc.slot, FL_ERR_TOO_LARGE,
           "length " + std::to_string(desc.length) + " exceeds the slot size " +
               std::to_string(c.segments->slotSize()));
    return;
  }
  fl_slot_header sh;
  std::memcpy(&sh, c.segments->slotHeader(desc.slot), sizeof(sh));  // private copy
  if (sh.attr_length > FL_MAX_ATTR_BYTES || (sh.flags & ~uint32_t{FL_SLOT_HAS_CRC32C}) != 0) {
    reject(desc.slot, FL_ERR_BAD_METADATA,
           "slot header invalid (attr_length " + std::to_string(sh.attr_length) + " > " +
               std::to_string(FL_MAX_ATTR_BYTES) + " or unknown flags)");
    return;
  }
  std::string peer_name = config_.routeFor(c.stream);
  if (peer_name.empty()) {
    reject(desc.slot, FL_ERR_NO_ROUTE,
           "no peer is configured for stream '" + c.stream + "' (add --peer / --route)");
    return;
  }
  Peer& p = peers_[peer_name];
  p.name = peer_name;
  OutStream& s = outStream(p, c.stream);

  transport::FrameHeader& h = headers_[c.id][desc.slot];
  h = transport::FrameHeader{};
  h.stream_id = s.id;
  h.sequence = s.next_sequence++;
  h.frame_id = sh.frame_id;
  h.wafer_id = sh.wafer_id;
  h.timestamp_ns = sh.timestamp_ns;
  h.length = desc.length;
  h.has_crc32c = (sh.flags & FL_SLOT_HAS_CRC32C) ? 1 : 0;
  h.crc32c = sh.crc32c;
  h.attr_length = sh.attr_length;
  std::memcpy(h.attrs, sh.attrs, sh.attr_length);

  uint64_t now = nowNs();
  e = SlotEntry{};
  e.state = SlotState::kPending;
  e.sequence = h.sequence;
  e.length = desc.length;
  e.frame_id = sh.frame_id;
  e.stream_id = s.id;
  e.submitted_ns = now;
  e.deadline_ns = now + uint64_t{config_.credit_timeout_ms} * 1'000'000ULL;
  ++c.in_progress;
  metrics_.counters.frames_submitted.fetch_add(1, std::memory_order_relaxed);
  s.pending.emplace(h.sequence, FrameRef{c.id, desc.slot});
  pump(p, s);
}

size_t DataAgent::pump(Peer& p, OutStream& s) {
  Link* l = link(p.link_id);
  if (l == nullptr || l->closing || !l->transport) return 0;
  size_t posted = 0;
  size_t work = 0;
  struct FlushAtEnd {
    transport::Transport* t;
    const size_t& n;
    ~FlushAtEnd() {
      if (n > 0) t->flush();
    }
  } flush_at_end{l->transport.get(), posted};
  while (!s.pending.empty() && !s.credits.empty()) {
    auto first = s.pending.begin();
    const uint64_t sequence = first->first;
    FrameRef f = first->second;
    ClientSession* c = client(f.client_id);
    if (c == nullptr || c->slots[f.slot].state != SlotState::kPending ||
        c->slots[f.slot].sequence != sequence) {
      s.pending.erase(first);
      ++work;
      continue;
    }
    SlotEntry& e = c->slots[f.slot];
    // The oldest credit the frame fits: consumers of one stream may have
    // slots of different sizes, and a small one must not block a frame that
    // a larger one can take.
    auto fit = std::find_if(s.credits.begin(), s.credits.end(),
                            [&](const transport::RemoteCredit& cr) { return cr.length >= e.length; });
    if (fit == s.credits.end()) {
      if (e.length <= s.largest_credit) break;  // a consumer with such slots exists: wait for its credit
      s.pending.erase(first);
      ++work;
      finishFrame(*c, f.slot, FL_ERR_TOO_LARGE,
                  "frame of " + std::to_string(e.length) +
                      " bytes does not fit any consumer's slots on peer " + p.name + " (the largest are " +
                      std::to_string(s.largest_credit) +
                      " bytes; attach a consumer with a larger slot size)");
      continue;
    }
    const transport::RemoteCredit credit = *fit;
    // The receiving daemon restarted since this frame was last sent: the one
    // before may have delivered it, and the new one cannot know.
    if (e.sent_to_instance != 0 && e.sent_to_instance != l->peer_instance && !e.maybe_redelivered) {
      e.maybe_redelivered = true;
      metrics_.counters.frames_maybe_redelivered.fetch_add(1, std::memory_order_relaxed);
    }
    transport::SendRequest req;
    req.cookie = next_cookie_++;
    req.header = headers_[c->id][f.slot];
    req.header.credit_id = credit.credit_id;
    req.header.maybe_redelivered = e.maybe_redelivered ? 1 : 0;
    req.payload = c->segments->slot(f.slot);
    req.credit = credit;
    transport::PostResult r = l->transport->post(req);
    if (r == transport::PostResult::kBackpressure || r == transport::PostResult::kNotConnected) {
      return work + 1;  // the transport takes it later: still work
    }
    s.pending.erase(first);
    s.credits.erase(fit);
    ++work;
    if (r == transport::PostResult::kInvalid) {
      finishFrame(*c, f.slot, FL_ERR_TRANSPORT, "the transport refused the frame");
      continue;
    }
    e.state = SlotState::kPosted;
    e.credit_id = req.cookie;  // producer side: the cookie of the post
    e.peer_key = l->id;
    e.sent_to_instance = l->peer_instance;
    e.was_posted = true;
    s.unacked[e.sequence] = f;
    posted_[req.cookie] = Posted{f, p.name, s.id, e.sequence};
    ++l->frames_out;
    ++posted;
  }
  return work;
}

size_t DataAgent::pumpAll() {
  size_t work = 0;
  for (auto& [name, p] : peers_) {
    // A link that is closing takes no posts until it is down: frames and
    // credits waiting for it are no work (counting them would spin the agent).
    const Link* l = link(p.link_id);
    if (l == nullptr || l->closing || !l->transport) continue;
    for (auto& [id, s] : p.out_streams) {
      // Frames waiting for a credit they fit are no work either.
      if (!s.pending.empty() && !s.credits.empty()) work += pump(p, s);
    }
  }
  return work;
}

void DataAgent::finishFrame(ClientSession& c, uint32_t slot, int status, const std::string& why) {
  SlotEntry& e = c.slots[slot];
  if (e.state == SlotState::kFree) return;
  if (e.state == SlotState::kPosted) posted_.erase(e.credit_id);
  if (status == FL_OK) {
    metrics_.counters.frames_delivered.fetch_add(1, std::memory_order_relaxed);
    metrics_.counters.bytes_sent.fetch_add(e.length, std::memory_order_relaxed);
    metrics_.recordDeliveryLatency((nowNs() - e.submitted_ns) / 1000);
    ++c.frames;
    c.bytes += e.length;
  } else {
    metrics_.counters.frames_failed.fetch_add(1, std::memory_order_relaxed);
    metrics_.recordFailure(status);
    ++c.errors;
    log_failed_.warn("[client {} stream '{}' seq {} frame {}] FAILED {}: {}", c.id, c.stream, e.sequence,
                     e.frame_id, statusName(status), why);
  }
  uint64_t sequence = e.sequence;
  uint64_t length = e.length;
  uint64_t frame_id = e.frame_id;
  e = SlotEntry{};
  if (c.in_progress > 0) --c.in_progress;
  if (!c.complete(slot, status, sequence, length, frame_id)) {
    detachClient(c, FL_ERR_RING_CORRUPT, "its completion ring is full or corrupt");
  }
}

void DataAgent::onAck(Peer& p, uint64_t stream_id, uint64_t sequence, int status, const std::string& why) {
  auto sit = p.out_streams.find(stream_id);
  if (sit == p.out_streams.end()) {
    spdlog::debug("peer {}: ACK for unknown stream {} seq {} ignored", p.name, stream_id, sequence);
    return;
  }
  OutStream& s = sit->second;
  auto it = s.unacked.find(sequence);
  if (it == s.unacked.end()) {
    // A frame waiting to be replayed (its link broke before the ACK came) is
    // settled by the ACK its receiver sends again on the new link: it needs
    // no credit for that, and must not fail for the want of one.
    auto pit = s.pending.find(sequence);
    if (status == FL_OK && pit != s.pending.end()) {
      FrameRef f = pit->second;
      ClientSession* c = client(f.client_id);
      if (c != nullptr && c->slots[f.slot].state == SlotState::kPending &&
          c->slots[f.slot].sequence == sequence && c->slots[f.slot].was_posted) {
        s.pending.erase(pit);
        metrics_.counters.acks_for_replays.fetch_add(1, std::memory_order_relaxed);
        finishFrame(*c, f.slot, FL_OK, "");
        maybeForget(*c);
        return;
      }
    }
    spdlog::debug("peer {} stream '{}': ACK for seq {} that is not outstanding (late or duplicate)", p.name,
                  s.name, sequence);
    return;
  }
  FrameRef f = it->second;
  s.unacked.erase(it);
  ClientSession* c = client(f.client_id);
  if (c == nullptr) return;
  SlotEntry& e = c->slots[f.slot];
  if (resendable(status) && e.resends < kMaxResends && !shutting_down_ &&
      (e.state == SlotState::kPosted || e.state == SlotState::kSent)) {
    // Not delivered (damaged on the way, or its credit was withdrawn): the
    // payload is still in the producer's slot, so send it again, ahead of
    // the frames that never left.
    ++e.resends;
    if (e.state == SlotState::kPosted) posted_.erase(e.credit_id);
    e.state = SlotState::kPending;
    e.credit_id = 0;
    e.peer_key = 0;
    e.deadline_ns = nowNs() + uint64_t{config_.credit_timeout_ms} * 1'000'000ULL;
    s.pending.emplace(e.sequence, f);
    (status == FL_ERR_CRC_MISMATCH ? metrics_.counters.frames_resent_crc
                                   : metrics_.counters.frames_resent_credit)
        .fetch_add(1, std::memory_order_relaxed);
    log_resent_.warn("[client {} stream '{}' seq {} frame {}] {}; sending it again (attempt {} of {})", c->id,
                     c->stream, e.sequence, e.frame_id, why, e.resends + 1, kMaxResends + 1);
    return;
  }
  finishFrame(*c, f.slot, status, why);
  maybeForget(*c);
}

// ---------------------------------------------------------------- consumer

void DataAgent::onRelease(ClientSession& c, const fl_submit_desc& desc) {
  auto reject = [&](int status, const std::string& why) {
    metrics_.counters.bad_descriptors.fetch_add(1, std::memory_order_relaxed);
    ++c.errors;
    log_client_errors_.warn("client {} stream '{}': release of slot {} rejected: {}: {}", c.id, c.stream,
                            desc.slot, statusName(status), why);
    if (!c.complete(desc.slot, status, 0, 0, 0)) {
      detachClient(c, FL_ERR_RING_CORRUPT, "its completion ring is full or corrupt");
    }
  };
  if (desc.slot >= c.slots.size()) {
    reject(FL_ERR_BAD_SLOT,
           "slot index out of range (the client has " + std::to_string(c.slots.size()) + " slots)");
    return;
  }
  if (desc.flags != 0) {
    reject(FL_ERR_BAD_DESCRIPTOR, "reserved descriptor flags are set");
    return;
  }
  SlotEntry& e = c.slots[desc.slot];
  if (e.state != SlotState::kDelivered) {
    reject(FL_ERR_DOUBLE_RELEASE,
           std::string("the slot holds no delivered frame (it is ") + slotStateName(e.state) + ")");
    return;
  }
  metrics_.counters.frames_released.fetch_add(1, std::memory_order_relaxed);
  auto ist = in_states_.find(e.in_state);
  if (ist != in_states_.end()) {
    InState& in = ist->second;
    in.held.erase(e.sequence);
    in.released.push_back(e.sequence);
    if (in.released.size() > kMaxRefusedRemembered) in.released.pop_front();
    // The ACK goes over the sender's current link, which need not be the
    // one the frame came over.  With no link up it is not sent: the sender
    // replays the frame on its next link and gets the ACK then.
    const Link* target = nullptr;
    for (const auto& [id, l] : links_) {
      if (!l.closing && l.transport && l.peer == in.peer && l.peer_instance == in.instance) {
        target = &l;
        break;
      }
    }
    if (target != nullptr) {
      // Sent at the end of this round, together with the other releases.
      pending_acks_[{target->id, in.stream_id}].push_back(e.sequence);
    } else {
      spdlog::debug("client {}: released seq {} while no link to peer {} is up; ACK follows its replay", c.id,
                    e.sequence, in.peer);
    }
  }
  e = SlotEntry{};
  dirty_grants_.insert(c.stream);
}

void DataAgent::flushControl() {
  for (auto& [key, sequences] : pending_acks_) {
    Link* l = link(key.first);
    if (l == nullptr) continue;
    for (size_t i = 0; i < sequences.size(); i += kMaxAcksPerMessage) {
      v1::PeerMessage msg;
      auto* ack = msg.mutable_ack();
      ack->set_stream_id(key.second);
      size_t end = std::min(sequences.size(), i + kMaxAcksPerMessage);
      for (size_t k = i; k < end; ++k) ack->add_sequences(sequences[k]);
      l->session.writer->send(std::move(msg));
    }
  }
  pending_acks_.clear();
  for (const auto& name : dirty_grants_) grantCredits(name);
  dirty_grants_.clear();
}

void DataAgent::grantCredits(const std::string& name) {
  // Where can credits go: every up link with an open in-stream of this name.
  std::vector<std::pair<uint64_t, uint64_t>> targets;  // (link, stream id)
  for (auto& [id, l] : links_) {
    if (l.closing || !l.transport) continue;
    for (auto& [sid, in] : l.in_streams) {
      if (in.name == name) targets.emplace_back(id, sid);
    }
  }
  if (targets.empty()) return;
  std::map<std::pair<uint64_t, uint64_t>, v1::PeerMessage> grants;
  for (auto& [cid, c] : clients_) {
    if (c->gone || c->role != FL_ROLE_CONSUMER || c->stream != name) continue;
    for (uint32_t s = 0; s < c->slots.size(); ++s) {
      SlotEntry& e = c->slots[s];
      if (e.state != SlotState::kFree) continue;
      auto target = targets[grant_cursor_++ % targets.size()];
      Link& l = links_[target.first];
      transport::LocalCredit local;
      local.credit_id = next_credit_id_++;
      local.buffer = c->segments->slot(s);
      local.capacity = c->segments->slotSize();
      local.keepalive = c->segments;
      auto remote = l.transport->exposeCredit(std::move(local));
      if (!remote) {
        spdlog::error("link {} (peer {}): cannot expose a receive slot: {}", l.id, l.peer,
                      remote.error().message);
        return;
      }
      credits_[remote->credit_id] = CreditEntry{cid, s, l.id, target.second};
      e.state = SlotState::kCredited;
      e.credit_id = remote->credit_id;
      e.peer_key = l.id;
      e.stream_id = target.second;
      auto& msg = grants[target];
      auto* grant = msg.mutable_credit_grant();
      grant->set_stream_id(target.second);
      auto* credit = grant->add_credits();
      credit->set_credit_id(remote->credit_id);
      credit->set_length(remote->length);
      credit->set_remote_addr(remote->remote_addr);
      credit->set_rkey(remote->rkey);
      metrics_.counters.credits_granted.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (auto& [target, msg] : grants) {
    if (Link* l = link(target.first)) l->session.writer->send(std::move(msg));
  }
}

void DataAgent::sendNack(Link& l, uint64_t stream_id, uint64_t sequence, int code,
                         const std::string& message) {
  metrics_.counters.nacks_sent.fetch_add(1, std::memory_order_relaxed);
  log_refused_.warn("[peer {} stream {} seq {}] refusing frame: {}: {}", l.peer, stream_id, sequence,
                    statusName(code), message);
  if (resendable(code) && l.in_streams.count(stream_id) != 0) {
    // Not delivered (damaged in transit, or its credit was withdrawn): the
    // sender sends it again, and that copy is not a duplicate even when
    // later frames arrived meanwhile.
    InState& in = in_states_[inStateId(l, stream_id)];
    in.resend.insert(sequence);
    if (in.resend.size() > kMaxRefusedRemembered) in.resend.erase(in.resend.begin());
  } else if (l.in_streams.count(stream_id) != 0) {
    // Remembered so that a replay of this frame gets the same answer.
    InState& in = in_states_[inStateId(l, stream_id)];
    in.refused[sequence] = code;
    if (in.refused.size() > kMaxRefusedRemembered) in.refused.erase(in.refused.begin());
    in.highest = std::max(in.highest, sequence);
  }
  v1::PeerMessage msg;
  auto* nack = msg.mutable_nack();
  nack->set_stream_id(stream_id);
  nack->set_sequence(sequence);
  nack->set_code(static_cast<v1::ErrorCode>(code));
  nack->set_message(message);
  l.session.writer->send(std::move(msg));
}

void DataAgent::onFrameArrived(Link& l, transport::TransportEvent& ev) {
  const transport::FrameHeader& h = ev.header;
  ++l.frames_in;
  if (ev.status != FL_OK) {
    sendNack(l, h.stream_id, h.sequence, ev.status,
             ev.message.empty() ? "frame for an unknown credit" : ev.message);
    auto it = credits_.find(h.credit_id);
    if (it != credits_.end() && it->second.link_id == l.id) credits_.erase(it);
    return;
  }
  auto it = credits_.find(h.credit_id);
  if (it == credits_.end() || it->second.link_id != l.id) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
             "credit " + std::to_string(h.credit_id) + " was not granted to this link");
    return;
  }
  CreditEntry credit = it->second;
  credits_.erase(it);
  ClientSession* c = client(credit.client_id);
  if (c == nullptr || c->gone) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
             "its receive slot was withdrawn: the consumer detached");
    return;
  }
  SlotEntry& e = c->slots[credit.slot];
  auto regrant = [&] {
    e = SlotEntry{};
    grantCredits(c->stream);
  };
  if (h.stream_id != credit.stream_id || l.in_streams.count(h.stream_id) == 0) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_STREAM,
             "frame names stream " + std::to_string(h.stream_id) + " but the credit belongs to stream " +
                 std::to_string(credit.stream_id));
    regrant();
    return;
  }
  if (h.length > c->segments->slotSize() || h.attr_length > FL_MAX_ATTR_BYTES) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_PROTOCOL, "frame header out of bounds");
    regrant();
    return;
  }
  if (dropDuplicate(l, h)) {
    regrant();
    return;
  }
  uint8_t* payload = c->segments->slot(credit.slot);
  if (h.has_crc32c) {
    uint32_t crc = fl_crc32c(0, payload, h.length);
    if (crc != h.crc32c) {
      sendNack(l, h.stream_id, h.sequence, FL_ERR_CRC_MISMATCH,
               "payload CRC32C mismatch (expected " + std::to_string(h.crc32c) + ", got " +
                   std::to_string(crc) + ")");
      regrant();
      return;
    }
  }
  fl_slot_header* sh = c->segments->slotHeader(credit.slot);
  sh->frame_id = h.frame_id;
  sh->wafer_id = h.wafer_id;
  sh->timestamp_ns = h.timestamp_ns;
  sh->length = h.length;
  sh->sequence = h.sequence;
  sh->crc32c = h.crc32c;
  sh->flags = (h.has_crc32c ? uint32_t{FL_SLOT_HAS_CRC32C} : 0u) |
              (h.maybe_redelivered ? uint32_t{FL_SLOT_MAYBE_REDELIVERED} : 0u);
  sh->attr_length = h.attr_length;
  std::memcpy(sh->attrs, h.attrs, h.attr_length);
  uint64_t in_state = inStateId(l, h.stream_id);
  InState& in = in_states_[in_state];
  in.highest = std::max(in.highest, h.sequence);
  in.held.insert(h.sequence);
  e.state = SlotState::kDelivered;
  e.sequence = h.sequence;
  e.length = h.length;
  e.frame_id = h.frame_id;
  e.peer_key = l.id;
  e.stream_id = h.stream_id;
  e.in_state = in_state;
  ++c->frames;
  c->bytes += h.length;
  metrics_.counters.frames_received.fetch_add(1, std::memory_order_relaxed);
  metrics_.counters.bytes_received.fetch_add(h.length, std::memory_order_relaxed);
  // Release ordering of the ring publishes the slot header and payload.
  if (!c->complete(credit.slot, FL_OK, h.sequence, h.length, h.frame_id)) {
    detachClient(*c, FL_ERR_RING_CORRUPT, "its completion ring is full or corrupt");
  }
}

uint64_t DataAgent::inStateId(const Link& l, uint64_t stream_id) {
  auto key = std::make_tuple(l.peer, l.peer_instance, stream_id);
  auto it = in_state_ids_.find(key);
  if (it != in_state_ids_.end()) return it->second;
  uint64_t id = next_in_state_id_++;
  in_state_ids_.emplace(key, id);
  InState& in = in_states_[id];
  in.peer = l.peer;
  in.instance = l.peer_instance;
  in.stream_id = stream_id;
  return id;
}

bool DataAgent::dropDuplicate(Link& l, const transport::FrameHeader& h) {
  InState& in = in_states_[inStateId(l, h.stream_id)];
  if (in.resend.erase(h.sequence) != 0) return false;  // the copy asked for after a CRC mismatch
  if (h.sequence > in.highest) return false;
  metrics_.counters.duplicates_dropped.fetch_add(1, std::memory_order_relaxed);
  if (in.held.count(h.sequence) != 0) {
    spdlog::debug("[peer {} stream {} seq {}] replay of a frame the consumer still holds: dropped", l.peer,
                  h.stream_id, h.sequence);
    return true;
  }
  auto refused = in.refused.find(h.sequence);
  if (refused != in.refused.end()) {
    sendNack(l, h.stream_id, h.sequence, refused->second, "refused before the link broke");
    return true;
  }
  // Delivered and released before: the first ACK was lost with the old link.
  spdlog::debug("[peer {} stream {} seq {}] replay of a delivered frame: dropped, ACK sent again", l.peer,
                h.stream_id, h.sequence);
  pending_acks_[{l.id, h.stream_id}].push_back(h.sequence);
  return true;
}

void DataAgent::requeueUnacked(uint64_t link_id, const std::string& reason) {
  uint64_t deadline = nowNs() + uint64_t{config_.credit_timeout_ms} * 1'000'000ULL;
  for (auto& [name, p] : peers_) {
    for (auto& [id, s] : p.out_streams) {
      std::vector<std::pair<uint64_t, FrameRef>> replay;
      for (auto it = s.unacked.begin(); it != s.unacked.end();) {
        ClientSession* c = client(it->second.client_id);
        if (c == nullptr) {
          it = s.unacked.erase(it);
          continue;
        }
        SlotEntry& e = c->slots[it->second.slot];
        if (e.peer_key != link_id || (e.state != SlotState::kPosted && e.state != SlotState::kSent)) {
          ++it;
          continue;
        }
        if (e.state == SlotState::kPosted) posted_.erase(e.credit_id);
        e.state = SlotState::kPending;
        e.credit_id = 0;
        e.peer_key = 0;
        e.deadline_ns = deadline;  // FAILED(LINK_LOST) when no link takes it in time
        replay.emplace_back(it->first, it->second);
        it = s.unacked.erase(it);
      }
      if (replay.empty()) continue;
      // In sequence order with the frames that never left (and those a NACK
      // sent back): the next link carries the stream in order.
      std::sort(replay.begin(), replay.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [sequence, frame] : replay) s.pending.emplace(sequence, frame);
      metrics_.counters.frames_replayed.fetch_add(replay.size(), std::memory_order_relaxed);
      spdlog::info(
          "peer {} stream '{}': {} unacknowledged frames (seq {}..{}) will be sent again on the next "
          "link ({})",
          p.name, s.name, replay.size(), replay.front().first, replay.back().first, reason);
    }
  }
}

void DataAgent::resendReleasedAcks(Link& l) {
  for (const auto& [id, in] : in_states_) {
    if (in.peer != l.peer || in.instance != l.peer_instance || in.released.empty()) continue;
    auto& acks = pending_acks_[{l.id, in.stream_id}];
    acks.insert(acks.end(), in.released.begin(), in.released.end());
  }
}

void DataAgent::retractCreditsOfLink(uint64_t link_id) {
  std::vector<std::string> names;
  for (auto it = credits_.begin(); it != credits_.end();) {
    if (it->second.link_id != link_id) {
      ++it;
      continue;
    }
    if (ClientSession* c = client(it->second.client_id)) {
      SlotEntry& e = c->slots[it->second.slot];
      if (e.state == SlotState::kCredited) e = SlotEntry{};
      names.push_back(c->stream);
    }
    it = credits_.erase(it);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (auto& n : names) grantCredits(n);
}

// ---------------------------------------------------------------- links

void DataAgent::onLinkUp(CmdLinkUp& cmd) {
  Link& l = links_[cmd.link_id];
  l.id = cmd.link_id;
  l.peer = cmd.peer;
  l.peer_instance = cmd.peer_instance;
  l.transport_name = cmd.transport_name;
  l.transport_reason = cmd.transport_reason;
  l.transport = std::move(cmd.transport);
  l.session = std::move(cmd.session);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagLink | l.id;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, l.transport->eventFd(), &ev);
  metrics_.counters.links_up.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("link {} to peer {} is up over {}{}", l.id, l.peer, l.transport_name,
               l.transport_reason.empty() ? "" : " (" + l.transport_reason + ")");
  // What was kept for an earlier instance of this peer (a restarted daemon)
  // is of no use any more, unless a consumer still holds such a frame.
  for (auto it = in_states_.begin(); it != in_states_.end();) {
    const InState& in = it->second;
    if (in.peer == l.peer && in.instance != l.peer_instance && in.held.empty()) {
      in_state_ids_.erase(std::make_tuple(in.peer, in.instance, in.stream_id));
      it = in_states_.erase(it);
    } else {
      ++it;
    }
  }

  resendReleasedAcks(l);

  Peer& p = peers_[l.peer];
  p.name = l.peer;
  if (p.link_id != 0 && p.link_id != l.id) {
    spdlog::info("peer {}: link {} replaces link {}", p.name, l.id, p.link_id);
    // The old link is not down yet (its end is noticed later, or never, when
    // the peer restarted).  What it carried without an ACK goes first on the
    // new link, before any newer frame: the receiver counts on each stream
    // arriving in sequence order, replays first, and takes a sequence at or
    // below the highest it has seen for one it has had.
    requeueUnacked(p.link_id, "link " + std::to_string(l.id) + " replaces it");
  }
  p.link_id = l.id;
  for (auto& [id, s] : p.out_streams) {
    s.credits.clear();
    s.largest_credit = 0;
    v1::PeerMessage msg;
    msg.mutable_stream_open()->set_stream_id(id);
    msg.mutable_stream_open()->set_name(s.name);
    l.session.writer->send(std::move(msg));
    s.announced = true;
  }
}

void DataAgent::onLinkDown(uint64_t link_id, const std::string& reason) {
  Link* l = link(link_id);
  if (l == nullptr) return;
  spdlog::warn("link {} to peer {} is down: {}", l->id, l->peer, reason);
  metrics_.counters.links_up.fetch_sub(1, std::memory_order_relaxed);
  metrics_.counters.link_failures.fetch_add(1, std::memory_order_relaxed);
  if (l->transport) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, l->transport->eventFd(), nullptr);
    l->transport->shutdown();
    // Sends still posted complete with FL_ERR_LINK_LOST; deliver those events.
    transport::TransportEvent events[kMaxEventsPerRound];
    size_t n;
    while ((n = l->transport->poll(events, kMaxEventsPerRound)) > 0) {
      for (size_t i = 0; i < n; ++i) {
        if (events[i].kind == transport::TransportEvent::Kind::kSendComplete) onTransportEvent(*l, events[i]);
      }
    }
  }
  auto pit = peers_.find(l->peer);
  if (pit != peers_.end() && pit->second.link_id == link_id) {
    Peer& p = pit->second;
    p.link_id = 0;
    for (auto& [id, s] : p.out_streams) {
      s.credits.clear();
      s.largest_credit = 0;
      s.announced = false;
    }
  }
  // Nothing sent on this link is lost: what the peer did not acknowledge
  // goes again on the next link, and the peer drops what it already had.
  requeueUnacked(link_id, reason);
  std::shared_ptr<transport::Transport> transport = std::move(l->transport);
  l->in_streams.clear();
  links_.erase(link_id);
  retractCreditsOfLink(link_id);
  // Clients that were only waiting for posts on this link may go now.
  std::vector<uint64_t> gone;
  for (auto& [id, c] : clients_) {
    if (c->gone) gone.push_back(id);
  }
  for (uint64_t id : gone) {
    if (ClientSession* c = client(id)) maybeForget(*c);
  }
}

size_t DataAgent::pollLinks() {
  size_t work = 0;
  transport::TransportEvent events[kMaxEventsPerRound];
  std::vector<uint64_t> ids;
  for (auto& [id, l] : links_) ids.push_back(id);
  for (uint64_t id : ids) {
    Link* l = link(id);
    if (l == nullptr || !l->transport) continue;
    size_t n = l->transport->poll(events, kMaxEventsPerRound);
    for (size_t i = 0; i < n; ++i) {
      l = link(id);
      if (l == nullptr) break;
      onTransportEvent(*l, events[i]);
    }
    work += n;
  }
  return work;
}

void DataAgent::onTransportEvent(Link& l, transport::TransportEvent& ev) {
  switch (ev.kind) {
    case transport::TransportEvent::Kind::kSendComplete: {
      auto it = posted_.find(ev.cookie);
      if (it == posted_.end()) return;  // already settled (ACK raced the completion)
      Posted posted = it->second;
      posted_.erase(it);
      ClientSession* c = client(posted.frame.client_id);
      if (c == nullptr) return;
      SlotEntry& e = c->slots[posted.frame.slot];
      if (e.state != SlotState::kPosted || e.sequence != posted.sequence) return;
      if (ev.status == FL_OK) {
        e.state = SlotState::kSent;
        e.deadline_ns = nowNs() + uint64_t{config_.ack_timeout_ms} * 1'000'000ULL;
      } else if (ev.status == FL_ERR_LINK_LOST || ev.status == FL_ERR_DEVICE) {
        // The link broke, not the frame: it stays unacknowledged and is
        // replayed on the next link (requeueUnacked, when the link is down).
      } else {
        auto pit = peers_.find(posted.peer);
        if (pit != peers_.end()) {
          auto sit = pit->second.out_streams.find(posted.stream_id);
          if (sit != pit->second.out_streams.end()) sit->second.unacked.erase(posted.sequence);
        }
        finishFrame(*c, posted.frame.slot, ev.status, "send failed: " + ev.message);
      }
      maybeForget(*c);
      return;
    }
    case transport::TransportEvent::Kind::kFrameArrived:
      onFrameArrived(l, ev);
      return;
    case transport::TransportEvent::Kind::kLinkError:
      if (!l.closing) {
        spdlog::warn("link {} to peer {}: transport {} failed: {}: {}", l.id, l.peer, l.transport_name,
                     statusName(ev.status), ev.message);
        l.closing = true;
        if (l.session.cancel) l.session.cancel();
      }
      return;
  }
}

void DataAgent::onPeerMessage(Link& l, const v1::PeerMessage& msg) {
  auto protocolError = [&](const std::string& why) {
    spdlog::error("link {} to peer {}: protocol error: {}; closing the link", l.id, l.peer, why);
    if (!l.closing) {
      l.closing = true;
      v1::PeerMessage fin;
      fin.mutable_fin()->set_code(v1::ERROR_CODE_PROTOCOL);
      fin.mutable_fin()->set_reason(why);
      l.session.writer->send(std::move(fin));
      if (l.session.cancel) l.session.cancel();
    }
  };
  switch (msg.body_case()) {
    case v1::PeerMessage::kStreamOpen: {
      const auto& so = msg.stream_open();
      const std::string& name = so.name();
      bool valid =
          !name.empty() && name.size() < FL_STREAM_NAME_MAX &&
          std::all_of(name.begin(), name.end(), [](char ch) {
            return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
          });
      if (!valid) return protocolError("StreamOpen with an invalid stream name");
      if (l.in_streams.size() >= 4096 && l.in_streams.count(so.stream_id()) == 0) {
        return protocolError("too many streams opened");
      }
      l.in_streams[so.stream_id()] = InStream{name};
      spdlog::info("link {} to peer {}: stream '{}' opened (id {})", l.id, l.peer, name, so.stream_id());
      grantCredits(name);
      return;
    }
    case v1::PeerMessage::kStreamClose: {
      const uint64_t sid = msg.stream_close().stream_id();
      auto it = l.in_streams.find(sid);
      if (it == l.in_streams.end()) return;
      const std::string name = it->second.name;
      l.in_streams.erase(it);
      // The stream's credits go back to their consumers, for other streams.
      for (auto cit = credits_.begin(); cit != credits_.end();) {
        if (cit->second.link_id != l.id || cit->second.stream_id != sid) {
          ++cit;
          continue;
        }
        if (ClientSession* c = client(cit->second.client_id)) {
          SlotEntry& e = c->slots[cit->second.slot];
          if (e.state == SlotState::kCredited && e.credit_id == cit->first) e = SlotEntry{};
        }
        if (l.transport) l.transport->retractCredit(cit->first);
        cit = credits_.erase(cit);
      }
      // The sender closes a stream with nothing in flight: what was kept to
      // answer its replays can go, unless a consumer still holds a frame.
      auto key = std::make_tuple(l.peer, l.peer_instance, sid);
      if (auto idit = in_state_ids_.find(key); idit != in_state_ids_.end()) {
        auto ist = in_states_.find(idit->second);
        if (ist == in_states_.end() || ist->second.held.empty()) {
          if (ist != in_states_.end()) in_states_.erase(ist);
          in_state_ids_.erase(idit);
        }
      }
      grantCredits(name);
      return;
    }
    case v1::PeerMessage::kCreditGrant: {
      const auto& g = msg.credit_grant();
      auto pit = peers_.find(l.peer);
      if (pit == peers_.end() || pit->second.link_id != l.id) return;
      auto sit = pit->second.out_streams.find(g.stream_id());
      if (sit == pit->second.out_streams.end()) {
        spdlog::debug("link {}: credits for unknown stream {} ignored", l.id, g.stream_id());
        return;
      }
      OutStream& s = sit->second;
      if (s.credits.size() + static_cast<size_t>(g.credits_size()) > kMaxCreditsPerStream) {
        return protocolError("peer granted more than " + std::to_string(kMaxCreditsPerStream) + " credits");
      }
      for (const auto& cr : g.credits()) {
        if (cr.length() == 0) return protocolError("credit of zero length");
        transport::RemoteCredit rc;
        rc.credit_id = cr.credit_id();
        rc.length = cr.length();
        rc.remote_addr = cr.remote_addr();
        rc.rkey = cr.rkey();
        s.credits.push_back(rc);
        s.largest_credit = std::max(s.largest_credit, rc.length);
      }
      pump(pit->second, s);
      return;
    }
    case v1::PeerMessage::kCreditRevoke: {
      const auto& r = msg.credit_revoke();
      auto pit = peers_.find(l.peer);
      if (pit == peers_.end()) return;
      auto sit = pit->second.out_streams.find(r.stream_id());
      if (sit == pit->second.out_streams.end()) return;
      auto& credits = sit->second.credits;
      for (uint64_t id : r.credit_ids()) {
        credits.erase(std::remove_if(credits.begin(), credits.end(),
                                     [id](const transport::RemoteCredit& c) { return c.credit_id == id; }),
                      credits.end());
      }
      return;
    }
    case v1::PeerMessage::kAck: {
      auto pit = peers_.find(l.peer);
      if (pit == peers_.end()) return;
      if (msg.ack().sequences_size() > static_cast<int>(kMaxAcksPerMessage)) {
        return protocolError("ACK of more than " + std::to_string(kMaxAcksPerMessage) + " frames");
      }
      for (uint64_t sequence : msg.ack().sequences()) {
        onAck(pit->second, msg.ack().stream_id(), sequence, FL_OK, "");
      }
      return;
    }
    case v1::PeerMessage::kNack: {
      auto pit = peers_.find(l.peer);
      if (pit == peers_.end()) return;
      int code = static_cast<int>(msg.nack().code());
      if (code == FL_OK) code = FL_ERR_PEER_REJECTED;
      onAck(pit->second, msg.nack().stream_id(), msg.nack().sequence(), code,
            "peer " + l.peer + " refused it: " + msg.nack().message().substr(0, 256));
      return;
    }
    case v1::PeerMessage::kFin:
      spdlog::info("link {}: peer {} closes the link: {}", l.id, l.peer, msg.fin().reason().substr(0, 256));
      l.closing = true;
      if (l.session.cancel) l.session.cancel();
      return;
    case v1::PeerMessage::kKeepalive:
      return;
    default:
      return protocolError("unexpected message (field " + std::to_string(msg.body_case()) +
                           ") after the handshake");
  }
}

// ---------------------------------------------------------------- deadlines

void DataAgent::checkDeadlines() {
  uint64_t now = nowNs();
  std::vector<uint64_t> ids;
  for (auto& [id, c] : clients_) {
    if (c->role == FL_ROLE_PRODUCER && c->in_progress > 0) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    ClientSession* c = client(id);
    if (c == nullptr) continue;
    for (uint32_t s = 0; s < c->slots.size(); ++s) {
      SlotEntry& e = c->slots[s];
      if (e.deadline_ns == 0 || now < e.deadline_ns) continue;
      std::string peer_name = config_.routeFor(c->stream);
      auto pit = peers_.find(peer_name);
      if (e.state == SlotState::kPending) {
        bool link_up = pit != peers_.end() && pit->second.link_id != 0;
        if (pit != peers_.end()) {
          auto sit = pit->second.out_streams.find(e.stream_id);
          if (sit != pit->second.out_streams.end()) {
            auto& pending = sit->second.pending;
            auto f = pending.find(e.sequence);
            if (f != pending.end() && f->second.client_id == id && f->second.slot == s) pending.erase(f);
          }
        }
        if (link_up) {
          finishFrame(*c, s, FL_ERR_NO_CONSUMER,
                      "no consumer of stream '" + c->stream + "' on peer " + peer_name +
                          " took the frame within " + std::to_string(config_.credit_timeout_ms) + " ms");
        } else {
          finishFrame(*c, s, FL_ERR_LINK_LOST,
                      "no link to peer " + peer_name + " within " +
                          std::to_string(config_.credit_timeout_ms) + " ms");
        }
      } else if (e.state == SlotState::kSent) {
        if (pit != peers_.end()) {
          auto sit = pit->second.out_streams.find(e.stream_id);
          if (sit != pit->second.out_streams.end()) sit->second.unacked.erase(e.sequence);
        }
        finishFrame(*c, s, FL_ERR_TIMEOUT,
                    "no acknowledgement from peer " + peer_name + " within " +
                        std::to_string(config_.ack_timeout_ms) + " ms");
      }
    }
    if (ClientSession* again = client(id)) maybeForget(*again);
  }
}

void DataAgent::publishStats() {
  std::ostringstream out;
  out << "{\"clients\":[";
  bool first = true;
  for (auto& [id, c] : clients_) {
    if (!first) out << ',';
    first = false;
    uint32_t busy = 0;
    for (auto& e : c->slots) busy += e.state != SlotState::kFree ? 1 : 0;
    out << "{\"id\":" << id << ",\"pid\":" << c->pid << ",\"uid\":" << c->uid << ",\"role\":\""
        << (c->role == FL_ROLE_PRODUCER ? "producer" : "consumer") << "\",\"stream\":\"" << c->stream
        << "\",\"slots\":" << c->slots.size() << ",\"slots_busy\":" << busy << ",\"frames\":" << c->frames
        << ",\"bytes\":" << c->bytes << ",\"errors\":" << c->errors
        << ",\"gone\":" << (c->gone ? "true" : "false") << '}';
  }
  out << "],\"links\":[";
  first = true;
  for (auto& [id, l] : links_) {
    if (!first) out << ',';
    first = false;
    out << "{\"id\":" << id << ",\"peer\":\"" << l.peer << "\",\"transport\":\"" << l.transport_name
        << "\",\"transport_reason\":\"" << jsonEscape(l.transport_reason)
        << "\",\"frames_in\":" << l.frames_in << ",\"frames_out\":" << l.frames_out
        << ",\"in_streams\":" << l.in_streams.size() << '}';
  }
  out << "],\"streams\":[";
  first = true;
  for (auto& [name, p] : peers_) {
    for (auto& [id, s] : p.out_streams) {
      if (!first) out << ',';
      first = false;
      out << "{\"peer\":\"" << name << "\",\"stream\":\"" << s.name << "\",\"id\":" << id
          << ",\"next_sequence\":" << s.next_sequence << ",\"credits\":" << s.credits.size()
          << ",\"pending\":" << s.pending.size() << ",\"unacked\":" << s.unacked.size() << '}';
    }
  }
  out << "],\"credits_outstanding\":" << credits_.size() << ",\"frames_held_by_consumers\":";
  size_t held = 0;
  for (const auto& [id, in] : in_states_) held += in.held.size();
  out << held << '}';
  metrics_.setDetail(out.str());
}

}  // namespace framelink
