// An adversarial peer: records no honest agent would write, put on a link
// as if the agent at one end had written them -- ACKs and NACKs for
// sequences never sent, CreditRevokes of credits never granted, messages
// for streams never opened, and genuine records sent again later (duplicated
// and out of order).  The honest side may end the link for it; it must not
// crash, spin, or report DELIVERED for a frame no consumer released (the
// checks after every step stay the same).  Forgeries stay out of what an
// honest end cannot tell from the truth: an ACK for a frame that was sent
// but has not landed would be believed by any protocol that trusts its peer.
//
// When the stream is pulled the sender's end also answers reads late (from
// the bytes its offer held when the read was asked, whatever it retracts
// later, at a later step or when the world heals) -- while the dialer dials
// again, so that the stream moves to the newer link, or after the sender
// claims to have closed the stream and opened it again -- and answers a
// read twice.  A late answer lands in the
// slot it was asked for whenever it comes: a consumer's frame must never be
// in that slot by then (World::checkIntact at every release).  The grant
// records of a pulling receiver are not sent again: their whole credits,
// used already, would be refused to every offer and fail frames after the
// healing (a pushed grant's region announced again breaks the link instead).
#include <algorithm>
#include <string>

#include "framelink/v1/link.pb.h"
#include "world.h"

namespace framelink::sim {
namespace {

// Far beyond any sequence a schedule reaches, and ids no grant hands out.
constexpr uint64_t kNeverSent = uint64_t{1} << 40;

v1::ErrorCode nackCode(uint64_t r) {
  static const v1::ErrorCode kCodes[] = {v1::ERROR_CODE_CRC_MISMATCH, v1::ERROR_CODE_TIMEOUT,
                                         v1::ERROR_CODE_PEER_REJECTED, v1::ERROR_CODE_TOO_LARGE,
                                         v1::ERROR_CODE_UNKNOWN_STREAM};
  return kCodes[r % (sizeof kCodes / sizeof kCodes[0])];
}

}  // namespace

void World::forge() {
  std::vector<Link*> up = upLinks();
  if (up.empty()) return;
  Link& link = *up[rng_.below(up.size())];
  const int from = static_cast<int>(rng_.below(2));  // the end that seems to write it
  const uint64_t kind = rng_.below(pull_ ? 10 : 6);
  if (kind >= 6) {
    if (forgeRead(link, kind)) ++result_.forged;
    return;
  }
  if (kind == 5) {
    const std::string& again = link.end[from]->recent(rng_.next());
    if (again.empty()) return;
    if (v1::ControlBatch record; pull_ && from == 1 && record.ParseFromString(again) &&
                                 std::any_of(record.messages().begin(), record.messages().end(),
                                             [](const v1::PeerMessage& m) { return m.has_credit_grant(); })) {
      return;
    }
    link.end[from]->inject(again);
    ++result_.forged;
    note("forged on link " + std::to_string(link.id) + " from end " + std::to_string(from) +
         ": an earlier record again");
    return;
  }
  v1::ControlBatch batch;
  const uint64_t stream = rng_.chance(70) ? 1 : 2 + rng_.below(1000);
  const int count = 1 + static_cast<int>(rng_.below(3));
  for (int i = 0; i < count; ++i) {
    v1::PeerMessage& m = *batch.add_messages();
    const uint64_t seq = kNeverSent + rng_.below(1000);
    switch (kind) {
      case 0:
        m.mutable_ack()->set_stream_id(stream);
        m.mutable_ack()->add_sequences(seq);
        break;
      case 1:
        m.mutable_ack()->set_stream_id(stream);
        m.mutable_ack()->add_runs(seq);
        m.mutable_ack()->add_runs(2 + rng_.below(64));
        break;
      case 2:
        m.mutable_nack()->set_stream_id(stream);
        m.mutable_nack()->set_sequence(seq);
        m.mutable_nack()->set_code(nackCode(rng_.next()));
        m.mutable_nack()->set_message("forged");
        break;
      case 3:
        m.mutable_credit_revoke()->set_stream_id(stream);
        m.mutable_credit_revoke()->add_credit_ids(kNeverSent + rng_.next() % kNeverSent);
        m.mutable_credit_revoke()->set_returned(rng_.chance(50));
        break;
      default:
        m.mutable_credit_low()->set_stream_id(stream);
        break;
    }
  }
  link.end[from]->inject(batch.SerializeAsString());
  ++result_.forged;
  note("forged on link " + std::to_string(link.id) + " from end " + std::to_string(from) + ": " +
       describe(batch.messages(0)) + (count > 1 ? " and more" : ""));
}

bool World::forgeRead(Link& link, uint64_t kind) {
  const std::string on = "on link " + std::to_string(link.id) + ": ";
  if (kind == 9) {
    size_t landed = 0;
    for (size_t n = 1 + rng_.below(3); n > 0 && link.pair.link->deliverLate(1); --n) ++landed;
    if (landed == 0) return false;
    note("forged " + on + std::to_string(landed) + " late answers to reads land");
    return true;
  }
  if (kind == 8) {
    if (!link.pair.link->answerAgain(1)) return false;
    note("forged " + on + "the sender's end answers a read twice");
    return true;
  }
  if (kind == 6) {
    // The dialer dials again while the reads are out: the stream moves to
    // the newer link, and the old one's answers come after.
    const bool moves = !link.dialer_gone && liveLink(link.sender, link.receiver) == &link &&
                       upLinks().size() < 4 * receivers_.size();
    const size_t late = link.pair.link->keepReads(1, moves);
    if (late == 0) return false;
    note("forged " + on + "the sender's end answers its " + std::to_string(late) + " reads out " +
         (moves ? "late" : "whatever it retracts"));
    if (moves) replaceLink(link);
    return true;
  }
  // The sender says it closed the stream and opens it again; the answers to
  // the reads that were out come after.
  if (link.stream_id == 0 || link.dialer_gone || ackOwed(link.sender, link.receiver)) return false;
  const size_t late = link.pair.link->keepReads(1, true);
  if (late == 0) return false;
  note("forged " + on + "the sender's end answers its " + std::to_string(late) + " reads out late");
  closeAndReopen(link);
  return true;
}

void World::closeAndReopen(Link& link) {
  // Only while the receiver forgets nothing the sender still needs (the
  // caller checks ackOwed): what it remembers of a stream the sender closed
  // goes, and it would answer a replay of a released frame whose ACK is lost
  // with the link as a new frame -- the sender's own loss for its lie, not
  // one a consumer may see here.
  auto close = std::make_shared<v1::PeerMessage>();
  close->mutable_stream_close()->set_stream_id(link.stream_id);
  auto open = std::make_shared<v1::PeerMessage>();
  open->mutable_stream_open()->set_stream_id(link.stream_id);
  open->mutable_stream_open()->set_name(kStream);
  note("forged on link " + std::to_string(link.id) + " from end 0: " + describe(*close) + ", then " +
       describe(*open));
  daemons_[link.receiver].agent->post(CmdPeerMessage{link.id, std::move(close)});
  daemons_[link.receiver].agent->post(CmdPeerMessage{link.id, std::move(open)});
}

bool World::ackOwed(int sender, int receiver) const {
  const uint64_t live = daemons_[receiver].instance;
  for (const auto& [frame, rec] : frames_) {
    if (rec.sender != sender || rec.outcome_known) continue;
    for (const Release& r : rec.released_on) {
      if (r.daemon == receiver && r.instance == live) return true;
    }
  }
  return false;
}

}  // namespace framelink::sim
