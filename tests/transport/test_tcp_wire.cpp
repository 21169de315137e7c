// The tcp transport's handshake and the checks a receiver makes on frames a
// broken or hostile peer might send (the sender side never produces these).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_wire.h"

namespace framelink::transport::tcp {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kSession = 42;

UniqueFd rawConnect(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  timeval tv{10, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// A listener that counts accepted connections and keeps the last one.
struct Listener {
  std::atomic<int> accepted{0};
  std::promise<UniqueFd> first;
  std::unique_ptr<TcpDataListener> l;
  explicit Listener(const std::string& token, std::chrono::milliseconds timeout = 5s) {
    auto r = TcpDataListener::listen(
        "127.0.0.1:0", token,
        [this](uint64_t, UniqueFd fd) {
          if (accepted++ == 0) first.set_value(std::move(fd));
        },
        timeout);
    if (!r) FAIL(r.error().message);
    l = std::move(r).value();
  }
};

// A transport on the listener side, fed by a raw socket on the dialer side.
struct WirePeer {
  Listener listener{"t"};
  UniqueFd raw;
  std::unique_ptr<Transport> t;
  WirePeer() {
    auto fd = dialData("127.0.0.1", listener.l->port(), kSession, "t", 5s);
    REQUIRE(fd.ok());
    raw = std::move(fd).value();
    auto fut = listener.first.get_future();
    REQUIRE(fut.wait_for(10s) == std::future_status::ready);
    auto tr = TcpTransport::create(fut.get(), "raw peer");
    REQUIRE(tr.ok());
    t = std::move(tr).value();
  }
  TransportEvent waitEvent() {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    TransportEvent ev;
    while (t->poll(&ev, 1) == 0) {
      if (std::chrono::steady_clock::now() > deadline) FAIL("no event from the transport");
      pollfd p{t->eventFd(), POLLIN, 0};
      ::poll(&p, 1, 10);
    }
    return ev;
  }
  void sendRaw(const void* p, size_t n) {
    REQUIRE(::send(raw.get(), p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
  }
};

}  // namespace

TEST_CASE("tcp handshake accepts the right token and session", "[transport][tcp]") {
  Listener listener("secret");
  auto fd = dialData("127.0.0.1", listener.l->port(), kSession, "secret", 5s);
  REQUIRE(fd.ok());
  auto fut = listener.first.get_future();
  REQUIRE(fut.wait_for(10s) == std::future_status::ready);
  CHECK(fut.get().valid());
}

TEST_CASE("tcp handshake rejects a wrong token", "[transport][tcp]") {
  Listener listener("secret");
  auto fd = dialData("127.0.0.1", listener.l->port(), kSession, "not-the-secret", 5s);
  REQUIRE_FALSE(fd.ok());
  CHECK(fd.error().code == FL_ERR_AUTH);
  CHECK(fd.error().message.find("token") != std::string::npos);
  // A correct dial still works afterwards and is the first one handed over.
  REQUIRE(dialData("127.0.0.1", listener.l->port(), kSession, "secret", 5s).ok());
  auto fut = listener.first.get_future();
  REQUIRE(fut.wait_for(10s) == std::future_status::ready);
  CHECK(listener.accepted == 1);
}

TEST_CASE("tcp handshake rejects bad magic and version", "[transport][tcp]") {
  Listener listener("");
  TcpHello hello{};
  std::memcpy(hello.magic, kTcpHelloMagic, 8);
  hello.version = kTcpWireVersion;
  hello.session_id = kSession;
  tokenDigest("", kSession, hello.token);

  SECTION("magic") { hello.magic[0] = 'X'; }
  SECTION("version") { hello.version = kTcpWireVersion + 1; }
  UniqueFd fd = rawConnect(listener.l->port());
  REQUIRE(::send(fd.get(), &hello, sizeof hello, MSG_NOSIGNAL) == sizeof hello);
  TcpHelloReply reply{};
  REQUIRE(::recv(fd.get(), &reply, sizeof reply, MSG_WAITALL) == sizeof reply);
  CHECK(reply.status != FL_OK);
  CHECK((reply.status == FL_ERR_PROTOCOL || reply.status == FL_ERR_PEER_VERSION));
  char byte;
  CHECK(::recv(fd.get(), &byte, 1, 0) == 0);  // closed
  CHECK(listener.accepted == 0);
}

TEST_CASE("tcp listener drops a silent connection after the handshake timeout", "[transport][tcp]") {
  Listener listener("t", 200ms);
  UniqueFd silent = rawConnect(listener.l->port());
  char byte;
  auto start = std::chrono::steady_clock::now();
  CHECK(::recv(silent.get(), &byte, 1, 0) == 0);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  REQUIRE(dialData("127.0.0.1", listener.l->port(), kSession, "t", 5s).ok());
  auto fut = listener.first.get_future();
  CHECK(fut.wait_for(10s) == std::future_status::ready);
}

TEST_CASE("tcp dial to a closed port fails with FL_ERR_TRANSPORT", "[transport][tcp]") {
  uint16_t port;
  {
    Listener l("t");
    port = l.l->port();
  }
  auto fd = dialData("127.0.0.1", port, kSession, "t", 2s);
  REQUIRE_FALSE(fd.ok());
  CHECK(fd.error().code == FL_ERR_TRANSPORT);
}

TEST_CASE("tcp receiver treats malformed frames as protocol violations", "[transport][tcp]") {
  WirePeer peer;
  std::vector<uint8_t> buf(10);
  auto keep = std::make_shared<int>(0);
  REQUIRE(peer.t->exposeCredit(LocalCredit{5, buf.data(), buf.size(), keep}).ok());
  TcpFrameHeader h{};
  h.magic = kTcpFrameMagic;
  h.credit_id = 5;
  h.length = 10;
  SECTION("length above the credit") { h.length = 11; }
  SECTION("bad magic") { h.magic = 0x12345678; }
  SECTION("attr_length above 192") { h.attr_length = FL_MAX_ATTR_BYTES + 1; }
  SECTION("unknown credit above max_frame_bytes") {
    h.credit_id = 6;
    h.length = uint64_t{1} << 40;
  }
  peer.sendRaw(&h, sizeof h);
  TransportEvent ev = peer.waitEvent();
  CHECK(ev.kind == TransportEvent::Kind::kLinkError);
  CHECK(ev.status == FL_ERR_PROTOCOL);
  INFO(ev.message);
  CHECK_FALSE(peer.t->connected());
  char byte;
  CHECK(::recv(peer.raw.get(), &byte, 1, 0) == 0);  // the receiver closed the connection
}

TEST_CASE("tcp receiver reports a connection cut in the middle of a frame", "[transport][tcp]") {
  WirePeer peer;
  std::vector<uint8_t> buf(100);
  REQUIRE(peer.t->exposeCredit(LocalCredit{5, buf.data(), buf.size(), nullptr}).ok());
  TcpFrameHeader h{};
  h.magic = kTcpFrameMagic;
  h.credit_id = 5;
  h.length = 100;
  peer.sendRaw(&h, sizeof h);
  const std::vector<uint8_t> half(50, 0x5a);  // not buf: the receiver is writing into that
  peer.sendRaw(half.data(), half.size());
  peer.raw.reset();
  TransportEvent ev = peer.waitEvent();
  CHECK(ev.kind == TransportEvent::Kind::kLinkError);
  CHECK(ev.status == FL_ERR_LINK_LOST);
}

TEST_CASE("tcp wire 4: a version 2 peer is refused, and the read records have their bytes",
          "[transport][tcp]") {
  // Version 3 added reads: a version 2 peer would close the link on the first read record.
  // Version 4 proves the token with HMAC-SHA256: a version 3 peer's proof would not match.
  CHECK(kTcpWireVersion == 4u);
  // The magics are what peers and the fuzz corpus depend on, byte for byte on the wire.
  uint8_t bytes[4];
  std::memcpy(bytes, &kTcpReadRequestMagic, 4);
  CHECK(std::string(reinterpret_cast<char*>(bytes), 4) == "FLRQ");
  std::memcpy(bytes, &kTcpReadResponseMagic, 4);
  CHECK(std::string(reinterpret_cast<char*>(bytes), 4) == "FLRS");
  CHECK(kTcpReadNoSource == 1u);
  Listener listener("");
  TcpHello hello{};
  std::memcpy(hello.magic, kTcpHelloMagic, 8);
  hello.version = 2;
  hello.session_id = kSession;
  tokenDigest("", kSession, hello.token);
  UniqueFd fd = rawConnect(listener.l->port());
  REQUIRE(::send(fd.get(), &hello, sizeof hello, MSG_NOSIGNAL) == sizeof hello);
  TcpHelloReply reply{};
  REQUIRE(::recv(fd.get(), &reply, sizeof reply, MSG_WAITALL) == sizeof reply);
  CHECK(reply.status == FL_ERR_PEER_VERSION);
  CHECK(reply.version == kTcpWireVersion);
  CHECK(listener.accepted == 0);
}

TEST_CASE("token digest depends on token and session", "[transport][tcp]") {
  uint8_t a[kTokenDigestBytes], b[kTokenDigestBytes];
  tokenDigest("token", 1, a);
  tokenDigest("token", 1, b);
  CHECK(digestEqual(a, b));
  tokenDigest("token", 2, b);
  CHECK_FALSE(digestEqual(a, b));
  tokenDigest("tokeN", 1, b);
  CHECK_FALSE(digestEqual(a, b));
  std::string long1(100, 'x'), long2(100, 'x');
  long2.back() = 'y';
  tokenDigest(long1, 1, a);
  tokenDigest(long2, 1, b);
  CHECK_FALSE(digestEqual(a, b));
}

TEST_CASE("token digest is HMAC-SHA256 of the session id, keyed by the token", "[transport][tcp]") {
  // Known answers, from Python's hmac module:
  //   hmac.new(b'token', struct.pack('<Q', 0x0123456789abcdef), hashlib.sha256)
  //   hmac.new(b'', struct.pack('<Q', 1), hashlib.sha256)
  const auto hex = [](const uint8_t* d) {
    std::string s;
    char two[3];
    for (size_t i = 0; i < kTokenDigestBytes; ++i) {
      std::snprintf(two, sizeof two, "%02x", d[i]);
      s += two;
    }
    return s;
  };
  uint8_t d[kTokenDigestBytes];
  tokenDigest("token", 0x0123456789abcdefull, d);
  CHECK(hex(d) == "af0b97f1fd344e1532c86e1b522fcb11508e7d695c8a0c759bd40c728dbee370");
  tokenDigest("", 1, d);
  CHECK(hex(d) == "45642932870525261935930d25eabf7cb0212dd40d3acf965a6b6efa65a0fd26");
}

TEST_CASE("parseHostPort", "[transport][tcp]") {
  auto v4 = parseHostPort("0.0.0.0:7701");
  REQUIRE(v4.ok());
  CHECK(v4->first == "0.0.0.0");
  CHECK(v4->second == 7701);
  auto v6 = parseHostPort("[::1]:0");
  REQUIRE(v6.ok());
  CHECK(v6->first == "::1");
  CHECK(v6->second == 0);
  CHECK_FALSE(parseHostPort("nohost").ok());
  CHECK_FALSE(parseHostPort("h:70000").ok());
  CHECK_FALSE(parseHostPort("h:").ok());
}

}  // namespace framelink::transport::tcp
