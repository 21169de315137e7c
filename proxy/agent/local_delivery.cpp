#include "agent/local_delivery.h"

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

#include "agent/agent_stats.h"
#include "attach/send_fds.h"
#include "common/log_fields.h"
#include "framelink/attach_proto.h"
#include "framelink/framelink.h"

namespace framelink {

LocalDelivery::LocalDelivery(const Config& config, Metrics& metrics, const AgentClock& clock,
                             ClientTable& clients, EndFrame end)
    : config_(config), metrics_(metrics), clock_(clock), clients_(clients), end_(std::move(end)) {}

void LocalDelivery::consumerAttached(const ClientSession& c) {
  Readers& r = readers_[c.stream];
  r.consumers.push_back(c.id);
  if (c.subscriber) {
    r.subscribers[c.id] = c.segments->slotSize();
  } else {
    ++r.members;
  }
}

bool LocalDelivery::hasReaders(const std::string& stream) const {
  auto it = readers_.find(stream);
  return it != readers_.end() && (!it->second.subscribers.empty() || it->second.members > 0);
}

bool LocalDelivery::hasSubscribers(const std::string& stream) const {
  auto it = readers_.find(stream);
  return it != readers_.end() && !it->second.subscribers.empty();
}

bool LocalDelivery::hasMembers(const std::string& stream) const {
  auto it = readers_.find(stream);
  return it != readers_.end() && it->second.members > 0;
}

size_t LocalDelivery::waitingOf(const std::string& stream) const {
  auto it = streams_.find(stream);
  return it == streams_.end() ? 0 : it->second.waiting.size();
}

bool LocalDelivery::lands(const ClientSession& c) const {
  auto it = readers_.find(c.stream);
  if (it == readers_.end() || it->second.subscribers.empty()) return true;
  // The lander can take every frame any subscriber here could.
  auto lander = it->second.subscribers.begin();
  for (auto s = lander; s != it->second.subscribers.end(); ++s) {
    if (s->second > lander->second) lander = s;
  }
  return lander->first == c.id;
}

bool LocalDelivery::othersRead(const ClientSession& c) const {
  auto it = readers_.find(c.stream);
  if (it == readers_.end()) return false;
  const size_t other_subscribers = it->second.subscribers.size() - (c.subscriber ? 1 : 0);
  return other_subscribers > 0 || (c.subscriber && it->second.members > 0);
}

size_t LocalDelivery::waitingFrames() const {
  size_t n = 0;
  for (const auto& [name, s] : streams_) n += s.waiting.size();
  return n;
}

size_t LocalDelivery::waitingFor(const ClientSession& c) const {
  auto sit = streams_.find(c.stream);
  if (sit == streams_.end()) return 0;
  size_t n = 0;
  for (const FrameKey& key : sit->second.waiting) n += key.first != c.id ? 1 : 0;
  return n;
}

LocalDelivery::Frame& LocalDelivery::newFrame(Stream& s, const ClientSession& source, uint32_t slot,
                                              const fl_slot_header& header, uint64_t length) {
  Frame& f = frames_[{source.id, slot}];
  f = Frame{};
  f.producer = source.id;
  f.slot = slot;
  f.stream = source.stream;
  f.header = header;
  f.length = length;
  f.sequence = s.next_sequence++;
  f.deadline_ns = clock_.nowNs() + uint64_t{config_.credit_timeout_ms} * 1'000'000ULL;
  f.copy = std::find(config_.copy_streams.begin(), config_.copy_streams.end(), source.stream) !=
           config_.copy_streams.end();
  f.drop = std::find(config_.drop_streams.begin(), config_.drop_streams.end(), source.stream) !=
           config_.drop_streams.end();
  return f;
}

void LocalDelivery::submit(AgentClient& producer, uint32_t slot, const fl_slot_header& header,
                           uint64_t length, bool beside, bool members) {
  ClientSession& p = *producer.session;
  Stream& s = streams_[p.stream];
  Frame& f = newFrame(s, p, slot, header, length);
  SlotEntry& e = p.slots[slot];
  f.beside = beside;
  // The producer's header has no say in it: its readers here are told when
  // a member elsewhere has it, and then no member here gets it.
  f.header.flags &= ~uint32_t{FL_SLOT_GROUP_ELSEWHERE};
  if (!members) f.header.flags |= FL_SLOT_GROUP_ELSEWHERE;
  if (!beside) {
    e.state = SlotState::kLent;
    e.sequence = f.sequence;
    e.length = length;
    e.frame_id = header.frame_id;
    e.submitted_ns = clock_.nowNs();
    ++p.in_progress;
  }
  f.slot_sequence = e.sequence;
  if ((header.flags & FL_SLOT_HAS_CRC32C) != 0) {
    // Checked once, here, as a receiving daemon checks it: each reader is
    // told it was.  (A producer that writes the slot after submitting it
    // changes what its readers see; only the readers of a copy are safe
    // from that.)
    const uint32_t crc = fl_crc32c(0, p.segments->slot(slot), length);
    if (crc != header.crc32c) {
      frames_.erase({p.id, slot});
      end_(producer, slot, FL_ERR_CRC_MISMATCH,
           "payload CRC32C mismatch (expected " + std::to_string(header.crc32c) + ", got " +
               std::to_string(crc) + "): the slot changed after the CRC was computed",
           0, 0);
      return;
    }
  }
  s.waiting.emplace_back(p.id, slot);
  deliverOne(s);
}

bool LocalDelivery::landedElsewhereWaits(const std::string& stream) const {
  auto sit = streams_.find(stream);
  if (sit == streams_.end()) return false;
  for (const FrameKey& key : sit->second.waiting) {
    auto fit = frames_.find(key);
    if (fit == frames_.end() || !fit->second.landed || !fit->second.waiting) continue;
    const AgentClient* source = clients_.find(key.first);
    if (source == nullptr || !lands(*source->session)) return true;
  }
  return false;
}

void LocalDelivery::shareLanded(ClientSession& landing, uint32_t slot, const fl_slot_header& header,
                                const Landed& from) {
  Stream& s = streams_[landing.stream];
  Frame& f = newFrame(s, landing, slot, header, header.length);
  f.landed = true;
  f.source_member = !landing.subscriber;
  f.from = from;
  f.readers = 1;  // the landing consumer has it
  f.readers_out = 1;
  s.waiting.emplace_back(landing.id, slot);
  deliverOne(s);
}

void LocalDelivery::landedReleased(const ClientSession& landing, uint32_t slot) {
  auto fit = frames_.find({landing.id, slot});
  if (fit == frames_.end() || !fit->second.landed || fit->second.readers_out == 0) return;
  --fit->second.readers_out;
  ++fit->second.released;
  endIfDone({landing.id, slot});
}

void LocalDelivery::landedGone(const ClientSession& landing, uint32_t slot) {
  auto fit = frames_.find({landing.id, slot});
  if (fit == frames_.end() || !fit->second.landed || fit->second.readers_out == 0) return;
  Frame& f = fit->second;
  --f.readers_out;
  if (f.failure == FL_OK) {
    f.failure = FL_ERR_NO_CONSUMER;
    f.why = "a consumer died before releasing the frame";
  }
  endIfDone({landing.id, slot});
}

size_t LocalDelivery::pump() {
  size_t delivered = 0;
  for (auto& [name, s] : streams_) {
    while (!s.waiting.empty() && deliverOne(s)) ++delivered;
  }
  return delivered;
}

int LocalDelivery::freeSlot(const ClientSession& c) {
  for (uint32_t i = 0; i < c.slots.size(); ++i) {
    if (c.slots[i].state == SlotState::kFree) return static_cast<int>(i);
  }
  return -1;
}

bool LocalDelivery::deliverOne(Stream& s, bool at_deadline) {
  while (!s.waiting.empty()) {
    auto fit = frames_.find(s.waiting.front());
    AgentClient* source = fit == frames_.end() ? nullptr : clients_.find(fit->second.producer);
    const bool stale = fit == frames_.end() || !fit->second.waiting || source == nullptr ||
                       (fit->second.landed ? source->session->gone : !producerHolds(*source, fit->second));
    if (stale) {
      s.waiting.pop_front();  // ended meanwhile (the daemon is shutting down, the landing consumer went)
      if (fit != frames_.end() && fit->second.waiting) frames_.erase(fit);
      continue;
    }
    Frame& f = fit->second;
    // Every subscriber and one member of the queue group, each with a free
    // slot, or the frame waits.  On a drop stream a subscriber with no free
    // slot is skipped instead once more than drop_lag frames wait (every
    // one of them waits for it: they go in order), or when the frame is due
    // to fail: it does not hold the other readers' frames beyond that.  The
    // queue group shares the frames: a member is never skipped.  A frame
    // that landed here has its landing consumer already.
    const bool skip_full =
        f.drop && (s.waiting.size() > config_.drop_lag || (at_deadline && f.deadline_ns <= clock_.nowNs()));
    std::vector<std::pair<ClientSession*, int>> readers;
    std::vector<ClientSession*> members;
    std::vector<ClientSession*> skipped;
    auto rit = readers_.find(f.stream);
    const std::vector<uint64_t> none;
    for (const uint64_t id : rit == readers_.end() ? none : rit->second.consumers) {
      AgentClient* c = clients_.find(id);
      if (c == nullptr) continue;
      ClientSession& r = *c->session;
      if (r.gone) continue;
      if (f.landed && r.id == f.producer) continue;
      if (!r.subscriber) {
        const bool group_elsewhere = (f.header.flags & FL_SLOT_GROUP_ELSEWHERE) != 0;
        if (!(f.landed && f.source_member) && !group_elsewhere) members.push_back(&r);
        continue;
      }
      if (f.member_only) continue;  // the subscribers have it already
      const int slot = freeSlot(r);
      if (slot >= 0) {
        readers.emplace_back(&r, slot);
      } else if (skip_full) {
        skipped.push_back(&r);
      } else {
        return false;
      }
    }
    if (!members.empty()) {
      int slot = -1;
      for (size_t tries = 0; tries < members.size() && slot < 0; ++tries) {
        ClientSession* m = members[s.next_member++ % members.size()];
        slot = freeSlot(*m);
        if (slot >= 0) readers.emplace_back(m, slot);
      }
      if (slot < 0) return false;
    }
    // Nobody reads it (yet): it waits for its deadline.  A frame every
    // reader of which was skipped ends delivered to none.
    if (readers.empty() && skipped.empty() && (!f.landed || f.member_only)) return false;
    const FrameKey key = s.waiting.front();
    s.waiting.pop_front();
    f.waiting = false;
    f.member_only = false;
    for (ClientSession* r : skipped) skip(f, *source, *r);
    for (auto& [r, slot] : readers) deliverTo(f, *source, *r, static_cast<uint32_t>(slot));
    if (!readers.empty()) startHold(key, f);
    endIfDone(key);
    return true;
  }
  return false;
}

void LocalDelivery::skip(Frame& f, AgentClient& source, ClientSession& r) {
  // Meant for it, never released by it: the completion tells the producer.
  ++f.readers;
  // Saturates: a reader that stays stalled is told it missed "at least" this many.
  if (r.gap < UINT32_MAX) ++r.gap;
  ++r.dropped;
  if (!f.landed) ++source.session->dropped;
  metrics_.counters.frames_dropped_slow_reader.fetch_add(1, std::memory_order_relaxed);
  const LogScope scope(LogFields{.client = r.id, .stream = r.stream, .sequence = f.sequence});
  log_skips_.warn(
      "client {} stream '{}': skipped for frame {}: no free slot while more than drop_lag ({}) frames wait, "
      "or the frame was due ({} skipped in all)",
      r.id, r.stream, f.sequence, config_.drop_lag, r.dropped);
}

void LocalDelivery::deliverTo(Frame& f, AgentClient& producer, ClientSession& r, uint32_t rs) {
  ClientSession& p = *producer.session;
  fl_slot_header h = f.header;
  h.length = f.length;
  h.sequence = f.sequence;
  h.flags = f.header.flags & (FL_SLOT_HAS_CRC32C | FL_SLOT_MAYBE_REDELIVERED |
                              FL_SLOT_GROUP_ELSEWHERE);  // CRC checked already
  if (r.gap > 0) h.flags |= FL_SLOT_GAP;
  h.reserved0 = 0;
  std::memset(h.reserved1, 0, sizeof h.reserved1);
  if (!f.copy && lend(r, p)) {
    h.flags |= FL_SLOT_LENT;
    h.reserved0 = f.slot;
    std::memcpy(h.reserved1, &p.id, sizeof p.id);
    ++lends_[r.id].holds[p.id];
    metrics_.counters.local_frames_lent.fetch_add(1, std::memory_order_relaxed);
  } else if (f.length <= r.segments->slotSize()) {
    std::memcpy(r.segments->slot(rs), p.segments->slot(f.slot), f.length);
    metrics_.counters.local_frames_copied.fetch_add(1, std::memory_order_relaxed);
  } else {
    if (f.failure == FL_OK) {
      f.failure = FL_ERR_TOO_LARGE;
      f.why = "a local consumer could neither be lent the frame nor hold a copy (slots of " +
              std::to_string(r.segments->slotSize()) + " bytes)";
    }
    return;
  }
  std::memcpy(r.segments->slotHeader(rs), &h, sizeof h);
  ++f.readers;
  SlotEntry& e = r.slots[rs];
  e = SlotEntry{};
  e.state = SlotState::kDelivered;
  e.sequence = f.sequence;
  e.length = f.length;
  e.frame_id = f.header.frame_id;
  e.consumer.local_from = p.id;
  e.consumer.local_slot = f.slot;
  e.consumer.completion_at = __atomic_load_n(&r.segments->completionRing()->tail, __ATOMIC_RELAXED);
  ++f.readers_out;
  ++r.frames;
  r.bytes += f.length;
  metrics_.counters.frames_received.fetch_add(1, std::memory_order_relaxed);
  metrics_.counters.bytes_received.fetch_add(f.length, std::memory_order_relaxed);
  // A consumer's completion has no readers: that field says the gap.
  clients_.complete(r, rs, FL_OK, f.sequence, f.length, f.header.frame_id, r.gap);
  r.gap = 0;
}

bool LocalDelivery::sendRetirements(ClientSession& r, Lends& lends) {
  while (!lends.to_retire.empty()) {
    fl_lend_message m{};
    m.magic = FL_LEND_MAGIC;
    m.kind = FL_LEND_RETIRE;
    m.lend_id = lends.to_retire.back();
    if (::send(r.socket.get(), &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof m)) {
      return false;
    }
    lends.to_retire.pop_back();
  }
  return true;
}

bool LocalDelivery::lend(ClientSession& r, const ClientSession& p) {
  // Before its attach reply, a lend message would be read as the reply: the
  // first frames of a reader attached a moment ago are copied instead.
  if (p.segments->readOnlyDataFd() < 0 || !r.socket.valid() || !r.replied.load(std::memory_order_acquire)) {
    return false;
  }
  Lends& lends = lends_[r.id];
  if (!sendRetirements(r, lends)) return false;
  if (lends.holds.count(p.id) != 0) return true;
  if (lends.holds.size() >= FL_LEND_MAX) {
    // Room for it: retire a segment the consumer holds nothing of.
    auto idle = lends.holds.begin();
    while (idle != lends.holds.end() && idle->second != 0) ++idle;
    if (idle == lends.holds.end()) return false;
    lends.to_retire.push_back(idle->first);
    lends.holds.erase(idle);
    metrics_.counters.lends_retired_for_room.fetch_add(1, std::memory_order_relaxed);
    if (!sendRetirements(r, lends)) return false;
  }
  const SegmentGeometry& g = p.segments->geometry();
  fl_lend_message m{};
  m.magic = FL_LEND_MAGIC;
  m.kind = FL_LEND_SEGMENT;
  m.lend_id = p.id;
  m.data_size = g.data_size;
  m.slots_offset = g.slots_offset;
  m.slot_stride = g.slot_stride;
  m.slot_size = p.segments->slotSize();
  m.slot_count = p.segments->slotCount();
  const int fd = p.segments->readOnlyDataFd();
  if (sendWithFds(r.socket.get(), &m, sizeof m, std::span<const int>(&fd, 1), MSG_DONTWAIT | MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof m)) {
    const LogScope scope(LogFields{.client = r.id, .stream = r.stream});
    log_.warn("client {} stream '{}': cannot lend it producer {}'s segment ({}); copying its frames", r.id,
              r.stream, p.id, std::strerror(errno));
    return false;
  }
  lends.holds[p.id] = 0;
  return true;
}

void LocalDelivery::released(ClientSession& consumer, uint32_t slot) {
  readerDone(consumer, slot, FL_OK, "");
}

void LocalDelivery::readerDone(ClientSession& consumer, uint32_t slot, int status, const std::string& why) {
  const SlotEntry& e = consumer.slots[slot];
  const FrameKey key{e.consumer.local_from, e.consumer.local_slot};
  auto lit = lends_.find(consumer.id);
  if (lit != lends_.end()) {
    auto hit = lit->second.holds.find(e.consumer.local_from);
    if (hit != lit->second.holds.end() && hit->second > 0 && --hit->second == 0) {
      const AgentClient* p = clients_.find(e.consumer.local_from);
      if (p == nullptr || p->session->gone) {
        lit->second.holds.erase(hit);
        lit->second.to_retire.push_back(e.consumer.local_from);
      }
    }
  }
  if (e.consumer.taken_back) return;  // the frame ended for it already
  auto fit = frames_.find(key);
  if (fit == frames_.end() || fit->second.sequence != e.sequence || fit->second.readers_out == 0) return;
  Frame& f = fit->second;
  --f.readers_out;
  if (status == FL_OK) ++f.released;
  if (status != FL_OK && f.failure == FL_OK) {
    f.failure = status;
    f.why = why;
  }
  endIfDone(key);
}

void LocalDelivery::endIfDone(const FrameKey& key) {
  auto fit = frames_.find(key);
  if (fit == frames_.end() || fit->second.readers_out > 0 || fit->second.waiting) return;
  const Frame f = std::move(fit->second);
  frames_.erase(fit);
  if (f.hold_deadline_ns != 0) holds_.erase({f.hold_deadline_ns, key});
  if (f.landed) {
    if (end_landed_) end_landed_(f.from, f.producer, f.slot, f.failure, f.why, f.readers, f.released);
    return;
  }
  AgentClient* p = clients_.find(f.producer);
  if (p == nullptr || !producerHolds(*p, f)) return;
  end_(*p, f.slot, f.failure, f.why, f.readers, f.released);
}

bool LocalDelivery::producerHolds(const AgentClient& producer, const Frame& f) {
  const SlotEntry& e = producer.session->slots[f.slot];
  // A frame that goes to a peer too is in whatever state that side has it.
  return e.sequence == f.slot_sequence &&
         (f.beside ? e.state != SlotState::kFree : e.state == SlotState::kLent);
}

void LocalDelivery::consumerGone(const ClientSession& consumer) {
  lends_.erase(consumer.id);
  auto rit = readers_.find(consumer.stream);
  if (rit != readers_.end()) {
    std::erase(rit->second.consumers, consumer.id);
    if (consumer.subscriber) {
      rit->second.subscribers.erase(consumer.id);
    } else if (rit->second.members > 0) {
      --rit->second.members;
    }
    if (rit->second.subscribers.empty() && rit->second.members == 0) readers_.erase(rit);
  }
  // Frames that landed in it and wait for the other readers cannot be lent
  // any more: they end with what they had.
  for (auto it = frames_.lower_bound({consumer.id, 0});
       it != frames_.end() && it->first.first == consumer.id;) {
    Frame& f = it->second;
    const FrameKey key = (it++)->first;
    if (!f.landed || !f.waiting) continue;
    f.waiting = false;
    if (f.failure == FL_OK) {
      f.failure = FL_ERR_NO_CONSUMER;
      f.why = "the consumer it landed in went before the other readers on its host had a free slot";
    }
    endIfDone(key);
  }
  retireSegmentOf(consumer.id);
  forgetStreamIfIdle(consumer.stream);
}

void LocalDelivery::retireSegmentOf(uint64_t client_id) {
  for (auto& [cid, lends] : lends_) {
    auto it = lends.holds.find(client_id);
    if (it == lends.holds.end() || it->second != 0) continue;
    lends.holds.erase(it);
    lends.to_retire.push_back(client_id);
  }
}

void LocalDelivery::producerGone(const ClientSession& producer) {
  retireSegmentOf(producer.id);
  forgetStreamIfIdle(producer.stream);
}

void LocalDelivery::forgetStreamIfIdle(const std::string& stream) {
  // A stream no client here uses any more is forgotten (its sequence starts
  // again with the next one): a local user cannot grow the table by
  // attaching on ever new names.
  auto sit = streams_.find(stream);
  if (sit == streams_.end() || !sit->second.waiting.empty() || hasReaders(stream)) return;
  for (const auto& [id, c] : clients_.all()) {
    const ClientSession& s = *c.session;
    if (s.role == FL_ROLE_PRODUCER && !s.gone && s.stream == stream) return;
  }
  streams_.erase(sit);
}

void LocalDelivery::checkDeadlines() {
  checkHolds();
  const uint64_t now = clock_.nowNs();
  for (auto& [name, s] : streams_) {
    while (!s.waiting.empty()) {
      const FrameKey key = s.waiting.front();
      auto fit = frames_.find(key);
      if (fit != frames_.end() && fit->second.waiting && fit->second.deadline_ns > now) break;
      // A drop stream's frame goes on without its stalled subscribers.
      if (fit != frames_.end() && fit->second.waiting && fit->second.drop && deliverOne(s, true)) continue;
      s.waiting.pop_front();
      if (fit == frames_.end() || !fit->second.waiting) continue;
      Frame& f = fit->second;
      f.waiting = false;
      if (f.failure == FL_OK) {
        f.failure = FL_ERR_NO_CONSUMER;
        f.why = "no local consumer of stream '" + f.stream + "' had a free slot within " +
                std::to_string(config_.credit_timeout_ms) + " ms";
      }
      endIfDone(key);
    }
  }
}

}  // namespace framelink
