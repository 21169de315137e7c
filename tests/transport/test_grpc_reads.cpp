// The grpc transport's reads (pull) against a raw peer that writes
// DataMessages by hand on a Link.Data call: what a broken or hostile peer
// can do with read requests and responses, and that an answer goes out
// whole from its source's keepalive when the source is retracted while it
// is being written.  The contract itself is the conformance suite's
// (test_transport_conformance_read.cpp); tcp's counterpart is
// test_tcp_reads.cpp.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/link_bookkeeping.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {
namespace {

using namespace std::chrono_literals;
using framelink::v1::DataMessage;

// A listening GrpcTransport on one end of a Link.Data call, the call's raw
// client stream (typed DataMessages) on the other.
struct GrpcRawPeer {
  explicit GrpcRawPeer(size_t chunk_bytes) {
    auto started = GrpcTestServer::start("tok", chunk_bytes);
    REQUIRE(started.ok());
    server = std::move(started).value();
    channel = grpc::CreateCustomChannel(server->address(), grpc::InsecureChannelCredentials(),
                                        channelArguments(chunk_bytes));
    stub = framelink::v1::Link::NewStub(channel);
    ctx.AddMetadata(kTokenMetadataKey, "tok");
    // A transport that never answers ends the test, not the test run.
    ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    stream = stub->Data(&ctx);
    DataMessage first;
    first.set_session_id(GrpcTestServer::kSessionId);
    REQUIRE(stream->Write(first));
    auto& adopted = server->adopted();
    REQUIRE(adopted.wait_for(10s) == std::future_status::ready);
    t = adopted.get();
  }

  ~GrpcRawPeer() {
    t->shutdown();  // cancels the call
    DataMessage ignored;
    while (stream->Read(&ignored)) {
    }
    stream->Finish();
  }

  // The next message the transport wrote.
  DataMessage read() {
    DataMessage m;
    REQUIRE(stream->Read(&m));
    return m;
  }

  std::unique_ptr<GrpcTestServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<framelink::v1::Link::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<DataMessage, DataMessage>> stream;
  std::shared_ptr<GrpcTransport> t;
};

DataMessage readRequest(uint64_t source_id, uint64_t read_id, uint64_t length) {
  DataMessage m;
  auto* q = m.mutable_read_request();
  q->set_source_id(source_id);
  q->set_read_id(read_id);
  q->set_length(length);
  return m;
}

DataMessage responseChunk(uint64_t source_id, uint64_t read_id, uint64_t length, size_t payload, bool last) {
  DataMessage m;
  auto* r = m.mutable_read_response();
  r->set_source_id(source_id);
  r->set_read_id(read_id);
  r->set_length(length);
  m.set_payload(std::string(payload, 'r'));
  m.set_last(last);
  return m;
}

// Polls until the transport reported its link error and `more` events
// after it; returns everything from the link error on.
std::vector<TransportEvent> awaitGrpcLinkError(Transport& t, size_t more = 0) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  std::vector<TransportEvent> seen;
  TransportEvent ev[8];
  while (seen.empty() || seen.size() < 1 + more) {
    const size_t n = t.poll(ev, 8);
    for (size_t i = 0; i < n; ++i) {
      if (!seen.empty() || ev[i].kind == Kind::kLinkError) seen.push_back(std::move(ev[i]));
    }
    if (std::chrono::steady_clock::now() > deadline) FAIL("no link error");
    readable(t.eventFd(), 5);
  }
  return seen;
}

}  // namespace

TEST_CASE("grpc: a read response for a read that is not outstanding closes the link",
          "[transport][grpc][read]") {
  GrpcRawPeer p(kDefaultGrpcChunkBytes);
  REQUIRE(p.stream->Write(responseChunk(0, 42, 0, 0, true)));
  const std::vector<TransportEvent> seen = awaitGrpcLinkError(*p.t);
  CHECK(seen[0].status == FL_ERR_PROTOCOL);
  CHECK_THAT(seen[0].message, Catch::Contains("read 42, which is not outstanding"));
}

TEST_CASE("grpc: read messages mixed with frame data close the link", "[transport][grpc][read]") {
  std::vector<uint8_t> buf(100);  // a credit's: outlives the transport
  GrpcRawPeer p(kDefaultGrpcChunkBytes);
  DataMessage m;
  std::string reason;
  SECTION("a read request with a payload") {
    m = readRequest(1, 1, 10);
    m.set_payload("xyz");
    reason = "a read request shares its message with frame data";
  }
  SECTION("a read request with a control record") {
    m = readRequest(1, 1, 10);
    m.set_control("c");
    reason = "a control record shares its message";
  }
  SECTION("a read response with a frame header") {
    m = responseChunk(1, 1, 0, 0, true);
    m.mutable_header()->set_credit_id(1);
    reason = "a read response shares its message with a frame header";
  }
  SECTION("a read response in the middle of a frame") {
    REQUIRE(p.t->exposeCredit(LocalCredit{5, buf.data(), buf.size(), nullptr}).ok());
    DataMessage chunk;
    chunk.mutable_header()->set_credit_id(5);
    chunk.mutable_header()->set_length(100);
    chunk.set_payload(std::string(50, 'f'));
    REQUIRE(p.stream->Write(chunk));
    m = responseChunk(1, 1, 0, 0, true);
    m.set_offset(50);
    reason = "read response in the middle of frame";
  }
  REQUIRE(p.stream->Write(m));
  const std::vector<TransportEvent> seen = awaitGrpcLinkError(*p.t);
  CHECK(seen[0].status == FL_ERR_PROTOCOL);
  CHECK_THAT(seen[0].message, Catch::Contains(reason));
}

TEST_CASE("grpc: a read response that does not match its read closes the link and fails the read",
          "[transport][grpc][read]") {
  std::vector<uint8_t> buf(1001, 0xEE);  // a read's (1000 bytes): outlives the transport
  GrpcRawPeer p(kDefaultGrpcChunkBytes);
  ReadRequest r;
  r.cookie = 5;
  r.source = RemoteSource{9, 1000, 0, 0};
  r.buffer = buf.data();
  r.capacity = 1000;
  REQUIRE(p.t->postRead(r) == PostResult::kOk);
  const DataMessage asked = p.read();
  REQUIRE(asked.has_read_request());
  CHECK(asked.read_request().source_id() == 9u);
  CHECK(asked.read_request().length() == 1000u);
  CHECK_FALSE(asked.has_header());
  CHECK(asked.payload().empty());
  const uint64_t id = asked.read_request().read_id();

  std::vector<DataMessage> answer;
  std::string reason;
  bool lands_nothing = true;
  SECTION("more bytes than asked") {
    answer.push_back(responseChunk(9, id, 100'000, 10, false));
    reason = "does not match its request";
  }
  SECTION("another source") {
    answer.push_back(responseChunk(8, id, 1000, 1000, true));
    reason = "does not match its request";
  }
  SECTION("no source, yet bytes") {
    answer.push_back(responseChunk(9, id, 0, 10, true));
    answer.back().mutable_read_response()->set_no_source(true);
    reason = "does not match its request";
  }
  SECTION("no source of the asked length") {
    answer.push_back(responseChunk(9, id, 1000, 0, true));
    answer.back().mutable_read_response()->set_no_source(true);
    reason = "does not match its request";
  }
  SECTION("a chunk past the length") {
    answer.push_back(responseChunk(9, id, 1000, 1001, true));
    reason = "runs past the length 1000";
  }
  SECTION("the last chunk short of the length") {
    lands_nothing = false;
    answer.push_back(responseChunk(9, id, 1000, 500, true));
    reason = "last read response chunk at 500 of 1000 bytes";
  }
  SECTION("a chunk at the wrong offset") {
    lands_nothing = false;
    answer.push_back(responseChunk(9, id, 1000, 500, false));
    DataMessage next;
    next.set_offset(600);
    next.set_payload(std::string(400, 'r'));
    next.set_last(true);
    answer.push_back(next);
    reason = "offset 600, expected 500";
  }
  SECTION("a frame header in the middle of the response") {
    lands_nothing = false;
    answer.push_back(responseChunk(9, id, 1000, 500, false));
    DataMessage frame;
    frame.mutable_header()->set_length(10);
    frame.set_offset(500);
    answer.push_back(frame);
    reason = "frame header in the middle of the response to read";
  }
  SECTION("a second response in the middle of the first") {
    lands_nothing = false;
    answer.push_back(responseChunk(9, id, 1000, 500, false));
    answer.push_back(responseChunk(9, id, 1000, 500, true));
    answer.back().set_offset(500);
    reason = "read response in the middle of the response to read";
  }
  for (const DataMessage& m : answer) REQUIRE(p.stream->Write(m));
  const std::vector<TransportEvent> seen = awaitGrpcLinkError(*p.t, 1);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].status == FL_ERR_PROTOCOL);
  CHECK_THAT(seen[0].message, Catch::Contains(reason));
  CHECK(seen[1].kind == Kind::kReadComplete);
  CHECK(seen[1].cookie == 5u);
  CHECK(seen[1].status == FL_ERR_LINK_LOST);
  if (lands_nothing) CHECK(buf[0] == 0xEE);  // refused before a byte landed
  CHECK(p.t->counters().reads_completed == 0);
}

TEST_CASE("grpc: a read response of the peer's making completes the read", "[transport][grpc][read]") {
  std::vector<uint8_t> buf(1001, 0xEE);  // a read's (1000 bytes): outlives the transport
  GrpcRawPeer p(kDefaultGrpcChunkBytes);
  ReadRequest r;
  r.cookie = 6;
  r.source = RemoteSource{9, 1000, 0, 0};
  r.buffer = buf.data();
  r.capacity = 1000;
  REQUIRE(p.t->postRead(r) == PostResult::kOk);
  r.cookie = 7;
  REQUIRE(p.t->postRead(r) == PostResult::kOk);
  const uint64_t first = p.read().read_request().read_id();
  const uint64_t second = p.read().read_request().read_id();
  CHECK(first != second);
  // Chunks of any size that add up; then "no source" for the other.
  REQUIRE(p.stream->Write(responseChunk(9, first, 1000, 300, false)));
  DataMessage rest;
  rest.set_offset(300);
  rest.set_payload(std::string(700, 's'));
  rest.set_last(true);
  REQUIRE(p.stream->Write(rest));
  DataMessage none = responseChunk(9, second, 0, 0, true);
  none.mutable_read_response()->set_no_source(true);
  REQUIRE(p.stream->Write(none));
  std::vector<TransportEvent> reads;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (reads.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    TransportEvent ev[8];
    const size_t n = p.t->poll(ev, 8);
    for (size_t i = 0; i < n; ++i) {
      CHECK(ev[i].kind == Kind::kReadComplete);
      reads.push_back(std::move(ev[i]));
    }
    readable(p.t->eventFd(), 5);
  }
  REQUIRE(reads.size() == 2);
  CHECK(reads[0].cookie == 6u);
  CHECK(reads[0].status == FL_OK);
  CHECK(reads[1].cookie == 7u);
  CHECK(reads[1].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK_THAT(reads[1].message, Catch::Contains("no source 9 of 1000 bytes"));
  CHECK(std::string(reinterpret_cast<const char*>(buf.data()), 300) == std::string(300, 'r'));
  CHECK(std::string(reinterpret_cast<const char*>(buf.data()) + 300, 700) == std::string(700, 's'));
  CHECK(buf[1000] == 0xEE);
  CHECK(p.t->connected());
  CHECK(p.t->counters().reads_completed == 1);
  CHECK(p.t->counters().bytes_read == 1000u);
}

TEST_CASE("grpc: a peer asking for more reads than the bound without taking the answers closes the link",
          "[transport][grpc][read]") {
  GrpcRawPeer p(kDefaultGrpcChunkBytes);
  auto payload = std::make_shared<std::vector<uint8_t>>(1 << 20, 0xAB);
  REQUIRE(p.t->exposeSource(LocalSource{1, payload->data(), payload->size(), payload}).ok());
  // Every request is for the 1 MiB source; the raw peer never reads, so
  // once gRPC's flow control window is full the answers pile up.
  constexpr uint64_t kAsked = kMaxReadsOutstanding + 64;
  for (uint64_t i = 0; i < kAsked; ++i) {
    grpc::WriteOptions options;
    if (i + 1 < kAsked) options.set_buffer_hint();
    if (!p.stream->Write(readRequest(1, i + 1, 1 << 20), options)) break;  // the call ended first
  }
  const std::vector<TransportEvent> seen = awaitGrpcLinkError(*p.t);
  CHECK(seen[0].status == FL_ERR_PROTOCOL);
  CHECK_THAT(seen[0].message, Catch::Contains("more than 256 reads unanswered"));
  // 256 answers waiting, and the few the sender took before gRPC held it up.
  CHECK(p.t->counters().reads_served >= kMaxReadsOutstanding);
  CHECK(p.t->counters().reads_served < kAsked);
}

TEST_CASE("grpc: a source retracted while its answer is written goes out whole from its keepalive",
          "[transport][grpc][read]") {
  constexpr size_t kChunk = 64 << 10;
  GrpcRawPeer p(kChunk);
  constexpr size_t kSize = 4 << 20;
  auto bytes = std::make_shared<std::vector<uint8_t>>(kSize);
  for (size_t i = 0; i < kSize; ++i) (*bytes)[i] = static_cast<uint8_t>(i * 31 + 7);
  const std::vector<uint8_t> want = *bytes;
  const std::weak_ptr<std::vector<uint8_t>> watched = bytes;
  REQUIRE(p.t->exposeSource(LocalSource{3, bytes->data(), kSize, bytes}).ok());
  REQUIRE(p.stream->Write(readRequest(3, 77, kSize)));
  // The first chunk names the read; the other 63 follow.
  DataMessage m = p.read();
  REQUIRE(m.has_read_response());
  CHECK(m.read_response().read_id() == 77u);
  CHECK(m.read_response().source_id() == 3u);
  CHECK_FALSE(m.read_response().no_source());
  REQUIRE(m.read_response().length() == kSize);
  CHECK(m.payload().size() == kChunk);
  // The source goes, and with it this test's last other reference.
  p.t->retractSource(3);
  bytes.reset();
  std::string got = m.payload();
  while (!m.last()) {
    m = p.read();
    CHECK_FALSE(m.has_read_response());
    CHECK(m.offset() == got.size());
    CHECK(m.payload().size() <= kChunk);
    got += m.payload();
  }
  REQUIRE(got.size() == kSize);
  CHECK(std::equal(want.begin(), want.end(), reinterpret_cast<const uint8_t*>(got.data())));
  // A second read of the retracted source is answered "no source".
  REQUIRE(p.stream->Write(readRequest(3, 78, kSize)));
  m = p.read();
  REQUIRE(m.has_read_response());
  CHECK(m.read_response().read_id() == 78u);
  CHECK(m.read_response().no_source());
  CHECK(m.read_response().length() == 0u);
  CHECK(m.payload().empty());
  CHECK(m.last());
  CHECK(p.t->counters().reads_served == 1);
  CHECK(p.t->counters().unknown_source_reads == 1);
  // gRPC let go of the answer's slices, and with them of the source.
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!watched.expired() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  CHECK(watched.expired());
}

}  // namespace framelink::transport::testing
