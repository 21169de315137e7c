// A peer that pulls: it asks the daemon for an offered frame's bytes and
// reads the answer when it likes.  What the daemon sends from a producer's
// slot stays that frame's bytes until the last of them has gone out, even
// when the frame ends first (its ACK deadline passed mid-answer).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "client_util.h"
#include "frame_pattern.h"
#include "harness.h"
#include "hostile_peer.h"
#include "hostile_script.h"
#include "hostile_util.h"

using namespace framelink::integ;
namespace v1 = framelink::v1;
namespace pattern = framelink::pattern;

namespace {

// The source id of the first offer on `stream_id` the peer was sent.
uint64_t awaitOffer(HostilePeer& peer, uint64_t stream_id) {
  uint64_t source = 0;
  REQUIRE(peer.waitFor(
      [&](const PeerInbox& in) {
        countMessages(in, [&](const v1::PeerMessage& m) {
          if (source == 0 && m.has_offer() && m.offer().header().stream_id() == stream_id) {
            source = m.offer().source_id();
          }
          return false;
        });
        return source != 0;
      },
      Millis(5000)));
  return source;
}

}  // namespace

TEST_CASE(
    "hostile peer: a frame that times out while its offer is being answered keeps its slot until the answer "
    "is written, so the answer is the frame's bytes",
    "[integration][hostile_peer]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  // More than loopback's socket buffers and gRPC's windows hold: the answer
  // waits half written while the peer reads nothing.
  constexpr uint64_t kBytes = uint64_t{32} << 20;
  DaemonPair::Options options = pairRoutingTo(transport, "hostile-reader");
  options.extra_args_b.insert(options.extra_args_b.end(), {"--ack-timeout-ms", "1000"});
  DaemonPair pair(options);
  HostilePeer peer(peerOf(pair, "hostile-reader", 12, transport));
  peer.readSession();
  Client producer = attachProducer(pair.b(), "hp-torn", 1, kBytes);
  const uint64_t stream = awaitStreamOpen(peer, "hp-torn");
  v1::PeerMessage pull_grant = grant(stream, 1, 1, kBytes);
  pull_grant.mutable_credit_grant()->set_pull(true);
  REQUIRE(peer.sendControl(pull_grant));
  // The offer comes in a control record on the data channel: read up to it.
  peer.readDataUntil([](const PeerInbox& in) {
    return countMessages(in, [](const v1::PeerMessage& m) { return m.has_offer(); }) > 0;
  });
  submitFrame(producer.get(), 1, kBytes);
  const uint64_t source = awaitOffer(peer, stream);
  REQUIRE(peer.askRead(source, 77, kBytes));

  // The ACK deadline passes while the answer is stuck in the socket.  A
  // completion now would give the producer its slot back under bytes that
  // have yet to go out: it writes its next frame there, as producers do.
  const std::vector<fl_completion> early = collectCompletions(producer.get(), 1, Millis(2500));
  if (!early.empty()) submitFrame(producer.get(), 2, kBytes);

  peer.resumeData();
  REQUIRE(
      peer.waitFor([](const PeerInbox& in) { return !in.answers.empty() || in.data_ended; }, Millis(20000)));
  const PeerInbox in = peer.inbox();
  REQUIRE(in.answers.size() == 1);
  const ReadAnswered& answer = in.answers[0];
  CHECK(answer.read_id == 77);
  CHECK(answer.known);
  REQUIRE(answer.bytes->size() == kBytes);
  const size_t wrong =
      pattern::verifyPattern(1, reinterpret_cast<const uint8_t*>(answer.bytes->data()), answer.bytes->size());
  INFO("completions while the answer was half written: "
       << early.size() << " (status " << (early.empty() ? "-" : statusName(early[0].status))
       << "); first byte not the frame's: " << wrong);
  CHECK(early.empty());
  CHECK(wrong == pattern::kNpos);
  // Written out, the frame ends as it had to: no ACK came in time.
  if (early.empty()) {
    const std::vector<fl_completion> late = collectCompletions(producer.get(), 1, Millis(5000));
    REQUIRE(late.size() == 1);
    CHECK(late[0].status == FL_ERR_TIMEOUT);
  }
  CHECK(pair.b().alive());
}
