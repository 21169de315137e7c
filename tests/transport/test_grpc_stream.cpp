// The grpc transport's handling of rejected calls and of malformed chunk
// sequences (the sender side never produces these).
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/grpc/grpc_wire.h"
#include "transport_pair.h"

namespace framelink::transport::testing {
namespace {

using namespace std::chrono_literals;
using framelink::v1::DataMessage;

TransportEvent waitEvent(Transport& t) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  TransportEvent ev;
  while (t.poll(&ev, 1) == 0) {
    if (std::chrono::steady_clock::now() > deadline) FAIL("no event from the transport");
    pollfd p{t.eventFd(), POLLIN, 0};
    ::poll(&p, 1, 10);
  }
  return ev;
}

}  // namespace

TEST_CASE("grpc dial with a wrong token ends in LinkError FL_ERR_AUTH", "[transport][grpc]") {
  auto server = GrpcTestServer::start("right", kDefaultGrpcChunkBytes);
  REQUIRE(server.ok());
  auto channel = grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(),
                                           channelArguments(kDefaultGrpcChunkBytes));
  auto t = GrpcTransport::connect(channel, (*server)->queue(), GrpcTestServer::kSessionId, "wrong");
  REQUIRE(t.ok());
  TransportEvent ev = waitEvent(**t);
  CHECK(ev.kind == TransportEvent::Kind::kLinkError);
  CHECK(ev.status == FL_ERR_AUTH);
  INFO(ev.message);
  CHECK((*t)->post(SendRequest{}) == PostResult::kNotConnected);
}

TEST_CASE("grpc receiver treats malformed chunk sequences as protocol violations", "[transport][grpc]") {
  auto server = GrpcTestServer::start("tok", kDefaultGrpcChunkBytes);
  REQUIRE(server.ok());
  auto channel = grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(),
                                           channelArguments(kDefaultGrpcChunkBytes));
  auto stub = framelink::v1::Link::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenMetadataKey, "tok");
  auto stream = stub->Data(&ctx);
  DataMessage first;
  first.set_session_id(GrpcTestServer::kSessionId);
  REQUIRE(stream->Write(first));
  auto& adopted = (*server)->adopted();
  REQUIRE(adopted.wait_for(10s) == std::future_status::ready);
  std::shared_ptr<GrpcTransport> t = adopted.get();

  std::vector<uint8_t> buf(10);
  REQUIRE(t->exposeCredit(LocalCredit{5, buf.data(), buf.size(), nullptr}).ok());
  DataMessage m;
  auto* h = m.mutable_header();
  h->set_credit_id(5);
  h->set_length(10);
  m.set_payload(std::string(10, 'x'));
  m.set_last(true);
  bool must_not_write = false;
  SECTION("no header on the first chunk") { m.clear_header(); }
  SECTION("length above the credit") {
    must_not_write = true;
    h->set_length(11);
    m.set_payload(std::string(11, 'x'));
  }
  SECTION("chunk past the frame length") { m.set_payload(std::string(12, 'x')); }
  SECTION("wrong offset") { m.set_offset(3); }
  SECTION("last chunk short of the length") { m.set_payload(std::string(4, 'x')); }
  SECTION("attributes above 192 bytes") { h->set_attributes(std::string(193, 'a')); }
  stream->Write(m);
  TransportEvent ev = waitEvent(*t);
  CHECK(ev.kind == TransportEvent::Kind::kLinkError);
  CHECK(ev.status == FL_ERR_PROTOCOL);
  INFO(ev.message);
  // The call ends: the client sees a non-OK status.
  DataMessage ignored;
  while (stream->Read(&ignored)) {
  }
  CHECK_FALSE(stream->Finish().ok());
  // A frame longer than its credit is refused before a byte is written.  (A
  // frame cut short may have written a prefix: it never arrives, and its
  // credit is consumed, so nobody reads that buffer as a frame.)
  if (must_not_write) CHECK(buf[0] == 0);
}

TEST_CASE("grpc reports a frame's SendComplete only after gRPC released its payload slices",
          "[transport][grpc]") {
  const size_t chunk = GENERATE(size_t{64} << 10, kDefaultGrpcChunkBytes);
  CAPTURE(chunk);
  auto server = GrpcTestServer::start("tok", chunk);
  REQUIRE(server.ok());
  // Retries left on (gRPC's default; the daemon turns them off): the retry
  // layer holds on to every message until the call commits.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(grpcMaxMessageBytes(chunk)));
  args.SetMaxSendMessageSize(static_cast<int>(grpcMaxMessageBytes(chunk)));
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  auto channel = grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(), args);
  GrpcTransportOptions options;
  options.chunk_bytes = chunk;
  auto client =
      GrpcTransport::connect(channel, (*server)->queue(), GrpcTestServer::kSessionId, "tok", options);
  REQUIRE(client.ok());
  auto& adopted = (*server)->adopted();
  REQUIRE(adopted.wait_for(10s) == std::future_status::ready);
  std::shared_ptr<GrpcTransport> server_side = adopted.get();
  auto* client_side = dynamic_cast<GrpcTransport*>(client->get());
  REQUIRE(client_side != nullptr);

  // Below the retry layer's 256 KiB buffer (above it the call commits), and two
  // chunks of the small chunk size.
  constexpr size_t kFrame = 100'000;
  for (int dir = 0; dir < 2; ++dir) {
    CAPTURE(dir);
    GrpcTransport* tx = dir == 0 ? client_side : server_side.get();
    Transport* rx = dir == 0 ? static_cast<Transport*>(server_side.get()) : client->get();
    const uint64_t released_before = tx->payloadsReleased();
    std::vector<uint8_t> slot(kFrame);
    std::vector<uint8_t> landed(kFrame);
    for (uint64_t k = 0; k < 8; ++k) {
      CAPTURE(k);
      for (size_t i = 0; i < kFrame; ++i) slot[i] = static_cast<uint8_t>(i * 31 + k * 7 + dir);
      const std::vector<uint8_t> sent = slot;
      const uint64_t credit_id = 100 * (dir + 1) + k;
      auto remote = rx->exposeCredit(LocalCredit{credit_id, landed.data(), landed.size(), nullptr});
      REQUIRE(remote.ok());
      SendRequest r;
      r.cookie = k;
      r.header.credit_id = credit_id;
      r.header.length = kFrame;
      r.payload = slot.data();
      r.credit = *remote;
      REQUIRE(tx->post(r) == PostResult::kOk);

      TransportEvent done = waitEvent(*tx);
      REQUIRE(done.kind == TransportEvent::Kind::kSendComplete);
      CHECK(done.status == FL_OK);
      // gRPC dropped every slice over this frame's slot before the completion.
      CHECK(tx->payloadsReleased() >= released_before + k + 1);
      // The producer reuses its slot right away; what lands is what was sent.
      std::memset(slot.data(), 0xEE, kFrame);
      TransportEvent arrived = waitEvent(*rx);
      REQUIRE(arrived.kind == TransportEvent::Kind::kFrameArrived);
      CHECK(arrived.status == FL_OK);
      CHECK(landed == sent);
    }
  }
  (*client)->shutdown();
  server_side->shutdown();
}

TEST_CASE("grpc receiver fails the link on a malformed DataMessage and says what is wrong",
          "[transport][grpc]") {
  auto server = GrpcTestServer::start("tok", kDefaultGrpcChunkBytes);
  REQUIRE(server.ok());
  auto channel = grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(),
                                           channelArguments(kDefaultGrpcChunkBytes));
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenMetadataKey, "tok");
  auto stream = openRawDataCall(channel, &ctx);
  REQUIRE(stream->Write(encodeSessionId(GrpcTestServer::kSessionId)));
  auto& adopted = (*server)->adopted();
  REQUIRE(adopted.wait_for(10s) == std::future_status::ready);
  std::shared_ptr<GrpcTransport> t = adopted.get();
  std::vector<uint8_t> buf(64);
  REQUIRE(t->exposeCredit(LocalCredit{5, buf.data(), buf.size(), nullptr}).ok());

  std::string bytes;
  std::string reason;
  SECTION("a varint cut short") {
    bytes.assign("\x10\x80", 2);
    reason = "truncated varint in field 2";
  }
  SECTION("a payload longer than the message") {
    FrameHeader h;
    h.credit_id = 5;
    h.length = 64;
    encodeChunkPrefix(&h, 0, true, 64, &bytes);
    bytes += std::string(10, 'x');  // 54 bytes short
    reason = "runs past";
  }
  SECTION("a header that does not parse") {
    bytes.assign("\x0a\x02\x08\x80", 4);
    reason = "frame header does not parse";
  }
  SECTION("a payload with the wrong wire type") {
    bytes.assign("\x18\x05", 2);
    reason = "field 3 has wire type 0";
  }
  grpc::Slice slice(bytes);
  stream->Write(grpc::ByteBuffer(&slice, 1));
  TransportEvent ev = waitEvent(*t);
  CHECK(ev.kind == TransportEvent::Kind::kLinkError);
  CHECK(ev.status == FL_ERR_PROTOCOL);
  CHECK_THAT(ev.message, Catch::Contains("malformed DataMessage") && Catch::Contains(reason));
  CHECK(std::all_of(buf.begin(), buf.end(), [](uint8_t b) { return b == 0; }));
  grpc::ByteBuffer ignored;
  while (stream->Read(&ignored)) {
  }
  CHECK_FALSE(stream->Finish().ok());
}

TEST_CASE("grpc listener ends a Data call that does not name its session in time", "[transport][grpc]") {
  auto server = GrpcTestServer::start("tok", kDefaultGrpcChunkBytes, 300ms);
  REQUIRE(server.ok());
  auto channel = grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(),
                                           channelArguments(kDefaultGrpcChunkBytes));
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenMetadataKey, "tok");
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);  // the test's own bound
  auto stream = openRawDataCall(channel, &ctx);
  const auto began = std::chrono::steady_clock::now();
  grpc::ByteBuffer ignored;
  CHECK_FALSE(stream->Read(&ignored));  // no first message: the listener cancels the call
  const auto took = std::chrono::steady_clock::now() - began;
  const grpc::Status status = stream->Finish();
  INFO("status " << status.error_code() << " " << status.error_message());
  CHECK(status.error_code() == grpc::StatusCode::CANCELLED);
  CHECK(took >= 250ms);
  CHECK(took < 5s);
  // Nothing was handed over.
  CHECK((*server)->adopted().wait_for(0ms) == std::future_status::timeout);
}

TEST_CASE("grpc: a transport whose owner lets go of it ends its call, either side", "[transport][grpc]") {
  const bool drop_listener = GENERATE(false, true);
  CAPTURE(drop_listener);
  auto server = GrpcTestServer::start("tok", kDefaultGrpcChunkBytes);
  REQUIRE(server.ok());
  auto channel = grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(),
                                           channelArguments(kDefaultGrpcChunkBytes));
  auto client = GrpcTransport::connect(channel, (*server)->queue(), GrpcTestServer::kSessionId, "tok");
  REQUIRE(client.ok());
  auto& adopted = (*server)->adopted();
  REQUIRE(adopted.wait_for(10s) == std::future_status::ready);
  std::shared_ptr<Transport> listener = adopted.get();
  std::shared_ptr<Transport> dialer = std::move(client).value();
  // The call keeps the transport it runs until its last completion, but not
  // the link: the last handle shuts it down, and the other side sees the end.
  std::shared_ptr<Transport>& dropped = drop_listener ? listener : dialer;
  std::shared_ptr<Transport>& kept = drop_listener ? dialer : listener;
  dropped.reset();
  TransportEvent ev = waitEvent(*kept);
  CHECK(ev.kind == TransportEvent::Kind::kLinkError);
  CHECK(ev.status == FL_ERR_LINK_LOST);
  INFO(ev.message);
  CHECK_FALSE(kept->connected());
}

TEST_CASE("grpc message limits cover a chunk", "[transport][grpc]") {
  CHECK(grpcMaxMessageBytes(kDefaultGrpcChunkBytes) > kDefaultGrpcChunkBytes);
  CHECK(grpcMaxMessageBytes(16 << 20) >= (16u << 20) + kGrpcMessageSlack);
  CHECK(grpcMaxMessageBytes(4096) >= (4u << 20));
}

}  // namespace framelink::transport::testing
