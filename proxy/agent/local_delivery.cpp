#include "agent/local_delivery.h"

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

#include "agent/agent_stats.h"
#include "attach/send_fds.h"
#include "framelink/attach_proto.h"
#include "framelink/framelink.h"

namespace framelink {

LocalDelivery::LocalDelivery(const Config& config, Metrics& metrics, const AgentClock& clock,
                             ClientTable& clients, EndFrame end)
    : config_(config), metrics_(metrics), clock_(clock), clients_(clients), end_(std::move(end)) {}

bool LocalDelivery::hasReaders(const std::string& stream) const {
  for (const auto& [id, c] : clients_.all()) {
    const ClientSession& s = *c.session;
    if (s.role == FL_ROLE_CONSUMER && !s.gone && s.stream == stream) return true;
  }
  return false;
}

size_t LocalDelivery::waitingFrames() const {
  size_t n = 0;
  for (const auto& [name, s] : streams_) n += s.waiting.size();
  return n;
}

void LocalDelivery::submit(AgentClient& producer, uint32_t slot, const fl_slot_header& header,
                           uint64_t length) {
  ClientSession& p = *producer.session;
  Stream& s = streams_[p.stream];
  Frame& f = frames_[{p.id, slot}];
  f = Frame{};
  f.producer = p.id;
  f.slot = slot;
  f.stream = p.stream;
  f.header = header;
  f.length = length;
  f.sequence = s.next_sequence++;
  f.deadline_ns = clock_.nowNs() + uint64_t{config_.credit_timeout_ms} * 1'000'000ULL;
  f.copy = std::find(config_.copy_streams.begin(), config_.copy_streams.end(), p.stream) !=
           config_.copy_streams.end();
  SlotEntry& e = p.slots[slot];
  e.state = SlotState::kLent;
  e.sequence = f.sequence;
  e.length = length;
  e.frame_id = header.frame_id;
  e.submitted_ns = clock_.nowNs();
  ++p.in_progress;
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
               std::to_string(crc) + "): the slot changed after the CRC was computed");
      return;
    }
  }
  s.waiting.emplace_back(p.id, slot);
  deliverOne(s);
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

bool LocalDelivery::deliverOne(Stream& s) {
  while (!s.waiting.empty()) {
    auto fit = frames_.find(s.waiting.front());
    AgentClient* producer = fit == frames_.end() ? nullptr : clients_.find(fit->second.producer);
    if (producer == nullptr || producer->session->slots[fit->second.slot].state != SlotState::kLent) {
      s.waiting.pop_front();  // ended meanwhile (the daemon is shutting down)
      if (fit != frames_.end()) frames_.erase(fit);
      continue;
    }
    Frame& f = fit->second;
    // Every subscriber and one member of the queue group, each with a free
    // slot, or the frame waits: block, never skip a reader.
    std::vector<std::pair<ClientSession*, int>> readers;
    std::vector<ClientSession*> members;
    for (auto& [id, c] : clients_.all()) {
      ClientSession& r = *c.session;
      if (r.role != FL_ROLE_CONSUMER || r.gone || r.stream != f.stream) continue;
      if (!r.subscriber) {
        members.push_back(&r);
        continue;
      }
      const int slot = freeSlot(r);
      if (slot < 0) return false;
      readers.emplace_back(&r, slot);
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
    if (readers.empty()) return false;  // nobody reads it (yet): it waits for its deadline
    s.waiting.pop_front();
    for (auto& [r, slot] : readers) deliverTo(f, *producer, *r, static_cast<uint32_t>(slot));
    endIfDone({f.producer, f.slot});
    return true;
  }
  return false;
}

void LocalDelivery::deliverTo(Frame& f, AgentClient& producer, ClientSession& r, uint32_t rs) {
  ClientSession& p = *producer.session;
  ++f.readers;
  fl_slot_header h = f.header;
  h.length = f.length;
  h.sequence = f.sequence;
  h.flags = f.header.flags & FL_SLOT_HAS_CRC32C;  // checked at submit
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
  SlotEntry& e = r.slots[rs];
  e = SlotEntry{};
  e.state = SlotState::kDelivered;
  e.sequence = f.sequence;
  e.length = f.length;
  e.frame_id = f.header.frame_id;
  e.local_from = p.id;
  e.local_slot = f.slot;
  ++f.readers_out;
  ++r.frames;
  r.bytes += f.length;
  metrics_.counters.frames_received.fetch_add(1, std::memory_order_relaxed);
  metrics_.counters.bytes_received.fetch_add(f.length, std::memory_order_relaxed);
  clients_.complete(r, rs, FL_OK, f.sequence, f.length, f.header.frame_id);
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
  if (p.segments->readOnlyDataFd() < 0 || !r.socket.valid()) return false;
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

void LocalDelivery::readerGone(ClientSession& consumer, uint32_t slot) {
  readerDone(consumer, slot, FL_ERR_NO_CONSUMER, "a local consumer died before releasing the frame");
}

void LocalDelivery::readerDone(ClientSession& consumer, uint32_t slot, int status, const std::string& why) {
  const SlotEntry& e = consumer.slots[slot];
  const FrameKey key{e.local_from, e.local_slot};
  auto lit = lends_.find(consumer.id);
  if (lit != lends_.end()) {
    auto hit = lit->second.holds.find(e.local_from);
    if (hit != lit->second.holds.end() && hit->second > 0 && --hit->second == 0) {
      const AgentClient* p = clients_.find(e.local_from);
      if (p == nullptr || p->session->gone) {
        lit->second.holds.erase(hit);
        lit->second.to_retire.push_back(e.local_from);
      }
    }
  }
  auto fit = frames_.find(key);
  if (fit == frames_.end() || fit->second.sequence != e.sequence || fit->second.readers_out == 0) return;
  Frame& f = fit->second;
  --f.readers_out;
  if (status != FL_OK && f.failure == FL_OK) {
    f.failure = status;
    f.why = why;
  }
  endIfDone(key);
}

void LocalDelivery::endIfDone(const FrameKey& key) {
  auto fit = frames_.find(key);
  if (fit == frames_.end() || fit->second.readers_out > 0) return;
  const Frame f = std::move(fit->second);
  frames_.erase(fit);
  AgentClient* p = clients_.find(f.producer);
  if (p == nullptr || p->session->slots[f.slot].state != SlotState::kLent ||
      p->session->slots[f.slot].sequence != f.sequence) {
    return;
  }
  end_(*p, f.slot, f.failure, f.why);
}

void LocalDelivery::consumerGone(const ClientSession& consumer) { lends_.erase(consumer.id); }

void LocalDelivery::producerGone(const ClientSession& producer) {
  for (auto& [cid, lends] : lends_) {
    auto it = lends.holds.find(producer.id);
    if (it == lends.holds.end() || it->second != 0) continue;
    lends.holds.erase(it);
    lends.to_retire.push_back(producer.id);
  }
  // A stream no producer here uses any more is forgotten (its sequence
  // starts again with the next one): a local user cannot grow the table by
  // producing on ever new names.
  auto sit = streams_.find(producer.stream);
  if (sit == streams_.end() || !sit->second.waiting.empty()) return;
  for (const auto& [id, c] : clients_.all()) {
    const ClientSession& s = *c.session;
    if (s.role == FL_ROLE_PRODUCER && !s.gone && s.id != producer.id && s.stream == producer.stream) return;
  }
  streams_.erase(sit);
}

void LocalDelivery::checkDeadlines() {
  const uint64_t now = clock_.nowNs();
  for (auto& [name, s] : streams_) {
    while (!s.waiting.empty()) {
      auto fit = frames_.find(s.waiting.front());
      if (fit != frames_.end() && fit->second.deadline_ns > now) break;
      s.waiting.pop_front();
      if (fit == frames_.end()) continue;
      const Frame f = std::move(fit->second);
      frames_.erase(fit);
      AgentClient* p = clients_.find(f.producer);
      if (p == nullptr || p->session->slots[f.slot].state != SlotState::kLent) continue;
      end_(*p, f.slot, FL_ERR_NO_CONSUMER,
           "no local consumer of stream '" + f.stream + "' had a free slot within " +
               std::to_string(config_.credit_timeout_ms) + " ms");
    }
  }
}

}  // namespace framelink
