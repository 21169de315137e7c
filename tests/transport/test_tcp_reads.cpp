// The tcp transport's reads (pull) against a raw peer that writes the wire
// by hand: what a broken or hostile peer can do with read requests and
// responses, and that a response goes out whole from its source's keepalive
// when the source is retracted while it is being written.  The contract
// itself is the conformance suite's (test_transport_conformance_read.cpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"
#include "tcp_socket_pair.h"
#include "transport/link_bookkeeping.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_wire.h"
#include "transport_test_util.h"

namespace framelink::transport::tcp {
namespace {

using testing::Kind;

// A TcpTransport on one end of a loopback TCP connection, the raw socket on
// the other, both with `buffer_bytes` socket buffers.
struct RawPeer {
  std::unique_ptr<TcpTransport> t;
  UniqueFd raw;
};

RawPeer makeRawPeer(int buffer_bytes) {
  testing::g_pair = nullptr;
  auto [dialer, accepted] = testing::socketPair(buffer_bytes);
  auto t = TcpTransport::make(std::move(accepted), "raw peer");
  REQUIRE(t.ok());
  return RawPeer{std::move(t).value(), std::move(dialer)};
}

void writeAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    REQUIRE(w > 0);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads exactly n bytes from the raw socket, polling the transport meanwhile
// so that it goes on writing.
void readAll(RawPeer& p, void* out, size_t n) {
  auto* dst = static_cast<uint8_t*>(out);
  const auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  TransportEvent ev[8];
  while (n > 0) {
    p.t->poll(ev, 8);
    const ssize_t r = ::recv(p.raw.get(), dst, n, MSG_DONTWAIT);
    if (r > 0) {
      dst += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    REQUIRE((r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)));
    if (std::chrono::steady_clock::now() > deadline) FAIL("timed out reading from the transport");
    pollfd pf{p.raw.get(), POLLIN, 0};
    ::poll(&pf, 1, 5);
  }
}

TcpFrameHeader readRequest(uint64_t source_id, uint64_t read_id, uint64_t length) {
  TcpFrameHeader h{};
  h.magic = kTcpReadRequestMagic;
  h.credit_id = source_id;
  h.frame_id = read_id;
  h.length = length;
  return h;
}

// Polls until the transport reports its link error; returns it.
TransportEvent awaitLinkError(TcpTransport& t) {
  const auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  TransportEvent ev[8];
  for (;;) {
    const size_t n = t.poll(ev, 8);
    for (size_t i = 0; i < n; ++i) {
      if (ev[i].kind == Kind::kLinkError) return ev[i];
    }
    if (std::chrono::steady_clock::now() > deadline) FAIL("no link error");
    testing::readable(t.eventFd(), 5);
  }
}

}  // namespace

TEST_CASE("tcp: a read response for a read that is not outstanding closes the link",
          "[transport][tcp][read]") {
  RawPeer p = makeRawPeer(256 * 1024);
  TcpFrameHeader forged{};
  forged.magic = kTcpReadResponseMagic;
  forged.frame_id = 42;
  forged.length = 0;
  writeAll(p.raw.get(), &forged, sizeof forged);
  const TransportEvent error = awaitLinkError(*p.t);
  CHECK(error.status == FL_ERR_PROTOCOL);
  CHECK(error.message.find("not outstanding") != std::string::npos);
}

TEST_CASE("tcp: a read response of another length than asked closes the link and fails the read",
          "[transport][tcp][read]") {
  RawPeer p = makeRawPeer(256 * 1024);
  testing::Buffer buf(1000);
  ReadRequest r;
  r.cookie = 5;
  r.source = RemoteSource{9, 1000, 0, 0};
  r.buffer = buf.data();
  r.capacity = buf.size();
  REQUIRE(p.t->postRead(r) == PostResult::kOk);
  TcpFrameHeader asked{};
  readAll(p, &asked, sizeof asked);
  CHECK(asked.magic == kTcpReadRequestMagic);
  CHECK(asked.credit_id == 9u);
  CHECK(asked.length == 1000u);
  TcpFrameHeader answer{};
  answer.magic = kTcpReadResponseMagic;
  answer.credit_id = 9;
  answer.frame_id = asked.frame_id;
  answer.length = 100'000;  // more than the reader's buffer holds
  writeAll(p.raw.get(), &answer, sizeof answer);
  std::vector<TransportEvent> seen;
  const auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  while (seen.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    TransportEvent ev[8];
    const size_t n = p.t->poll(ev, 8);
    for (size_t i = 0; i < n; ++i) seen.push_back(std::move(ev[i]));
    testing::readable(p.t->eventFd(), 5);
  }
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].kind == Kind::kLinkError);
  CHECK(seen[0].status == FL_ERR_PROTOCOL);
  CHECK(seen[0].message.find("does not match its request") != std::string::npos);
  CHECK(seen[1].kind == Kind::kReadComplete);
  CHECK(seen[1].cookie == 5u);
  CHECK(seen[1].status == FL_ERR_LINK_LOST);
  CHECK(buf.data()[0] == 0xEE);  // nothing of the forged body landed
}

TEST_CASE("tcp: a peer asking for more reads than the bound without taking the answers closes the link",
          "[transport][tcp][read]") {
  RawPeer p = makeRawPeer(64 * 1024);
  auto payload = std::make_shared<std::vector<uint8_t>>(1 << 20, 0xAB);
  REQUIRE(p.t->exposeSource(LocalSource{1, payload->data(), payload->size(), payload}).ok());
  // Every request is for the 1 MiB source; the raw peer never reads, so
  // answers pile up behind the full socket.
  std::vector<TcpFrameHeader> requests;
  for (uint64_t i = 0; i <= kMaxReadsOutstanding; ++i) requests.push_back(readRequest(1, i + 1, 1 << 20));
  writeAll(p.raw.get(), requests.data(), requests.size() * sizeof(TcpFrameHeader));
  const TransportEvent error = awaitLinkError(*p.t);
  CHECK(error.status == FL_ERR_PROTOCOL);
  CHECK(error.message.find("reads unanswered") != std::string::npos);
  CHECK(p.t->counters().reads_served == kMaxReadsOutstanding);
}

TEST_CASE("tcp: a source retracted while its answer is written goes out whole from its keepalive",
          "[transport][tcp][read]") {
  RawPeer p = makeRawPeer(64 * 1024);
  constexpr size_t kSize = 4 << 20;
  auto bytes = std::make_shared<std::vector<uint8_t>>(kSize);
  for (size_t i = 0; i < kSize; ++i) (*bytes)[i] = static_cast<uint8_t>(i * 31 + 7);
  const std::vector<uint8_t> want = *bytes;
  REQUIRE(p.t->exposeSource(LocalSource{3, bytes->data(), kSize, bytes}).ok());
  const TcpFrameHeader ask = readRequest(3, 77, kSize);
  writeAll(p.raw.get(), &ask, sizeof ask);
  // The transport takes the request and starts the answer; the socket takes
  // only part of 4 MiB.
  TcpFrameHeader answer{};
  readAll(p, &answer, sizeof answer);
  CHECK(answer.magic == kTcpReadResponseMagic);
  CHECK(answer.frame_id == 77u);
  CHECK(answer.flags == 0u);
  REQUIRE(answer.length == kSize);
  // The source goes, and with it this test's last other reference.
  p.t->retractSource(3);
  bytes.reset();
  std::vector<uint8_t> got(kSize);
  readAll(p, got.data(), kSize);
  CHECK(got == want);
  // A second read of the retracted source is answered "no source".
  const TcpFrameHeader again = readRequest(3, 78, kSize);
  writeAll(p.raw.get(), &again, sizeof again);
  readAll(p, &answer, sizeof answer);
  CHECK(answer.magic == kTcpReadResponseMagic);
  CHECK(answer.frame_id == 78u);
  CHECK(answer.flags == kTcpReadNoSource);
  CHECK(answer.length == 0u);
  CHECK(p.t->counters().reads_served == 1);
  CHECK(p.t->counters().unknown_source_reads == 1);
}

}  // namespace framelink::transport::tcp
