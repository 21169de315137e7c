// The world after each event: the agents run until idle, the applications
// read their completions, and every completion and delivery is checked
// against the promises listed in sim_world.h.  At the end the world heals
// and must go quiet with every frame ended.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "framelink/attach_proto.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "world.h"

namespace framelink::sim {

// The agents handle everything posted; their messages are collected; the
// applications read their completion rings.
void World::settle() {
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

void World::readCompletions() {
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

void World::onProducerCompletion(App& p, const fl_completion_desc& d) {
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
  // Who got it: a delivered frame was released by every reader it was meant
  // for, but on a drop stream by those skipped for it (perhaps all).
  if (d.status == FL_OK && (d.readers == 0 || (d.released != d.readers && !drop_))) {
    throw Broken{"frame " + std::to_string(d.frame_id) + " completed DELIVERED saying " +
                 std::to_string(d.released) + " of " + std::to_string(d.readers) + " readers released it"};
  }
  if (d.released > d.readers) {
    throw Broken{"frame " + std::to_string(d.frame_id) + " says more readers released it than it reached"};
  }
  // Its readers are those of every host it went to, summed: at least one on
  // each receiving daemon, and, when each reader had it once and from one
  // instance of its daemon, as many as the world saw get it.
  if (d.status == FL_OK && !drop_) {
    const FrameRecord& rec = frames_[d.frame_id];
    if (d.readers < receivers_.size()) {
      throw Broken{"frame " + std::to_string(d.frame_id) + " completed DELIVERED with " +
                   std::to_string(d.readers) + " readers, fewer than the " +
                   std::to_string(receivers_.size()) + " receiving daemons it went to"};
    }
    std::map<int, int> instances;  // by daemon: how many of its instances had readers of it
    uint32_t receptions = 0;
    bool again = false;
    for (const auto& [instance, n] : rec.receptions_on) {
      receptions += static_cast<uint32_t>(n);
      again = again || ++instances[daemon_of_instance_.at(instance)] > 1;
    }
    for (const auto& [id, n] : rec.subscriber_receptions) again = again || n > 1;
    for (const auto& [daemon, n] : rec.member_receptions) again = again || n > 1;
    if (!again && d.readers != receptions) {
      throw Broken{"frame " + std::to_string(d.frame_id) + " completed DELIVERED counting " +
                   std::to_string(d.readers) + " readers, but " + std::to_string(receptions) +
                   " readers on its hosts got it (each once)"};
    }
  }
  p.in_slot[d.slot] = 0;
  endFrame(d.frame_id, d.status);
}

void World::endFrame(uint64_t frame, int status) {
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
    // Every route delivered it: a consumer on every receiving daemon released
    // it.  (Without a route by name, a consumer on the sender's own daemon
    // takes the frames instead: then one release anywhere.)
    if (!drop_ && rec.released_on.empty()) {
      throw Broken{"frame " + std::to_string(frame) + " completed DELIVERED but no consumer released it"};
    }
    for (int r : receivers_) {
      if (drop_ || !named_routes_ ||
          std::any_of(rec.released_on.begin(), rec.released_on.end(),
                      [&](const Release& x) { return x.daemon == r; })) {
        continue;
      }
      throw Broken{"frame " + std::to_string(frame) + " completed DELIVERED but no consumer on " +
                   daemons_[r].id + " released it"};
    }
    return;
  }
  if (unknownOutcome(status)) {
    if (status == FL_ERR_TIMEOUT) checkTimeout(frame, rec, status);
    ++result_.unknown;
    return;
  }
  ++result_.failed;
  for (int r : receivers_) {
    if (!releasedOnLive(rec, r)) rec.may_have_failed.push_back(r);
  }
  // One reader released it, another died holding it: the first failure
  // counts.  A route fails on its own: with two receivers, one live
  // receiver's release says nothing of the other's route.
  if (releasedOnEveryLiveReceiver(rec) && !rec.reader_died_holding &&
      !(rec.lander_went_first && status == FL_ERR_NO_CONSUMER)) {
    throw Broken{"frame " + std::to_string(frame) + " completed FAILED (" + std::to_string(status) +
                 ") but a consumer of every live receiving daemon released it"};
  }
  // Released on a receiving daemon that crashed before its ACK went out:
  // the sender cannot know (documented).  (With two receivers, a release on
  // the other, live one is no such case.)
  if (std::any_of(rec.released_on.begin(), rec.released_on.end(),
                  [&](const Release& x) { return x.instance != daemons_[x.daemon].instance; })) {
    ++result_.released_then_lost;
  }
}

void World::onDelivery(App& c, const fl_completion_desc& d) {
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
  const bool lent = (h->flags & FL_SLOT_LENT) != 0;
  if (lent) ++result_.lent;
  if (lent) {
    const uint8_t* bytes = lentPayload(c, *h);
    for (uint64_t i = 0; i < d.length; ++i) {
      if (bytes[i] != patternByte(frame, i)) {
        throw Broken{"frame " + std::to_string(frame) + " reached consumer #" + std::to_string(c.id) +
                     " with byte " + std::to_string(i) + " damaged"};
      }
    }
  } else {
    checkIntact(c, d.slot, frame, d.length, "reached");
  }
  const bool flagged = (h->flags & FL_SLOT_MAYBE_REDELIVERED) != 0;
  // A gap notice: the flag and its count (the consumer's `readers`) go together, on a drop stream only.
  const bool gap = (h->flags & FL_SLOT_GAP) != 0;
  if (gap != (d.readers != 0) || d.released != 0) {
    throw Broken{"consumer #" + std::to_string(c.id) + " got frame " + std::to_string(frame) +
                 " with a gap flag and count that disagree (" + std::to_string(d.readers) + ")"};
  }
  if (gap && (!drop_ || !c.subscriber)) {
    throw Broken{"consumer #" + std::to_string(c.id) +
                 " got a gap notice, but it is no subscriber of a drop stream"};
  }
  c.gaps += d.readers;
  result_.skipped += d.readers;
  FrameRecord& rec = it->second;
  // A replay to a new instance of this daemon may be flagged, and nothing
  // else: a frame whose other route was replayed is not flagged here.
  if (flagged && rec.instance_at_submit[c.daemon] == daemons_[c.daemon].instance) {
    throw Broken{"consumer #" + std::to_string(c.id) + " on " + daemons_[c.daemon].id + " got frame " +
                 std::to_string(frame) + " flagged maybe redelivered, but " + daemons_[c.daemon].id +
                 " has not restarted since it was submitted"};
  }
  ++rec.receptions_on[c.instance];
  rec.got_by.insert(c.id);
  // Once to each subscriber, and once to the queue group.
  const int receptions = c.subscriber ? ++rec.subscriber_receptions[c.id] : ++rec.member_receptions[c.daemon];
  note((c.subscriber ? "subscriber #" : "consumer #") + std::to_string(c.id) + " gets frame " +
       std::to_string(frame) + (flagged ? " (maybe redelivered)" : ""));
  if (receptions > 1) {
    if (!flagged) {
      throw Broken{"frame " + std::to_string(frame) + " reached " +
                   (c.subscriber ? "subscriber #" + std::to_string(c.id) : std::string("the queue group")) +
                   " twice without the flag"};
    }
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
  c.in_length[d.slot] = lent ? 0 : d.length;  // a lent frame lies in its producer's slot
  ++rec.held;
  if (c.daemon == rec.sender) rec.read_beside = true;
}

void World::checkIntact(App& c, uint32_t slot, uint64_t frame, uint64_t length, const char* when) {
  const ClientSegments& seg = *c.session->segments;
  const uint8_t* bytes = seg.slot(slot);
  for (uint64_t i = 0; i < length; ++i) {
    if (bytes[i] != patternByte(frame, i)) {
      throw Broken{"frame " + std::to_string(frame) + " " + when + " consumer #" + std::to_string(c.id) +
                   " with byte " + std::to_string(i) + " of slot " + std::to_string(slot) +
                   " not the sender's (damaged, or written over)"};
    }
  }
  if (seg.slotHeader(slot)->frame_id != frame) {
    throw Broken{"the header of slot " + std::to_string(slot) + " of consumer #" + std::to_string(c.id) +
                 " no longer names frame " + std::to_string(frame) + " " + when + " it"};
  }
}

const uint8_t* World::lentPayload(App& c, const fl_slot_header& h) {
  uint64_t id = 0;
  std::memcpy(&id, h.reserved1, sizeof id);
  // Every lend message waiting: the one this frame needs went before it.
  for (;;) {
    fl_lend_message m{};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov{&m, sizeof m};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(c.lend_socket.get(), &msg, MSG_DONTWAIT);
    if (n <= 0) break;
    int fd = -1;
    if (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr && cm->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    }
    if (fd >= 0) ::close(fd);  // the producer's segment is in this process already
    if (n != sizeof m || m.magic != FL_LEND_MAGIC)
      throw Broken{"consumer #" + std::to_string(c.id) + " got a message that is no lend message"};
    if (m.kind == FL_LEND_SEGMENT) {
      if (fd < 0) throw Broken{"a lent segment came without its fd"};
      c.lent[m.lend_id] = true;
    } else if (m.kind == FL_LEND_RETIRE) {
      c.lent.erase(m.lend_id);
    }
  }
  if (c.lent.count(id) == 0) {
    throw Broken{"consumer #" + std::to_string(c.id) + " got a frame lent from segment " +
                 std::to_string(id) + " that was never lent to it"};
  }
  // A producer's segment, or a consumer's that a frame from a peer landed in.
  for (const auto& app : apps_) {
    if (app->id != id || app->daemon != c.daemon) continue;
    if (h.reserved0 >= kSlots) throw Broken{"a lent frame names a slot its lender does not have"};
    return app->session->segments->slot(h.reserved0);
  }
  throw Broken{"a frame lent from client " + std::to_string(id) + ", which never attached to its daemon"};
}

// Links healed, a producer and a consumer attached, everything delivered
// and released: every frame must end and fresh frames must still pass.
void World::heal() {
  note("heal");
  // Frames land in a subscriber while there is one (lent to the rest): it
  // takes a big frame only with big slots itself.
  auto reader = [this](int r, bool big, bool subscriber) {
    return std::any_of(apps_.begin(), apps_.end(), [&](const auto& a) {
      return a->alive && a->role == FL_ROLE_CONSUMER && a->daemon == r &&
             (!big || a->slot_size == kSlotSize) && (!subscriber || a->subscriber);
    });
  };
  for (int r : receivers_) {
    const bool subscribers = reader(r, false, true);
    if (!reader(r, true, subscribers)) attach(r, FL_ROLE_CONSUMER, kSlotSize, subscribers);
  }
  for (int d : senders()) {
    if (countApps(FL_ROLE_PRODUCER, d) == 0) attach(d, FL_ROLE_PRODUCER, kSlotSize);
  }
  for (Link* link : upLinks()) {
    if (link->dialer_gone) breakLink(*link, "keepalive timeout");
  }
  linkEveryPair();
  settle();
  healthy_ = true;
  drain(true);
  requireEveryFrameEnded("after healing");
  requireReleasedDelivered("after healing");
  // Fresh frames: nothing leaked, the stream still flows.
  const uint64_t first = next_frame_ + 1;
  for (auto& app : apps_) {
    if (!app->alive || app->role != FL_ROLE_PRODUCER) continue;
    for (uint32_t i = 0; i < kSlots; ++i) submitFrom(*app);
  }
  settle();
  drain(true);
  requireEveryFrameEnded("for the fresh frames");
  // Each skip was told, once: the gaps a subscriber was given, and the one its
  // next frame will carry, are the frames its daemon skipped it for.
  for (const auto& app : apps_) {
    if (!app->alive || !app->subscriber) continue;
    if (app->gaps + app->session->gap != app->session->dropped) {
      throw Broken{"subscriber #" + std::to_string(app->id) + " was told of " + std::to_string(app->gaps) +
                   " skipped frames (" + std::to_string(app->session->gap) +
                   " more to tell), its daemon skipped it for " + std::to_string(app->session->dropped)};
    }
  }
  for (uint64_t f = first; f <= next_frame_; ++f) {
    if (frames_[f].status != FL_OK) {
      throw Broken{"fresh frame " + std::to_string(f) + " after healing ended " +
                   std::to_string(frames_[f].status) + ", not DELIVERED (a leaked credit or slot?)"};
    }
  }
}

// Every link moves everything it holds until the world is quiet; with
// `release_held` the consumers also release every frame they hold.
void World::drain(bool release_held) {
  for (int round = 0; round < 200; ++round) {
    // Time passes a little: ACKs and credits held back for coalescing go.
    clock_.advanceNs(uint64_t{kAckDelayUs} * 1000);
    settle();
    bool moved = false;
    for (int d : senders()) {
      for (int r : receivers_) {
        Link* live = liveLink(d, r);
        if (live == nullptr) {
          linkUp(d, r);
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
        // The adversary's late answers to reads land last.
        while (live->pair.link->deliverLate(1)) moved = true;
      }
    }
    for (auto& app : apps_) {
      if (!release_held || !app->alive || app->role != FL_ROLE_CONSUMER) continue;
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

void World::requireEveryFrameEnded(const char* when) {
  for (auto& app : apps_) {
    if (!app->alive || app->role != FL_ROLE_PRODUCER) continue;
    for (uint64_t frame : app->in_slot) {
      if (frame != 0) throw Broken{"frame " + std::to_string(frame) + " never ended " + when};
    }
  }
}

}  // namespace framelink::sim
