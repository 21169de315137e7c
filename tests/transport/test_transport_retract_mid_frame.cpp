// A credit retracted while its frame is landing, on the transports whose
// receiver copies a frame in parts and can stop between two of them: tcp
// (it reads the socket a budget at a time) and grpc (one chunk per message).
// The daemon gives the slot to another frame as soon as it retracted the
// credit, so not one byte of the rest may land in the buffer: the rest is
// read and dropped, the frame is reported as for an unknown credit, and the
// link stays in step for the next frame.  loopback lands a frame in one
// step, and an rdma write cannot be stopped (its buffer is kept mapped for
// that, see the conformance suite's retracted-credit test).
//
// Each flavor is a receiver plus a peer that can stop in the middle of a
// frame and let the test act there:
//   * tcp: the real sender, and a receiver whose poll() reads at most
//     16 KiB; the test polls the receiver one call at a time until the
//     first bytes of the frame are in the buffer (tcp copies on the
//     calling thread, so the test may look at the buffer meanwhile).
//   * grpc: a raw Link.Data client that writes the chunks itself, with a
//     control record right behind the first one.  The receiver handles a
//     stream's messages in order, so once that record arrived the first
//     chunk is in the buffer.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <catch2/catch.hpp>

#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/grpc/grpc_wire.h"
#include "transport/transport.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {
namespace {

constexpr size_t kFrameBytes = size_t{1} << 20;

bool pastDeadline(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::steady_clock::now() > deadline;
}

class TcpMidFrame {
 public:
  static constexpr size_t kReadBudget = size_t{16} << 10;
  // Bytes of the frame in the buffer once beginFrame() returned; one poll
  // reads at most kReadBudget, so far less than the frame has landed then.
  static constexpr size_t kFirstPart = size_t{4} << 10;

  TcpMidFrame() : pair_(makeTcp()), tx_{pair_->a.get()}, rx{pair_->b.get()} {}

  void beginFrame(const RemoteCredit& credit, const Payload& payload, uint64_t sequence, const Buffer& into) {
    REQUIRE(tx_.post(request(sequence, credit, payload, sequence)) == PostResult::kOk);
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (std::memcmp(into.data(), payload.data(), kFirstPart) != 0) {
      if (pastDeadline(deadline)) FAIL("the first part of the frame never landed");
      tx_.pump();
      awaitEvents(tx_, rx, 10);
      rx.pumpOnce();
    }
  }
  void finishFrame() {}  // the sender goes on by itself
  void sendFrame(const RemoteCredit& credit, const Payload& payload, uint64_t sequence) {
    REQUIRE(tx_.post(request(sequence, credit, payload, sequence)) == PostResult::kOk);
  }
  // Also waits for the sends: a payload is read until its SendComplete.
  void waitArrivals(size_t n) {
    waitFor(
        tx_, rx, [&] { return !rx.errors.empty() || (rx.arrivals.size() >= n && tx_.sends.size() >= n); },
        std::to_string(n) + " frames");
  }

 private:
  static std::unique_ptr<TransportPair> makeTcp() {
    TransportPairOptions options;
    options.tcp_read_budget_bytes = kReadBudget;
    auto made = TransportPair::make(TransportKind::kTcp, options);
    if (!made) FAIL("cannot build a tcp pair: " << made.error().message);
    g_pair = made.value().get();
    return std::move(made).value();
  }

  std::unique_ptr<TransportPair> pair_;
  Endpoint tx_;

 public:
  Endpoint rx;
};

class GrpcMidFrame {
 public:
  static constexpr size_t kChunk = size_t{64} << 10;
  static constexpr size_t kFirstPart = kChunk;

  GrpcMidFrame() {
    g_pair = nullptr;  // a raw peer: no pair to register memory with
    auto started = GrpcTestServer::start(kToken, kDefaultGrpcChunkBytes);
    if (!started) FAIL("cannot start the grpc test server: " << started.error().message);
    server_ = std::move(started).value();
    channel_ = grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(),
                                         channelArguments(kDefaultGrpcChunkBytes));
    context_.AddMetadata(kTokenMetadataKey, kToken);
    stream_ = openRawDataCall(channel_, &context_);
    REQUIRE(stream_->Write(encodeSessionId(GrpcTestServer::kSessionId)));
    REQUIRE(server_->adopted().wait_for(kDeadline) == std::future_status::ready);
    receiver_ = server_->adopted().get();
    rx.t = receiver_.get();
  }
  ~GrpcMidFrame() {
    receiver_->shutdown();  // cancels the call: the client's reads end
    grpc::ByteBuffer ignored;
    while (stream_->Read(&ignored)) {
    }
    stream_->Finish();
  }
  GrpcMidFrame(const GrpcMidFrame&) = delete;
  GrpcMidFrame& operator=(const GrpcMidFrame&) = delete;

  void beginFrame(const RemoteCredit& credit, const Payload& payload, uint64_t sequence, const Buffer& into) {
    header_ = request(sequence, credit, payload, sequence).header;
    payload_ = &payload;
    writeChunk(&header_, 0);
    REQUIRE(stream_->Write(encodeControl("behind the first chunk")));
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (rx.controls.empty() && rx.errors.empty()) {
      if (pastDeadline(deadline)) FAIL("the control record behind the first chunk never arrived");
      readable(rx.t->eventFd(), 10);
      rx.pump();
    }
    REQUIRE(rx.errors.empty());
    REQUIRE(std::memcmp(into.data(), payload.data(), kFirstPart) == 0);
  }
  void finishFrame() {
    for (uint64_t offset = kChunk; offset < payload_->size(); offset += kChunk) writeChunk(nullptr, offset);
  }
  void sendFrame(const RemoteCredit& credit, const Payload& payload, uint64_t sequence) {
    header_ = request(sequence, credit, payload, sequence).header;
    payload_ = &payload;
    writeChunk(&header_, 0);
    finishFrame();
  }
  void waitArrivals(size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (rx.arrivals.size() < n && rx.errors.empty()) {
      if (pastDeadline(deadline)) FAIL("timed out waiting for " << n << " frames");
      readable(rx.t->eventFd(), 10);
      rx.pump();
    }
  }

 private:
  static constexpr char kToken[] = "mid-frame-token";

  // The chunk of the current frame at `offset`, as the grpc sender writes it.
  void writeChunk(const FrameHeader* header, uint64_t offset) {
    const size_t n = std::min<size_t>(kChunk, payload_->size() - offset);
    std::string prefix;
    encodeChunkPrefix(header, offset, offset + n == payload_->size(), n, &prefix);
    grpc::Slice slices[2] = {grpc::Slice(prefix), grpc::Slice(payload_->data() + offset, n)};
    REQUIRE(stream_->Write(grpc::ByteBuffer(slices, n > 0 ? 2 : 1)));
  }

  std::unique_ptr<GrpcTestServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext context_;
  std::unique_ptr<RawClientDataStream> stream_;
  std::shared_ptr<GrpcTransport> receiver_;
  FrameHeader header_;
  const Payload* payload_ = nullptr;

 public:
  Endpoint rx;
};

}  // namespace

TEMPLATE_TEST_CASE("a credit retracted while its frame lands: the rest is dropped, the buffer is not written",
                   "[transport][retract]", TcpMidFrame, GrpcMidFrame) {
  TestType peer;
  Endpoint& rx = peer.rx;
  Buffer slot(kFrameBytes);
  const RemoteCredit credit = expose(*rx.t, slot.credit(50));
  const Payload payload = pattern(5, kFrameBytes);
  peer.beginFrame(credit, payload, 1, slot);
  REQUIRE(rx.arrivals.empty());

  // As the daemon does after a recall: the credit goes, and the slot is
  // given to another frame at once, which fills it.
  rx.t->retractCredit(50);
  std::memset(slot.data(), 0xAA, slot.size());
  peer.finishFrame();
  peer.waitArrivals(1);
  REQUIRE(rx.errors.empty());
  REQUIRE(rx.arrivals.size() == 1);
  CHECK(rx.arrivals[0].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(rx.arrivals[0].header.credit_id == 50u);
  CHECK(rx.arrivals[0].header.sequence == 1u);
  const auto* first_written =
      std::find_if(slot.data(), slot.data() + slot.size(), [](uint8_t b) { return b != 0xAA; });
  CHECK(first_written - slot.data() == static_cast<long>(slot.size()));
  CHECK(rx.t->counters().unknown_credit_frames == 1);
  CHECK(rx.t->counters().frames_received == 0);

  // The rest was read, not left in the stream: the next frame lands whole.
  Buffer next(kFrameBytes);
  const RemoteCredit next_credit = expose(*rx.t, next.credit(51));
  const Payload next_payload = pattern(6, kFrameBytes);
  peer.sendFrame(next_credit, next_payload, 2);
  peer.waitArrivals(2);
  REQUIRE(rx.errors.empty());
  REQUIRE(rx.arrivals.size() == 2);
  CHECK(rx.arrivals[1].status == FL_OK);
  CHECK(rx.arrivals[1].header.sequence == 2u);
  CHECK(firstMismatch(next.data(), next_payload) == -1);
  CHECK(rx.t->connected());
}

}  // namespace framelink::transport::testing
