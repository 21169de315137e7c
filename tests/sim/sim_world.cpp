#include "sim_world.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "agent_clock.h"
#include "client_session.h"
#include "config.h"
#include "data_agent.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "metrics.h"
#include "peer_session.h"
#include "segment.h"
#include "transport/loopback/loopback_transport.h"

namespace framelink::sim {
namespace {

using transport::loopback::LoopbackLink;
using transport::loopback::LoopbackPair;

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotSize = 4096;
constexpr uint64_t kSmallSlotSize = 1024;  // a second consumer with small slots
constexpr size_t kMaxRounds = 200;
constexpr uint32_t kCreditTimeoutMs = 2000;
constexpr uint32_t kAckTimeoutMs = 3000;
constexpr int kReceiver = 1;  // the daemon of the consumers; d0 (and d2) dial it and send
const char* const kStream = "cam";

// A broken invariant or a stuck world: ends the schedule.
struct Broken {
  std::string what;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  bool chance(unsigned percent) { return below(100) < percent; }

 private:
  uint64_t state_;
};

uint8_t patternByte(uint64_t frame, uint64_t i) {
  return static_cast<uint8_t>((frame * 0x9E37 + i * 13) >> 3);
}

// What one agent writes on one session, as it writes it (the writer runs
// on the agent's thread: no thread hand-off, the same order every run).
class Capture {
 public:
  explicit Capture(std::function<void()> cancel) : cancel_(std::move(cancel)) {
    writer_ = std::make_shared<SessionWriter>(
        [this](const v1::PeerMessage& m, bool) {
          messages_.push_back(m);
          return true;
        },
        SessionWriter::Inline{});
  }
  ~Capture() { writer_->close(); }

  PeerSession session() const { return PeerSession{writer_, cancel_}; }

  std::vector<v1::PeerMessage> take() { return std::exchange(messages_, {}); }

 private:
  std::function<void()> cancel_;
  std::vector<v1::PeerMessage> messages_;
  std::shared_ptr<SessionWriter> writer_;
};

// One simulated application attached to a daemon.
struct App {
  uint64_t id = 0;
  uint32_t role = FL_ROLE_PRODUCER;
  int daemon = 0;
  uint64_t instance = 0;  // of its daemon when it attached
  uint64_t slot_size = kSlotSize;
  bool alive = true;
  std::shared_ptr<ClientSession> session;
  std::vector<uint64_t> in_slot = std::vector<uint64_t>(kSlots, 0);  // frame per slot (0: free)
  std::map<int, uint64_t> last_plain;  // consumer: the last frame in order, per sender
};

struct Daemon {
  std::string id;
  uint64_t instance = 0;
  Config config;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<DataAgent> agent;
};

struct Link {
  uint64_t id = 0;
  int sender = 0;  // the dialing daemon; the other end is the receiver
  bool up = true;
  // The dialer ended its session and dialed again; the listener has not
  // noticed yet (a half-open connection, until its keepalive ends it).
  bool dialer_gone = false;
  LoopbackPair pair;
  std::unique_ptr<Capture> capture[2];                        // what each end's agent writes
  std::deque<std::shared_ptr<v1::PeerMessage>> in_flight[2];  // written by end i, not yet read
  bool cancelled = false;
};

struct FrameRecord {
  uint64_t producer = 0;
  int sender = 0;
  bool outcome_known = false;
  int status = 0;
  std::vector<uint64_t> released_on;  // receiving daemon instances a consumer released it on
  int receptions = 0;
  int landings = 0;  // times the frame crossed a data link (a resend after a NACK crosses again)
};

class World {
 public:
  World(const SimOptions& options, SimResult& result)
      : options_(options), result_(result), rng_(options.seed) {
    daemons_.resize(options.daemons == 3 ? 3 : 2);
    for (int d = 0; d < static_cast<int>(daemons_.size()); ++d) {
      daemons_[d].id = "d" + std::to_string(d);
      daemons_[d].config.id = daemons_[d].id;
      // Deadlines follow the world's clock, which moves only when the schedule says so.
      daemons_[d].config.credit_timeout_ms = kCreditTimeoutMs;
      daemons_[d].config.ack_timeout_ms = kAckTimeoutMs;
      boot(d);
    }
    for (int d : senders()) daemons_[d].config.peers.push_back(PeerConfig{"d1", "127.0.0.1:1", {}});
    damage_on_ = rng_.chance(50);  // then every frame carries a CRC32C
  }

  ~World() {
    for (auto& d : daemons_) d.agent.reset();
    links_.clear();
  }

  void run() {
    for (int d : senders()) attach(d, FL_ROLE_PRODUCER, kSlotSize);
    attach(kReceiver, FL_ROLE_CONSUMER, kSlotSize);
    for (int d : senders()) linkUp(d);
    settle();
    for (size_t step = 0; step < options_.steps; ++step) {
      oneEvent();
      settle();
    }
    heal();
  }

 private:
  // ---------------------------------------------------------------- events

  void oneEvent() {
    const uint64_t r = rng_.below(1000);
    std::vector<Link*> up = upLinks();
    Link* any = up.empty() ? nullptr : up[rng_.below(up.size())];
    const std::vector<int> all_senders = senders();
    const int sender = all_senders[rng_.below(all_senders.size())];
    if (r < 250) {
      submit();
    } else if (r < 450) {
      consume(1 + rng_.below(3));
    } else if (r < 650) {
      if (any) deliverControl(*any, static_cast<int>(rng_.below(2)), 1 + rng_.below(4));
    } else if (r < 900) {
      if (any) deliverData(*any, 1 + rng_.below(3), false);
    } else if (r < 915) {
      if (any && damage_on_) deliverData(*any, 1, true);
    } else if (r < 930) {
      if (any) breakLink(*any, "cable pulled");
    } else if (r < 960) {
      if (liveLink(sender) == nullptr) linkUp(sender);
    } else if (r < 965) {
      if (Link* live = liveLink(sender); live != nullptr && up.size() < 4) replaceLink(*live);
    } else if (r < 975) {
      killApp(FL_ROLE_CONSUMER);
    } else if (r < 985) {
      if (countApps(FL_ROLE_CONSUMER) < 2) {
        attach(kReceiver, FL_ROLE_CONSUMER, rng_.chance(25) ? kSmallSlotSize : kSlotSize);
      }
    } else if (r < 988) {
      killApp(FL_ROLE_PRODUCER);
    } else if (r < 990) {
      if (countApps(FL_ROLE_PRODUCER, sender) == 0) attach(sender, FL_ROLE_PRODUCER, kSlotSize);
    } else if (r < 993) {
      // Time passes: up to a little over the ACK deadline, so credit and ACK
      // deadlines fire in the middle of everything else.
      const uint64_t ms = 1 + rng_.below(kAckTimeoutMs + 500);
      clock_.advanceMs(ms);
      note("clock +" + std::to_string(ms) + " ms");
    } else if (r < 997) {
      if (options_.crash_receiver) crash(kReceiver);
    } else {
      if (options_.crash_sender) crash(sender);
    }
  }

  void boot(int d) {
    Daemon& daemon = daemons_[d];
    daemon.instance = ++next_instance_;
    daemon.metrics = std::make_unique<Metrics>();
    daemon.agent = std::make_unique<DataAgent>(daemon.config, *daemon.metrics, clock_);
    note("boot " + daemon.id + " instance " + std::to_string(daemon.instance));
  }

  void attach(int d, uint32_t role, uint64_t slot_size) {
    auto app = std::make_unique<App>();
    app->id = ++next_app_;
    app->role = role;
    app->daemon = d;
    app->instance = daemons_[d].instance;
    app->slot_size = slot_size;
    SegmentRequest req;
    req.role = role;
    req.slot_count = kSlots;
    req.slot_size = slot_size;
    req.stream = kStream;
    req.hugepages = HugepageMode::kOff;
    auto segments = ClientSegments::create(req);
    if (!segments) throw Broken{"cannot make segments: " + segments.error().message};
    auto c = std::make_shared<ClientSession>();
    c->id = app->id;
    c->role = role;
    c->stream = kStream;
    c->segments = std::move(segments).value();
    Doorbell submit, completion;  // the application's ends close: nobody rings them here
    if (!makeDoorbell(&submit) || !makeDoorbell(&completion)) throw Broken{"cannot make doorbells"};
    c->submit_doorbell = std::move(submit.daemon_end);
    c->completion_doorbell = std::move(completion.daemon_end);
    c->ring_capacity = c->segments->geometry().ring_capacity;
    c->slots.resize(kSlots);
    app->session = c;
    note(std::string("attach ") + (role == FL_ROLE_PRODUCER ? "producer" : "consumer") + " #" +
         std::to_string(app->id) + " to " + daemons_[d].id + " slots of " + std::to_string(slot_size));
    daemons_[d].agent->post(CmdClientAttached{c});
    apps_.push_back(std::move(app));
  }
  size_t countApps(uint32_t role, int daemon = -1) const {
    return static_cast<size_t>(std::count_if(apps_.begin(), apps_.end(), [&](const auto& a) {
      return a->alive && a->role == role && (daemon < 0 || a->daemon == daemon);
    }));
  }

  std::vector<int> senders() const {
    std::vector<int> out;
    for (int d = 0; d < static_cast<int>(daemons_.size()); ++d) {
      if (d != kReceiver) out.push_back(d);
    }
    return out;
  }

  // The daemon at one end of a link: 0 the sender, 1 the receiver.
  static int daemonAt(const Link& link, int end) { return end == 0 ? link.sender : kReceiver; }

  App* pickApp(uint32_t role) {
    std::vector<App*> alive;
    for (auto& a : apps_) {
      if (a->alive && a->role == role) alive.push_back(a.get());
    }
    return alive.empty() ? nullptr : alive[rng_.below(alive.size())];
  }

  void killApp(uint32_t role) {
    App* app = pickApp(role);
    if (app == nullptr) return;
    note(std::string("kill ") + (role == FL_ROLE_PRODUCER ? "producer" : "consumer") + " #" +
         std::to_string(app->id));
    app->alive = false;
    daemons_[app->daemon].agent->post(CmdClientGone{app->id});
  }
  void submit() {
    if (App* p = pickApp(FL_ROLE_PRODUCER)) submitFrom(*p);
  }

  void submitFrom(App& producer) {
    App* p = &producer;
    uint32_t slot = kSlots;
    for (uint32_t s = 0; s < kSlots; ++s) {
      if (p->in_slot[s] == 0) slot = s;
    }
    if (slot == kSlots) return;
    const uint64_t frame = ++next_frame_;
    const uint64_t length = rng_.chance(20) ? rng_.below(kSlotSize + 1) : rng_.below(kSmallSlotSize + 1);
    const bool crc = damage_on_ || rng_.chance(30);
    ClientSegments& seg = *p->session->segments;
    uint8_t* bytes = seg.slot(slot);
    for (uint64_t i = 0; i < length; ++i) bytes[i] = patternByte(frame, i);
    fl_slot_header* h = seg.slotHeader(slot);
    std::memset(h, 0, sizeof *h);
    h->frame_id = frame;
    if (crc) {
      h->crc32c = fl_crc32c(0, bytes, length);
      h->flags = FL_SLOT_HAS_CRC32C;
    }
    fl_submit_desc d{slot, 0, length};
    if (fl_ring_push(seg.submitRing(), p->session->ring_capacity, sizeof d, &d) != FL_RING_OK) {
      throw Broken{"a producer's submit ring is full with a free slot"};
    }
    p->in_slot[slot] = frame;
    frames_[frame].producer = p->id;
    frames_[frame].sender = p->daemon;
    ++result_.frames;
    note("submit frame " + std::to_string(frame) + " slot " + std::to_string(slot) + " length " +
         std::to_string(length) + (crc ? " crc" : ""));
  }

  // A consumer releases up to `n` of the frames it holds (oldest slot first).
  void consume(uint64_t n) {
    App* c = pickApp(FL_ROLE_CONSUMER);
    if (c == nullptr) return;
    for (uint32_t s = 0; s < kSlots && n > 0; ++s) {
      if (c->in_slot[s] == 0) continue;
      release(*c, s);
      --n;
    }
  }

  void release(App& c, uint32_t slot) {
    const uint64_t frame = c.in_slot[slot];
    FrameRecord& rec = frames_[frame];
    if (rec.outcome_known && rec.status != FL_OK && !unknownOutcome(rec.status)) {
      throw Broken{"frame " + std::to_string(frame) + " is released by consumer #" + std::to_string(c.id) +
                   " after its producer was told it FAILED (" + std::to_string(rec.status) + ")"};
    }
    // Journaled before it is released, as a real receiver does.
    rec.released_on.push_back(c.instance);
    fl_submit_desc d{slot, 0, 0};
    ClientSegments& seg = *c.session->segments;
    if (fl_ring_push(seg.submitRing(), c.session->ring_capacity, sizeof d, &d) != FL_RING_OK) {
      throw Broken{"a consumer's release ring is full"};
    }
    c.in_slot[slot] = 0;
    note("release frame " + std::to_string(frame) + " by consumer #" + std::to_string(c.id));
  }

  // ---------------------------------------------------------------- links

  std::vector<Link*> upLinks() {
    std::vector<Link*> up;
    for (auto& link : links_) {
      if (link->up) up.push_back(link.get());
    }
    return up;
  }

  // The link from `sender` both daemons consider up.
  Link* liveLink(int sender) {
    for (auto it = links_.rbegin(); it != links_.rend(); ++it) {
      if ((*it)->sender == sender && (*it)->up && !(*it)->dialer_gone) return it->get();
    }
    return nullptr;
  }

  // The dialer gives up on its session and dials again, while the listener
  // still holds the old one: what it sends there is lost, what the dialer
  // sent before may still arrive.
  void replaceLink(Link& old) {
    note("link " + std::to_string(old.id) + " ended by the dialer only");
    old.dialer_gone = true;
    old.in_flight[1].clear();
    daemons_[old.sender].agent->post(CmdLinkDown{old.id, "the dialer dialed again"});
    linkUp(old.sender);
  }
  void linkUp(int sender) {
    auto link = std::make_unique<Link>();
    link->id = ++next_link_;
    link->sender = sender;
    transport::loopback::LoopbackOptions lo;
    lo.manual = true;
    auto pair = transport::loopback::makePair(lo);
    if (!pair) throw Broken{"cannot make a loopback pair: " + pair.error().message};
    link->pair = std::move(pair).value();
    Link* raw = link.get();
    for (int end = 0; end < 2; ++end) {
      link->capture[end] = std::make_unique<Capture>([raw] { raw->cancelled = true; });
    }
    note("link " + std::to_string(link->id) + " up from " + daemons_[sender].id);
    for (int end = 0; end < 2; ++end) {
      CmdLinkUp up;
      up.link_id = link->id;
      up.peer = daemons_[daemonAt(*link, end ^ 1)].id;
      up.peer_instance = daemons_[daemonAt(*link, end ^ 1)].instance;
      up.transport_name = "loopback";
      up.transport = end == 0 ? link->pair.a : link->pair.b;
      up.session = link->capture[end]->session();
      daemons_[daemonAt(*link, end)].agent->post(std::move(up));
    }
    links_.push_back(std::move(link));
  }

  // Both sessions end: what was written and not read may or may not arrive.
  void breakLink(Link& link, const std::string& why) {
    if (!link.up) return;
    note("link " + std::to_string(link.id) + " down: " + why);
    ++result_.link_breaks;
    for (int end = 0; end < 2; ++end) {
      const size_t keep = rng_.below(link.in_flight[end].size() + 1);
      deliverControl(link, end, keep);
      link.in_flight[end].clear();
    }
    link.up = false;
    link.pair.link->breakLink(FL_ERR_LINK_LOST, why);
    for (int end = 0; end < 2; ++end) {
      if (end == 0 && link.dialer_gone) continue;  // told already
      daemons_[daemonAt(link, end)].agent->post(CmdLinkDown{link.id, why});
    }
  }

  void deliverControl(Link& link, int from, size_t n) {
    auto& queue = link.in_flight[from];
    if (link.dialer_gone && from == 1) {
      queue.clear();  // the dialer no longer reads that session
      return;
    }
    for (; n > 0 && !queue.empty(); --n) {
      const int to = daemonAt(link, from ^ 1);
      note("control " + daemons_[daemonAt(link, from)].id + "->" + daemons_[to].id + " " +
           describe(*queue.front()));
      daemons_[to].agent->post(CmdPeerMessage{link.id, std::move(queue.front())});
      queue.pop_front();
    }
  }

  void deliverData(Link& link, uint64_t n, bool damage) {
    for (; n > 0; --n) {
      const int from = link.pair.link->waiting(0) > 0 ? 0 : 1;
      transport::FrameHeader next;
      if (link.pair.link->peekNext(from, &next)) {
        auto it = frames_.find(next.frame_id);
        if (it != frames_.end()) ++it->second.landings;
      }
      if (!link.pair.link->deliverOne(
              from, damage ? LoopbackLink::Damage::kFlipPayloadByte : LoopbackLink::Damage::kNone)) {
        return;
      }
      if (damage) ++result_.damaged;
      note("data on link " + std::to_string(link.id) + (damage ? " (damaged)" : ""));
    }
  }

  // The daemon dies (its memory lost) and starts again.
  void crash(int d) {
    ++result_.crashes;
    note("crash " + daemons_[d].id);
    for (auto& link : links_) {
      if (!link->up || (d != kReceiver && link->sender != d)) continue;
      link->in_flight[0].clear();
      link->in_flight[1].clear();
      link->up = false;
      link->pair.link->breakLink(FL_ERR_LINK_LOST, "peer daemon crashed");
      const int survivor = d == kReceiver ? link->sender : kReceiver;
      if (!(d == kReceiver && link->dialer_gone)) {
        daemons_[survivor].agent->post(CmdLinkDown{link->id, "peer daemon crashed"});
      }
    }
    for (auto& app : apps_) {
      if (!app->alive || app->daemon != d) continue;
      app->alive = false;
      if (app->role == FL_ROLE_PRODUCER) {
        // Frames in flight end FL_ERR_DAEMON_GONE at the application: outcome unknown.
        for (uint64_t& frame : app->in_slot) {
          if (frame == 0) continue;
          endFrame(frame, FL_ERR_DAEMON_GONE);
          frame = 0;
        }
      }
    }
    daemons_[d].agent.reset();
    boot(d);
  }

  // ---------------------------------------------------------------- settling

  // The agents handle everything posted; their messages are collected; the
  // applications read their completion rings.
  void settle() {
    for (int pass = 0; pass < 4; ++pass) {
      bool more = false;
      for (auto& d : daemons_) {
        if (!d.agent->runUntilIdle(kMaxRounds)) {
          throw Broken{"the agent of " + d.id + " still finds work after " + std::to_string(kMaxRounds) +
                       " rounds: it would spin"};
        }
      }
      for (auto& link : links_) {
        if (!link->up) continue;
        for (int end = 0; end < 2; ++end) {
          for (auto& m : link->capture[end]->take()) {
            link->in_flight[end].push_back(std::make_shared<v1::PeerMessage>(std::move(m)));
          }
        }
      }
      for (auto& link : links_) {
        if (link->up && link->cancelled) {
          breakLink(*link, "an agent ended the session");
          more = true;
        }
      }
      readCompletions();
      if (!more) return;
    }
  }

  void readCompletions() {
    fl_completion_desc d;
    for (auto& app : apps_) {
      ClientSegments& seg = *app->session->segments;
      while (fl_ring_pop(seg.completionRing(), app->session->ring_capacity, sizeof d, &d) == FL_RING_OK) {
        if (app->role == FL_ROLE_PRODUCER) {
          onProducerCompletion(*app, d);
        } else if (app->alive) {
          onDelivery(*app, d);
        }
      }
    }
  }

  void onProducerCompletion(App& p, const fl_completion_desc& d) {
    if (d.slot >= kSlots || p.in_slot[d.slot] == 0) {
      if (!p.alive) return;  // the daemon may publish to a producer the world already wrote off
      throw Broken{"producer #" + std::to_string(p.id) + " got a completion for slot " +
                   std::to_string(d.slot) + " which has no frame in flight"};
    }
    if (p.in_slot[d.slot] != d.frame_id) {
      throw Broken{"producer #" + std::to_string(p.id) + " slot " + std::to_string(d.slot) + " holds frame " +
                   std::to_string(p.in_slot[d.slot]) + " but the completion names " +
                   std::to_string(d.frame_id)};
    }
    p.in_slot[d.slot] = 0;
    endFrame(d.frame_id, d.status);
  }

  static bool unknownOutcome(int status) { return status == FL_ERR_DAEMON_GONE || status == FL_ERR_TIMEOUT; }

  void endFrame(uint64_t frame, int status) {
    FrameRecord& rec = frames_[frame];
    if (rec.outcome_known) {
      throw Broken{"frame " + std::to_string(frame) + " got a second completion (" + std::to_string(status) +
                   " after " + std::to_string(rec.status) + ")"};
    }
    rec.outcome_known = true;
    rec.status = status;
    note("frame " + std::to_string(frame) + " ends " + std::to_string(status));
    if (status == FL_OK) {
      ++result_.delivered;
      if (rec.released_on.empty()) {
        throw Broken{"frame " + std::to_string(frame) + " completed DELIVERED but no consumer released it"};
      }
      return;
    }
    if (unknownOutcome(status)) {
      ++result_.unknown;
      return;
    }
    ++result_.failed;
    for (uint64_t instance : rec.released_on) {
      if (instance == daemons_[kReceiver].instance) {
        throw Broken{"frame " + std::to_string(frame) + " completed FAILED (" + std::to_string(status) +
                     ") but a consumer of the live receiving daemon released it"};
      }
    }
    // Released only on a receiving daemon that crashed before its ACK went out:
    // the sender cannot know (documented).
    if (!rec.released_on.empty()) ++result_.released_then_lost;
  }

  void onDelivery(App& c, const fl_completion_desc& d) {
    if (d.status != FL_OK) return;
    if (d.slot >= kSlots) throw Broken{"a consumer got a frame in a slot it does not have"};
    if (c.in_slot[d.slot] != 0) {
      throw Broken{"consumer #" + std::to_string(c.id) + " got a frame in slot " + std::to_string(d.slot) +
                   " which it still holds"};
    }
    ClientSegments& seg = *c.session->segments;
    const fl_slot_header* h = seg.slotHeader(d.slot);
    const uint64_t frame = d.frame_id;
    auto it = frames_.find(frame);
    if (frame == 0 || it == frames_.end())
      throw Broken{"a consumer got frame " + std::to_string(frame) + " never submitted"};
    if (h->frame_id != frame) throw Broken{"a delivered slot header names another frame than its completion"};
    const uint8_t* bytes = seg.slot(d.slot);
    for (uint64_t i = 0; i < d.length; ++i) {
      if (bytes[i] != patternByte(frame, i)) {
        throw Broken{"frame " + std::to_string(frame) + " reached consumer #" + std::to_string(c.id) +
                     " with byte " + std::to_string(i) + " damaged"};
      }
    }
    const bool flagged = (h->flags & FL_SLOT_MAYBE_REDELIVERED) != 0;
    FrameRecord& rec = it->second;
    ++rec.receptions;
    note("consumer #" + std::to_string(c.id) + " gets frame " + std::to_string(frame) +
         (flagged ? " (maybe redelivered)" : ""));
    if (rec.receptions > 1) {
      if (!flagged)
        throw Broken{"frame " + std::to_string(frame) + " reached a consumer twice without the flag"};
      ++result_.redelivered;
    }
    // Order: frames that crossed the link once arrive in submission order.  A
    // frame sent again after a NACK (damaged, or its credit withdrawn) may
    // come after frames sent behind it.
    if (!flagged && rec.landings <= 1) {
      uint64_t& last = c.last_plain[rec.sender];
      if (frame <= last) {
        throw Broken{"consumer #" + std::to_string(c.id) + " got frame " + std::to_string(frame) +
                     " after frame " + std::to_string(last) + " of the same sender: out of order"};
      }
      last = frame;
    }
    c.in_slot[d.slot] = frame;
  }

  // ---------------------------------------------------------------- the end

  // Links healed, a producer and a consumer attached, everything delivered
  // and released: every frame must end and fresh frames must still pass.
  void heal() {
    note("heal");
    const bool big_consumer = std::any_of(apps_.begin(), apps_.end(), [](const auto& a) {
      return a->alive && a->role == FL_ROLE_CONSUMER && a->slot_size == kSlotSize;
    });
    if (!big_consumer) attach(kReceiver, FL_ROLE_CONSUMER, kSlotSize);
    for (int d : senders()) {
      if (countApps(FL_ROLE_PRODUCER, d) == 0) attach(d, FL_ROLE_PRODUCER, kSlotSize);
    }
    for (Link* link : upLinks()) {
      if (link->dialer_gone) breakLink(*link, "keepalive timeout");
    }
    for (int d : senders()) {
      if (liveLink(d) == nullptr) linkUp(d);
    }
    settle();
    drain();
    requireEveryFrameEnded("after healing");
    // Fresh frames: nothing leaked, the stream still flows.
    const uint64_t first = next_frame_ + 1;
    for (auto& app : apps_) {
      if (!app->alive || app->role != FL_ROLE_PRODUCER) continue;
      for (uint32_t i = 0; i < kSlots; ++i) submitFrom(*app);
    }
    settle();
    drain();
    requireEveryFrameEnded("for the fresh frames");
    for (uint64_t f = first; f <= next_frame_; ++f) {
      if (frames_[f].status != FL_OK) {
        throw Broken{"fresh frame " + std::to_string(f) + " after healing ended " +
                     std::to_string(frames_[f].status) + ", not DELIVERED (a leaked credit or slot?)"};
      }
    }
  }

  void drain() {
    for (int round = 0; round < 200; ++round) {
      bool moved = false;
      for (int d : senders()) {
        Link* live = liveLink(d);
        if (live == nullptr) {
          linkUp(d);
          moved = true;
          continue;
        }
        for (int end = 0; end < 2; ++end) {
          if (!live->in_flight[end].empty()) {
            deliverControl(*live, end, live->in_flight[end].size());
            moved = true;
          }
        }
        while (live->pair.link->waiting(0) + live->pair.link->waiting(1) > 0) {
          deliverData(*live, 1, false);
          moved = true;
        }
      }
      for (auto& app : apps_) {
        if (!app->alive || app->role != FL_ROLE_CONSUMER) continue;
        for (uint32_t s = 0; s < kSlots; ++s) {
          if (app->in_slot[s] != 0) {
            release(*app, s);
            moved = true;
          }
        }
      }
      settle();
      if (!moved) return;
    }
    throw Broken{"the world does not go quiet after healing (200 rounds)"};
  }

  void requireEveryFrameEnded(const char* when) {
    for (auto& app : apps_) {
      if (!app->alive || app->role != FL_ROLE_PRODUCER) continue;
      for (uint64_t frame : app->in_slot) {
        if (frame != 0) throw Broken{"frame " + std::to_string(frame) + " never ended " + when};
      }
    }
  }

  // ---------------------------------------------------------------- trace

  void note(const std::string& event) {
    if (tracing_) result_.trace.push_back(std::to_string(result_.trace.size()) + " " + event);
  }

  static std::string describe(const v1::PeerMessage& m) {
    std::ostringstream out;
    switch (m.body_case()) {
      case v1::PeerMessage::kStreamOpen:
        out << "StreamOpen " << m.stream_open().name() << " id " << m.stream_open().stream_id();
        break;
      case v1::PeerMessage::kStreamClose:
        out << "StreamClose id " << m.stream_close().stream_id();
        break;
      case v1::PeerMessage::kCreditGrant:
        out << "CreditGrant stream " << m.credit_grant().stream_id() << " x"
            << m.credit_grant().credits_size();
        break;
      case v1::PeerMessage::kCreditRevoke:
        out << "CreditRevoke stream " << m.credit_revoke().stream_id() << " x"
            << m.credit_revoke().credit_ids_size();
        break;
      case v1::PeerMessage::kAck:
        out << "Ack stream " << m.ack().stream_id() << " seqs";
        for (uint64_t s : m.ack().sequences()) out << ' ' << s;
        break;
      case v1::PeerMessage::kNack:
        out << "Nack stream " << m.nack().stream_id() << " seq " << m.nack().sequence() << " code "
            << m.nack().code();
        break;
      case v1::PeerMessage::kFin:
        out << "Fin";
        break;
      default:
        out << "message " << m.body_case();
        break;
    }
    return out.str();
  }

 public:
  bool tracing_ = false;

 private:
  const SimOptions& options_;
  SimResult& result_;
  Rng rng_;
  ManualClock clock_;
  bool damage_on_ = false;
  std::vector<Daemon> daemons_;
  std::vector<std::unique_ptr<App>> apps_;
  std::vector<std::unique_ptr<Link>> links_;
  std::map<uint64_t, FrameRecord> frames_;
  uint64_t next_instance_ = 0, next_app_ = 0, next_link_ = 0, next_frame_ = 0;
};

}  // namespace

SimResult runSchedule(const SimOptions& options) {
  SimResult result;
  {
    World world(options, result);
    world.tracing_ = options.keep_trace;
    try {
      world.run();
    } catch (const Broken& broken) {
      result.ok = false;
      result.failure = broken.what;
    }
  }
  if (!result.ok && !options.keep_trace) {
    // The same seed takes the same path: run it again, this time with the trace.
    SimOptions again = options;
    again.keep_trace = true;
    SimResult traced = runSchedule(again);
    traced.failure =
        result.failure +
        (traced.failure == result.failure ? "" : " (the traced rerun said: " + traced.failure + ")");
    return traced;
  }
  return result;
}

}  // namespace framelink::sim
