// runSchedule and the world's events: what a schedule can make happen to the
// applications, the links and the daemons (world_checks.cpp checks the result).
#include "sim_world.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <utility>

#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "world.h"

namespace framelink::sim {

World::World(const SimOptions& options, SimResult& result)
    : options_(options), result_(result), rng_(options.seed) {
  daemons_.resize((options.daemons == 3 ? 3 : 2) + (options.receivers == 2 ? 1 : 0));
  receivers_ = {kFirstReceiver};
  if (options.receivers == 2) {
    receivers_.push_back(static_cast<int>(daemons_.size()) - 1);
    result.two_receivers = 1;
  }
  for (int d = 0; d < static_cast<int>(daemons_.size()); ++d) {
    daemons_[d].id = "d" + std::to_string(d);
    daemons_[d].config.id = daemons_[d].id;
    // Deadlines follow the world's clock, which moves only when the schedule says so.
    daemons_[d].config.credit_timeout_ms = kCreditTimeoutMs;
    daemons_[d].config.ack_timeout_ms = kAckTimeoutMs;
    daemons_[d].config.ack_delay_us = options.seed % 2 == 1 ? kAckDelayUs : 0;
    // Every fifth seed drops for a slow subscriber instead of waiting for it.
    if (options.seed % 5 == 4) {
      drop_ = true;
      daemons_[d].config.drop_streams = {kStream};
      daemons_[d].config.drop_lag = 1 + static_cast<uint32_t>(options.seed % 3);
    }
    // Seeds 2 and 5 of every 7 pull the stream: receivers read each frame
    // from the sender's offer instead of having it written.  With the
    // adversary, every other schedule pulls: its answers to reads then come
    // late, after the stream closed or moved, or twice (world_adversary.cpp).
    const bool pulled =
        options.adversary ? (options.seed / 5) % 2 == 0 : options.seed % 7 == 2 || options.seed % 7 == 5;
    if (pulled) {
      pull_ = true;
      result.pulled = 1;
      result.pulled_adversary = options.adversary ? 1 : 0;
      daemons_[d].config.pull_streams = {kStream};
      daemons_[d].config.pull_reads_per_link = 1 + static_cast<uint32_t>(options.seed % 4);
    }
  }
  // Every third seed routes the stream by name: a reader on a sender's own
  // host then reads its frames beside the receiver's, from the same slot.
  // Two receivers are always named (`--route cam=d1,d2`): two peers without
  // a streams list would route nothing.
  const std::vector<std::string> routed = options.seed % 3 == 0 || receivers_.size() > 1
                                              ? std::vector<std::string>{kStream}
                                              : std::vector<std::string>{};
  named_routes_ = !routed.empty();
  for (int d : senders()) {
    for (int r : receivers_) {
      daemons_[d].config.peers.push_back(
          PeerConfig{daemons_[r].id, "127.0.0.1:" + std::to_string(r), routed});
    }
  }
  // Booted with the whole configuration: a data agent keeps its own copy of it.
  for (int d = 0; d < static_cast<int>(daemons_.size()); ++d) boot(d);
  damage_on_ = rng_.chance(50);  // then every frame carries a CRC32C
}

World::~World() {
  for (auto& d : daemons_) d.agent.reset();
  links_.clear();
}

void World::run() {
  for (int d : senders()) attach(d, FL_ROLE_PRODUCER, kSlotSize);
  for (int r : receivers_) attach(r, FL_ROLE_CONSUMER, kSlotSize);
  for (int d : senders()) {
    for (int r : receivers_) linkUp(d, r);
  }
  settle();
  for (size_t step = 0; step < options_.steps; ++step) {
    oneEvent();
    settle();
  }
  heal();
}

void World::oneEvent() {
  const uint64_t r = rng_.below(options_.adversary ? 1070 : 1050);
  if (r >= 1000) return doubtEvent(r);
  std::vector<Link*> up = upLinks();
  Link* any = up.empty() ? nullptr : up[rng_.below(up.size())];
  const std::vector<int> all_senders = senders();
  const int sender = all_senders[rng_.below(all_senders.size())];
  const int receiver = pickReceiver();
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
    if (liveLink(sender, receiver) == nullptr) linkUp(sender, receiver);
  } else if (r < 965) {
    if (Link* live = liveLink(sender, receiver); live != nullptr && up.size() < 4 * receivers_.size()) {
      replaceLink(*live);
    }
  } else if (r < 975) {
    killApp(FL_ROLE_CONSUMER);
  } else if (r < 978) {
    // A reader on a sender's own host: its frames go there, lent (no link).
    if (countApps(FL_ROLE_CONSUMER, sender) == 0)
      attach(sender, FL_ROLE_CONSUMER, kSlotSize, rng_.chance(40));
  } else if (r < 985) {
    // Subscribers too: a frame from a peer lands in one reader there and
    // is lent to the others.
    if (countApps(FL_ROLE_CONSUMER, receiver) < 3) {
      attach(receiver, FL_ROLE_CONSUMER, rng_.chance(25) ? kSmallSlotSize : kSlotSize, rng_.chance(40));
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
    if (options_.crash_receiver) crash(receiver);
  } else {
    if (options_.crash_sender) crash(sender);
  }
}

void World::boot(int d) {
  Daemon& daemon = daemons_[d];
  daemon.instance = ++next_instance_;
  daemon_of_instance_[daemon.instance] = d;
  daemon.metrics = std::make_unique<Metrics>();
  daemon.agent = std::make_unique<DataAgent>(daemon.config, *daemon.metrics, clock_);
  note("boot " + daemon.id + " instance " + std::to_string(daemon.instance));
}

void World::attach(int d, uint32_t role, uint64_t slot_size, bool subscriber) {
  auto app = std::make_unique<App>();
  app->id = ++next_app_;
  app->role = role;
  app->daemon = d;
  app->instance = daemons_[d].instance;
  app->slot_size = slot_size;
  app->subscriber = subscriber;
  // On a drop stream some subscribers on the receiver have two slots: they
  // fall behind soon.  (Not beside a producer: a frame there that waited for
  // one that died waits for another reader until credit_timeout_ms, which
  // healing does not wait for.)
  const uint32_t slots = drop_ && subscriber && isReceiver(d) && rng_.chance(50) ? kFewSlots : kSlots;
  SegmentRequest req;
  req.role = role;
  req.slot_count = slots;
  req.slot_size = slot_size;
  req.stream = kStream;
  req.hugepages = HugepageMode::kOff;
  auto segments = ClientSegments::create(req);
  if (!segments) throw Broken{"cannot make segments: " + segments.error().message};
  auto c = std::make_shared<ClientSession>();
  c->id = app->id;
  c->role = role;
  c->stream = kStream;
  c->subscriber = subscriber;
  c->segments = std::move(segments).value();
  c->replied = true;            // its attach reply sent
  Doorbell submit, completion;  // the application's ends close: nobody rings them here
  if (!makeSubmitDoorbell(&submit) || !makeCompletionDoorbell(&completion))
    throw Broken{"cannot make doorbells"};
  c->submit_doorbell = std::move(submit.daemon_end);
  c->completion_doorbell = std::move(completion.daemon_end);
  c->completion_reader = std::move(completion.reader);
  c->ring_capacity = c->segments->geometry().ring_capacity;
  c->slots.resize(slots);
  if (!c->segments->keepReadOnlyDataFd()) {
    throw Broken{"cannot open the data segment read-only"};
  }
  if (role == FL_ROLE_CONSUMER) {  // lent segments come on the attach socket
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
      throw Broken{"cannot make a socket pair"};
    c->socket.reset(sv[0]);
    app->lend_socket.reset(sv[1]);
  }
  app->session = c;
  note(std::string("attach ") +
       (role == FL_ROLE_PRODUCER ? "producer"
        : subscriber             ? "subscriber"
                                 : "consumer") +
       " #" + std::to_string(app->id) + " to " + daemons_[d].id + " slots of " + std::to_string(slot_size));
  daemons_[d].agent->post(CmdClientAttached{c});
  apps_.push_back(std::move(app));
}

size_t World::countApps(uint32_t role, int daemon) const {
  return static_cast<size_t>(std::count_if(apps_.begin(), apps_.end(), [&](const auto& a) {
    return a->alive && a->role == role && (daemon < 0 || a->daemon == daemon);
  }));
}

std::vector<int> World::senders() const {
  std::vector<int> out;
  for (int d = 0; d < static_cast<int>(daemons_.size()); ++d) {
    if (!isReceiver(d)) out.push_back(d);
  }
  return out;
}

bool World::isReceiver(int d) const {
  return std::find(receivers_.begin(), receivers_.end(), d) != receivers_.end();
}

int World::pickReceiver() {
  return receivers_.size() == 1 ? receivers_[0] : receivers_[rng_.below(receivers_.size())];
}

App* World::pickApp(uint32_t role) {
  std::vector<App*> alive;
  for (auto& a : apps_) {
    if (a->alive && a->role == role) alive.push_back(a.get());
  }
  return alive.empty() ? nullptr : alive[rng_.below(alive.size())];
}

void World::killApp(uint32_t role) {
  App* app = pickApp(role);
  if (app == nullptr) return;
  note(std::string("kill ") + (role == FL_ROLE_PRODUCER ? "producer" : "consumer") + " #" +
       std::to_string(app->id));
  app->alive = false;
  // What it held fails for its producer, whoever else read it.
  for (uint64_t frame : app->in_slot) {
    if (frame == 0 || role != FL_ROLE_CONSUMER) continue;
    frames_[frame].reader_died_holding = true;
    --frames_[frame].held;
  }
  if (role == FL_ROLE_CONSUMER) markLanderGone(*app);
  daemons_[app->daemon].agent->post(CmdClientGone{app->id});
}

void World::submit() {
  if (App* p = pickApp(FL_ROLE_PRODUCER)) submitFrom(*p);
}

void World::submitFrom(App& producer) {
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
  for (const Daemon& d : daemons_) frames_[frame].instance_at_submit.push_back(d.instance);
  frames_[frame].submitted_ns = clock_.nowNs();
  ++result_.frames;
  note("submit frame " + std::to_string(frame) + " slot " + std::to_string(slot) + " length " +
       std::to_string(length) + (crc ? " crc" : ""));
}

// A consumer releases up to `n` of the frames it holds (oldest slot first).
void World::consume(uint64_t n) {
  App* c = pickApp(FL_ROLE_CONSUMER);
  if (c == nullptr) return;
  for (uint32_t s = 0; s < kSlots && n > 0; ++s) {
    if (c->in_slot[s] == 0) continue;
    release(*c, s);
    --n;
  }
}

void World::release(App& c, uint32_t slot) {
  const uint64_t frame = c.in_slot[slot];
  FrameRecord& rec = frames_[frame];
  // A frame for several readers fails with the first reader's failure (one
  // died holding it): the others may still release it after.  So may the
  // readers of one route when another route's failure ended the frame.
  const bool other_route_failed = std::any_of(rec.may_have_failed.begin(), rec.may_have_failed.end(),
                                              [&](int r) { return r != c.daemon; });
  if (rec.outcome_known && rec.status != FL_OK && !unknownOutcome(rec.status) && !rec.reader_died_holding &&
      !rec.lander_went_first && !other_route_failed) {
    throw Broken{"frame " + std::to_string(frame) + " is released by consumer #" + std::to_string(c.id) +
                 " after its producer was told it FAILED (" + std::to_string(rec.status) + ")"};
  }
  // What it read is what the sender sent, until the end.
  if (c.in_length[slot] > 0) checkIntact(c, slot, frame, c.in_length[slot], "was released by");
  // Journaled before it is released, as a real receiver does.
  rec.released_on.push_back(Release{c.daemon, c.instance});
  fl_submit_desc d{slot, 0, 0};
  ClientSegments& seg = *c.session->segments;
  if (fl_ring_push(seg.submitRing(), c.session->ring_capacity, sizeof d, &d) != FL_RING_OK) {
    throw Broken{"a consumer's release ring is full"};
  }
  c.in_slot[slot] = 0;
  --rec.held;
  note("release frame " + std::to_string(frame) + " by consumer #" + std::to_string(c.id));
}

std::vector<Link*> World::upLinks() {
  std::vector<Link*> up;
  for (auto& link : links_) {
    if (link->up) up.push_back(link.get());
  }
  return up;
}

// The link from `sender` to `receiver` both daemons consider up.
Link* World::liveLink(int sender, int receiver) {
  for (auto it = links_.rbegin(); it != links_.rend(); ++it) {
    if ((*it)->sender == sender && (*it)->receiver == receiver && (*it)->up && !(*it)->dialer_gone) {
      return it->get();
    }
  }
  return nullptr;
}

void World::linkEveryPair() {
  for (int d : senders()) {
    for (int r : receivers_) {
      if (liveLink(d, r) == nullptr) linkUp(d, r);
    }
  }
}

// The dialer gives up on its session and dials again, while the listener
// still holds the old one: what it sends there is lost, what the dialer
// sent before may still arrive.
void World::replaceLink(Link& old) {
  note("link " + std::to_string(old.id) + " ended by the dialer only");
  old.dialer_gone = true;
  old.in_flight[1].clear();
  old.end[0]->goHalfOpen();
  // What the dialer wrote is in its kernel's buffers: it still lands, as it
  // was, after the agent let the frames' slots go.
  old.pair.link->keepPayloads(0);
  daemons_[old.sender].agent->post(CmdLinkDown{old.id, "the dialer dialed again"});
  linkUp(old.sender, old.receiver);
}

void World::linkUp(int sender, int receiver) {
  auto link = std::make_unique<Link>();
  link->id = ++next_link_;
  link->sender = sender;
  link->receiver = receiver;
  transport::loopback::LoopbackOptions lo;
  lo.manual = true;
  auto pair = transport::loopback::makePair(lo);
  if (!pair) throw Broken{"cannot make a loopback pair: " + pair.error().message};
  link->pair = std::move(pair).value();
  link->end[0] = std::make_shared<SimLinkEnd>(link->pair.a);
  link->end[1] = std::make_shared<SimLinkEnd>(link->pair.b);
  Link* raw = link.get();
  for (int end = 0; end < 2; ++end) {
    link->capture[end] = std::make_unique<Capture>([raw] { raw->cancelled = true; });
  }
  note("link " + std::to_string(link->id) + " up from " + daemons_[sender].id + " to " +
       daemons_[receiver].id);
  for (int end = 0; end < 2; ++end) {
    CmdLinkUp up;
    up.link_id = link->id;
    up.identity.peer_name = daemons_[daemonAt(*link, end ^ 1)].id;
    up.identity.peer_instance = daemons_[daemonAt(*link, end ^ 1)].instance;
    up.identity.transport_name = "loopback";
    up.transport = link->end[end];
    up.session = link->capture[end]->session();
    daemons_[daemonAt(*link, end)].agent->post(std::move(up));
  }
  links_.push_back(std::move(link));
}

// Both sessions end: what was written and not read may or may not arrive.
void World::breakLink(Link& link, const std::string& why) {
  if (!link.up) return;
  note("link " + std::to_string(link.id) + " down: " + why);
  ++result_.link_breaks;
  for (int end = 0; end < 2; ++end) {
    const size_t keep = rng_.below(link.in_flight[end].size() + 1);
    deliverControl(link, end, keep);
    link.in_flight[end].clear();
    // What was written to the transport before it broke: a prefix may still
    // land (bytes already in the receiver's socket buffer).
    const size_t landed = rng_.below(link.pair.link->waiting(end) + 1);
    for (size_t i = 0; i < landed; ++i) {
      transport::FrameHeader next;
      if (link.pair.link->peekNext(end, &next)) countLanding(next.frame_id);
      if (!link.pair.link->deliverOne(end)) break;
    }
  }
  link.up = false;
  link.pair.link->breakLink(FL_ERR_LINK_LOST, why);
  for (int end = 0; end < 2; ++end) {
    if (end == 0 && link.dialer_gone) continue;  // told already
    daemons_[daemonAt(link, end)].agent->post(CmdLinkDown{link.id, why});
  }
}

void World::deliverControl(Link& link, int from, size_t n) {
  auto& queue = link.in_flight[from];
  if (link.dialer_gone && from == 1) {
    queue.clear();  // the dialer no longer reads that session
    return;
  }
  for (; n > 0 && !queue.empty(); --n) {
    const int to = daemonAt(link, from ^ 1);
    if (from == 0 && queue.front()->has_stream_open())
      link.stream_id = queue.front()->stream_open().stream_id();
    note("control " + daemons_[daemonAt(link, from)].id + "->" + daemons_[to].id + " " +
         describe(*queue.front()));
    daemons_[to].agent->post(CmdPeerMessage{link.id, std::move(queue.front())});
    queue.pop_front();
  }
}

// What a transport carries, frames and control records (credits, ACKs,
// NACKs), each way in order; which way moves next is the schedule's choice.
void World::deliverData(Link& link, uint64_t n, bool damage) {
  for (; n > 0; --n) {
    const size_t waiting[2] = {link.pair.link->waiting(0), link.pair.link->waiting(1)};
    if (waiting[0] + waiting[1] == 0) return;
    const int from = waiting[0] == 0 ? 1 : waiting[1] == 0 ? 0 : static_cast<int>(rng_.below(2));
    transport::FrameHeader next;
    const bool frame = link.pair.link->peekNext(from, &next);
    if (frame) countLanding(next.frame_id);
    // A frame a pulling receiver is offered crosses as its offer does (its
    // bytes follow when the receiver reads them).
    if (std::string record; !frame && link.pair.link->peekControl(from, &record)) {
      v1::ControlBatch batch;
      if (batch.ParseFromString(record)) {
        for (const auto& m : batch.messages()) {
          if (m.has_offer()) countLanding(m.offer().header().frame_id());
        }
      }
    }
    const bool damaged = damage && frame;  // a control record is never damaged: it has no CRC32C
    if (!link.pair.link->deliverOne(
            from, damaged ? LoopbackLink::Damage::kFlipPayloadByte : LoopbackLink::Damage::kNone)) {
      return;
    }
    if (damaged) ++result_.damaged;
    note(std::string(frame ? "data" : "control record") + " on link " + std::to_string(link.id) +
         " from end " + std::to_string(from) + (damaged ? " (damaged)" : ""));
  }
}

// The daemon dies (its memory lost) and starts again.
void World::crash(int d) {
  ++result_.crashes;
  note("crash " + daemons_[d].id);
  for (auto& link : links_) {
    if (!link->up || (link->receiver != d && link->sender != d)) continue;
    link->in_flight[0].clear();
    link->in_flight[1].clear();
    link->up = false;
    link->pair.link->breakLink(FL_ERR_LINK_LOST, "peer daemon crashed");
    const int survivor = d == link->receiver ? link->sender : link->receiver;
    if (!(d == link->receiver && link->dialer_gone)) {
      daemons_[survivor].agent->post(CmdLinkDown{link->id, "peer daemon crashed"});
    }
  }
  for (auto& app : apps_) {
    if (!app->alive || app->daemon != d) continue;
    app->alive = false;
    if (app->role == FL_ROLE_CONSUMER) {
      for (uint64_t frame : app->in_slot) {
        if (frame != 0) --frames_[frame].held;
      }
    }
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

void World::countLanding(uint64_t frame) {
  auto it = frames_.find(frame);
  if (it == frames_.end()) return;
  if (it->second.landings++ == 0) it->second.first_landed_ns = clock_.nowNs();
}

void World::note(const std::string& event) {
  if (tracing_) result_.trace.push_back(std::to_string(result_.trace.size()) + " " + event);
}

std::string World::describe(const v1::PeerMessage& m) {
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
          << m.credit_grant().credits_size() + m.credit_grant().slot_credits_size();
      if (m.credit_grant().regions_size() > 0) out << " regions " << m.credit_grant().regions_size();
      break;
    case v1::PeerMessage::kCreditRevoke:
      out << "CreditRevoke stream " << m.credit_revoke().stream_id() << " x"
          << m.credit_revoke().credit_ids_size();
      if (m.credit_revoke().retired_regions_size() > 0) {
        out << " retiring " << m.credit_revoke().retired_regions_size() << " regions";
      }
      break;
    case v1::PeerMessage::kAck:
      out << "Ack stream " << m.ack().stream_id() << " seqs";
      for (uint64_t s : m.ack().sequences()) out << ' ' << s;
      for (int i = 0; i + 1 < m.ack().runs_size(); i += 2) {
        out << ' ' << m.ack().runs(i) << ".." << m.ack().runs(i) + m.ack().runs(i + 1) - 1;
      }
      break;
    case v1::PeerMessage::kNack:
      out << "Nack stream " << m.nack().stream_id() << " seq " << m.nack().sequence() << " code "
          << m.nack().code();
      break;
    case v1::PeerMessage::kCreditLow:
      out << "CreditLow stream " << m.credit_low().stream_id();
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
