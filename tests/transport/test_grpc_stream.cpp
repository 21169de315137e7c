// The grpc transport's handling of rejected calls and of malformed chunk
// sequences (the sender side never produces these).
#include <poll.h>

#include <chrono>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_transport.h"
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
  auto t = GrpcTransport::connect(channel, GrpcTestServer::kSessionId, "wrong");
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
  std::shared_ptr<GrpcServerTransport> t = adopted.get();

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

TEST_CASE("grpc message limits cover a chunk", "[transport][grpc]") {
  CHECK(grpcMaxMessageBytes(kDefaultGrpcChunkBytes) > kDefaultGrpcChunkBytes);
  CHECK(grpcMaxMessageBytes(16 << 20) >= (16u << 20) + kGrpcMessageSlack);
  CHECK(grpcMaxMessageBytes(4096) >= (4u << 20));
}

}  // namespace framelink::transport::testing
