// The grpc transport's batches: small frames queued together travel in one
// DataMessage, and only on a link whose peer said it reads them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/grpc/grpc_wire.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {
namespace {

// Mostly small frames, some empty, and two too large to share a message.
size_t frameSize(size_t i) {
  if (i == 150 || i == 151) return (size_t{256} << 10) + 1;
  if (i % 17 == 0) return 0;
  return 1 + splitmix64(i) % 6000;
}

}  // namespace

TEST_CASE("grpc: small frames queued together share a message once the peer reads batches, never before",
          "[transport][grpc]") {
  const bool batches = GENERATE(false, true);
  CAPTURE(batches);
  TransportPairOptions options;
  options.grpc_frame_batches = batches;
  auto made = TransportPair::make(TransportKind::kGrpc, options);
  REQUIRE(made.ok());
  std::unique_ptr<TransportPair> pair = std::move(made).value();
  g_pair = pair.get();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};

  constexpr size_t kFrames = 400;
  std::vector<Buffer> buffers;
  std::vector<RemoteCredit> credits;
  std::vector<Payload> payloads;
  for (size_t i = 0; i < kFrames; ++i) {
    buffers.emplace_back(frameSize(i));
    credits.push_back(expose(*rx.t, buffers.back().credit(i + 1)));
    payloads.push_back(pattern(i, frameSize(i)));
  }
  // Posted as fast as the transport takes them: the sender finds the ones
  // queued while it wrote the last message.
  size_t posted = 0;
  while (posted < kFrames) {
    const PostResult r = tx.post(request(posted, credits[posted], payloads[posted], posted + 1));
    if (r == PostResult::kBackpressure) {
      tx.pump();
      awaitEvents(tx, rx, 1);
      continue;
    }
    REQUIRE(r == PostResult::kOk);
    ++posted;
  }
  waitFor(
      tx, rx, [&] { return tx.sends.size() == kFrames && rx.arrivals.size() == kFrames; },
      "every frame sent and arrived");
  REQUIRE(tx.errors.empty());
  REQUIRE(rx.errors.empty());
  for (size_t i = 0; i < kFrames; ++i) {
    CAPTURE(i);
    REQUIRE(tx.sends[i].status == FL_OK);
    REQUIRE(tx.sends[i].cookie == i);  // completions in posting order
    const TransportEvent& got = rx.arrivals[i];
    REQUIRE(got.status == FL_OK);
    REQUIRE(got.header.sequence == i + 1);  // arrivals in posting order
    REQUIRE(got.header.length == frameSize(i));
    const long bad = firstMismatch(buffers[i].data(), payloads[i]);
    if (bad != -1) FAIL("frame " << i << " differs at byte " << bad);
  }
  const TransportCounters sent = tx.t->counters();
  INFO("batched sends " << sent.batched_sends << ", frames in them " << sent.batched_frames);
  CHECK(sent.frames_sent == kFrames);
  CHECK(rx.t->counters().frames_received == kFrames);
  if (!batches) {
    CHECK(sent.batched_sends == 0);
    CHECK(sent.batched_frames == 0);
  } else {
    CHECK(sent.batched_sends > 0);
    CHECK(sent.batched_frames >= 2 * sent.batched_sends);
    CHECK(sent.batched_frames <= kFrames - 2);  // the two large frames went alone
    CHECK(sent.batched_frames / sent.batched_sends <= kMaxBatchFrames);
  }
  g_pair = nullptr;
}

}  // namespace framelink::transport::testing
