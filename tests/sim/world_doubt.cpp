// The events that make the world doubt what it is told: time that moves by
// less than the ACK delay (so held-back ACKs and credits wait across rounds
// and go on their timer), half-open links that the listener learns of late,
// and healthy periods after which every frame a live receiver released must
// have been reported DELIVERED.  A TIMEOUT is an honest "unknown" only when
// the ACK had no way back before the deadline.
#include <algorithm>
#include <string>
#include <vector>

#include "framelink/framelink.h"
#include "world.h"

namespace framelink::sim {

void World::doubtEvent(uint64_t r) {
  if (r < 1015) {
    tick();
  } else if (r < 1025) {
    keepaliveEnds();
  } else if (r < 1040) {
    healthyPeriod();
  } else if (r < 1050) {
    // The dialer gives up on a link that works, so that the listener holds
    // a half-open link while the stream moves to the new one.
    const std::vector<int> all = senders();
    const int sender = all[rng_.below(all.size())];
    if (Link* live = liveLink(sender, pickReceiver());
        live != nullptr && upLinks().size() < 4 * receivers_.size()) {
      replaceLink(*live);
    }
  } else {
    forge();
  }
}

// Less time than an ACK may be held, or a little more: releases of one
// round wait for the next, and the coalescing timer fires between events.
void World::tick() {
  const uint64_t us = 1 + rng_.below(2 * kAckDelayUs);
  clock_.advanceNs(us * 1000);
  note("clock +" + std::to_string(us) + " us");
}

// The listener's keepalive notices that a link the dialer left is dead.
void World::keepaliveEnds() {
  for (auto& link : links_) {
    if (link->up && link->dialer_gone) {
      breakLink(*link, "keepalive timeout");
      return;
    }
  }
}

// The network heals: half-open links are noticed, every sender has a link,
// and every message and frame moves until the world is quiet.  Then every
// frame a consumer of the live receiver released must have its ACK back,
// and the clock runs on so that deadlines of what was not released fire.
void World::healthyPeriod() {
  note("healthy period");
  for (auto& link : links_) {
    if (link->up && link->dialer_gone) breakLink(*link, "keepalive timeout");
  }
  linkEveryPair();
  healthy_ = true;
  settle();
  const auto owing =
      std::count_if(frames_.begin(), frames_.end(), [&](const auto& f) { return owed(f.second); });
  drain(false);
  requireReleasedDelivered("after a healthy period");
  result_.owed_delivered += static_cast<uint64_t>(owing);
  healthy_ = false;
  const uint64_t ms = 1 + rng_.below(kAckTimeoutMs + 500);
  clock_.advanceMs(ms);
  note("clock +" + std::to_string(ms) + " ms");
}

bool World::releasedOnLive(const FrameRecord& rec, int receiver) const {
  return std::any_of(rec.released_on.begin(), rec.released_on.end(), [&](const Release& x) {
    return x.daemon == receiver && x.instance == daemons_[receiver].instance;
  });
}

bool World::releasedOnEveryLiveReceiver(const FrameRecord& rec) const {
  return std::all_of(receivers_.begin(), receivers_.end(), [&](int r) { return releasedOnLive(rec, r); });
}

// With the links healed, the ACK of a frame the live receiver released
// comes back unless the deadline fell inside the healthy period itself.
void World::checkTimeout(uint64_t frame, const FrameRecord& rec, int status) const {
  // With two receivers the TIMEOUT may be either route's: each must have
  // landed it (a route still waiting for a credit times out sooner).
  if (!healthy_ || !releasedOnEveryLiveReceiver(rec) || rec.read_beside) return;
  uint64_t earliest_deadline = rec.first_landed_ns + uint64_t{kAckTimeoutMs} * 1'000'000ULL;
  // With two routes the completion waits for the last: one route may have
  // timed out before the links healed (a frame replayed after its link broke
  // waits credit_timeout for the next), and its TIMEOUT is said only now.
  // No route times out sooner than credit_timeout after the submit.
  if (receivers_.size() > 1) earliest_deadline = rec.submitted_ns + uint64_t{kCreditTimeoutMs} * 1'000'000ULL;
  if (clock_.nowNs() >= earliest_deadline) return;
  throw Broken{"frame " + std::to_string(frame) + " completed " + std::to_string(status) +
               " while the links were healed, though a consumer of the live receiving daemon released it and "
               "its deadline had not come"};
}

// Released on the live receiver (on each of them, with two: while one
// route is pending nothing is owed), not yet ended, and its producer still
// listens (a producer that died hears of nothing more).
bool World::owed(const FrameRecord& rec) const {
  // Released by every reader there that still holds it: a frame lent to
  // several readers is answered after the last one.
  if (rec.outcome_known || !releasedOnEveryLiveReceiver(rec) || rec.held > 0) return false;
  // It still waits for a subscriber there that has not had it and holds all
  // its slots (drain() releases nothing held): until one of them is free, or
  // a drop stream skips it at the frame's deadline.
  const bool waits = std::any_of(apps_.begin(), apps_.end(), [&](const auto& a) {
    if (!a->alive || !a->subscriber || !isReceiver(a->daemon) ||
        a->instance != daemons_[a->daemon].instance || rec.subscriber_receptions.count(a->id) != 0) {
      return false;
    }
    const auto slots = static_cast<std::ptrdiff_t>(a->session->slots.size());
    return std::count(a->in_slot.begin(), a->in_slot.begin() + slots, uint64_t{0}) == 0;
  });
  if (waits) return false;
  return std::any_of(apps_.begin(), apps_.end(),
                     [&](const auto& a) { return a->id == rec.producer && a->alive; });
}

void World::requireReleasedDelivered(const char* when) {
  for (const auto& [frame, rec] : frames_) {
    if (!owed(rec)) continue;
    throw Broken{"frame " + std::to_string(frame) +
                 " was released on every live receiving daemon but has no " + "completion " + when};
  }
}

// The frames `app` got on its daemon that a live subscriber there has not got: they were lent
// from `app`'s slot, and that subscriber waits for them in vain now.
void World::markLanderGone(const App& app) {
  for (auto& [frame, rec] : frames_) {
    if (rec.outcome_known || rec.got_by.count(app.id) == 0) continue;
    for (const auto& other : apps_) {
      if (other->alive && other->subscriber && other->daemon == app.daemon && other->id != app.id &&
          rec.got_by.count(other->id) == 0) {
        rec.lander_went_first = true;
        break;
      }
    }
  }
}

}  // namespace framelink::sim
