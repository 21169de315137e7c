// An adversarial peer: records no honest agent would write, put on a link
// as if the agent at one end had written them -- ACKs and NACKs for
// sequences never sent, CreditRevokes of credits never granted, messages
// for streams never opened, and genuine records sent again later (duplicated
// and out of order).  The honest side may end the link for it; it must not
// crash, spin, or report DELIVERED for a frame no consumer released (the
// checks after every step stay the same).  Forgeries stay out of what an
// honest end cannot tell from the truth: an ACK for a frame that was sent
// but has not landed would be believed by any protocol that trusts its peer.
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
  const uint64_t kind = rng_.below(6);
  if (kind == 5) {
    const std::string& again = link.end[from]->recent(rng_.next());
    if (again.empty()) return;
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

}  // namespace framelink::sim
