#include "agent/agent_state.h"

#include <algorithm>

#include "agent/peer_messages.h"

namespace framelink {

bool isPerFrameMessage(const v1::PeerMessage& message) {
  switch (message.body_case()) {
    case v1::PeerMessage::kCreditGrant:
    case v1::PeerMessage::kCreditRevoke:
    case v1::PeerMessage::kCreditLow:
    case v1::PeerMessage::kAck:
    case v1::PeerMessage::kNack:
    case v1::PeerMessage::kOffer:
      return true;
    default:
      return false;
  }
}

void AgentLink::send(v1::PeerMessage message) {
  if (!isPerFrameMessage(message)) {
    session.writer->send(std::move(message));
    return;
  }
  if (message.has_credit_grant() && static_cast<size_t>(message.credit_grant().credits_size()) +
                                            message.credit_grant().slot_credits_size() >
                                        kMaxCreditsPerGrant) {
    // Split so that every record stays small; the regions go first, before
    // any slot credit that names them.
    const auto& grant = message.credit_grant();
    const int step = static_cast<int>(kMaxCreditsPerGrant);
    auto part = [&grant](bool first) {
      v1::PeerMessage m;
      auto* g = m.mutable_credit_grant();
      g->set_stream_id(grant.stream_id());
      g->set_largest_slot(grant.largest_slot());
      g->set_pull(grant.pull());
      if (first) *g->mutable_regions() = grant.regions();
      return m;
    };
    for (int i = 0; i < grant.slot_credits_size(); i += step) {
      v1::PeerMessage m = part(i == 0);
      const int end = std::min(grant.slot_credits_size(), i + step);
      m.mutable_credit_grant()->mutable_slot_credits()->Add(grant.slot_credits().begin() + i,
                                                            grant.slot_credits().begin() + end);
      send(std::move(m));
    }
    for (int i = 0; i < grant.credits_size(); i += step) {
      v1::PeerMessage m = part(i == 0 && grant.slot_credits_size() == 0);
      const int end = std::min(grant.credits_size(), i + step);
      for (int k = i; k < end; ++k) *m.mutable_credit_grant()->add_credits() = grant.credits(k);
      send(std::move(m));
    }
    return;
  }
  if (message.has_credit_revoke() &&
      static_cast<size_t>(message.credit_revoke().credit_ids_size()) > peer::kMaxAcksPerMessage) {
    const auto& revoke = message.credit_revoke();
    for (int i = 0; i < revoke.credit_ids_size(); i += static_cast<int>(peer::kMaxAcksPerMessage)) {
      v1::PeerMessage part;
      auto* r = part.mutable_credit_revoke();
      r->set_stream_id(revoke.stream_id());
      r->set_returned(revoke.returned());
      const int end = std::min(revoke.credit_ids_size(), i + static_cast<int>(peer::kMaxAcksPerMessage));
      for (int k = i; k < end; ++k) r->add_credit_ids(revoke.credit_ids(k));
      if (end == revoke.credit_ids_size()) *r->mutable_retired_regions() = revoke.retired_regions();
      send(std::move(part));
    }
    return;
  }
  const uint64_t acked = message.has_ack() ? peer::ackFrames(message.ack()) : 0;
  if (control_bytes >= kMaxControlRecordBytes ||
      (acked > 0 && control_ack_frames + acked > peer::kMaxAckFramesPerRecord)) {
    cutRecord();
  }
  control_bytes += message.ByteSizeLong() + 4;  // + the field's tag and length
  control_ack_frames += acked;
  control.add_messages()->Swap(&message);
}

void AgentLink::cutRecord() {
  if (control.messages_size() == 0) return;
  control_out_.push_back(control.SerializeAsString());
  control_out_bytes_ += control_out_.back().size();
  control.Clear();
  control_bytes = 0;
  control_ack_frames = 0;
}

size_t AgentLink::flushControl(std::string* failed) {
  cutRecord();
  size_t handed = 0;
  while (!control_out_.empty() && transport != nullptr) {
    const size_t size = control_out_.front().size();
    // A copy: a record refused for backpressure stays queued.
    const transport::PostResult r = transport->postControl(control_out_.front());
    if (r == transport::PostResult::kBackpressure) break;  // kept; tried again next round
    control_out_.pop_front();
    control_out_bytes_ -= size;
    if (r == transport::PostResult::kOk) {
      ++handed;
    } else if (r == transport::PostResult::kInvalid) {
      *failed = "the transport refused a control record of " + std::to_string(size) + " bytes";
      break;
    }
    // kNotConnected: the link is going down; what it would have said is lost
    // with it, as on a broken Session (replay recovers the frames).
  }
  if (failed->empty() && control_out_bytes_ > kMaxControlQueueBytes) {
    *failed = "the peer has not read its control records: " + std::to_string(control_out_bytes_) +
              " bytes of them wait beyond what its transport holds (at most " +
              std::to_string(kMaxControlQueueBytes) + ")";
  }
  if (!failed->empty()) {
    control_out_.clear();
    control_out_bytes_ = 0;
  }
  if (handed > 0) transport->flush();
  return handed;
}

namespace {

// An index for a new entry of `entries`: the last one freed, else a new one
// at the end (NameTable and PeerTable reuse the ids of what they forgot).
template <typename Id, typename Entry>
Id takeId(std::vector<Id>& free, std::vector<Entry>& entries) {
  if (!free.empty()) {
    const Id id = free.back();
    free.pop_back();
    return id;
  }
  entries.emplace_back();
  return static_cast<Id>(entries.size() - 1);
}

}  // namespace

NameKey NameTable::acquire(const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    ++entries_[it->second].users;
    return it->second;
  }
  const NameKey key = takeId(free_, entries_);
  entries_[key].name = name;
  entries_[key].users = 1;
  by_name_.emplace(name, key);
  return key;
}

void NameTable::release(NameKey key) {
  if (key >= entries_.size() || entries_[key].users == 0) return;
  Entry& e = entries_[key];
  if (--e.users > 0) return;
  by_name_.erase(e.name);
  e.name.clear();
  free_.push_back(key);
}

PeerId PeerTable::resolve(const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  const PeerId id = takeId(free_, peers_);
  peers_[id] = PeerEntry{name};
  by_name_.emplace(name, id);
  return id;
}

void PeerTable::forget(PeerId id) {
  if (id >= peers_.size() || by_name_.erase(peers_[id].name) == 0) return;
  peers_[id] = PeerEntry{};
  free_.push_back(id);
}

}  // namespace framelink
