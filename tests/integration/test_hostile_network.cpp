// Hostile network hosts: strangers that stall tcp handshakes, a peer whose
// gRPC Session never opens its data channel, and strangers without the token
// on the gRPC and tcp data ports must not keep peers from linking, delay
// SIGTERM or flood the daemon (the local clients' attacks are in
// test_hostile.cpp).
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "framelink/v1/link.grpc.pb.h"
#include "harness.h"
#include "hostile_util.h"

using namespace framelink::integ;
namespace v1 = framelink::v1;

TEST_CASE("hostile: strangers that stall tcp handshakes do not keep a peer from linking",
          "[integration][hostile]") {
  DaemonPair pair(pairOptions());
  requireServing(pair.a(), pair.b(), "good", 2);
  // Three strangers send ten bytes of a hello each and stall.
  std::vector<int> stalled;
  for (int i = 0; i < 3; ++i) stalled.push_back(stalledTcp(pair.b().dataPort(), 10));
  // The peer restarts and must link at once, not after the strangers' deadlines.
  pair.a().kill9();
  const auto start = std::chrono::steady_clock::now();
  pair.a().restart();
  REQUIRE(pair.a().waitForLog("connected to peer", Millis(10000)));
  const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
  INFO("linked after " << took.count() << " ms");
  CHECK(took < Millis(4000));  // inline handshakes held 5 s each (15 s for these three)
  requireServing(pair.a(), pair.b(), "good2", 3);
  // Their deadline passes: dropped, counted, logged once (not three times).
  CHECK(waitUntil(
      [&] { return pair.b().metric("framelink_handshakes_timed_out_total{transport=\"tcp\"}") >= 3; },
      Millis(6000), Millis(50)));
  for (int s : stalled) ::close(s);
  requireQuickCleanStop(pair.a());
  requireQuickCleanStop(pair.b());
}

// The versions this build speaks (proxy/link/protocol_versions.h kProtocolVersion,
// proxy/transport/tcp/tcp_wire.h kTcpWireVersion): a bump must change these
// tests too, on purpose (test_peer_versions.cpp tests the version range).
constexpr uint32_t kPeerProtocolVersion = 3;
constexpr uint8_t kTcpWireVersion = 4;

// A Hello as a daemon of `version` sends it, with the right token.
static v1::PeerMessage helloOf(uint32_t version, const std::string& daemon_id, uint64_t session_id) {
  v1::PeerMessage hello;
  hello.mutable_hello()->set_protocol_version(version);
  hello.mutable_hello()->set_daemon_id(daemon_id);
  hello.mutable_hello()->add_transports("tcp");
  hello.mutable_hello()->set_token("integ-secret");
  hello.mutable_hello()->set_session_id(session_id);
  hello.mutable_hello()->set_instance(1);
  return hello;
}

TEST_CASE("hostile: a Session that never opens its data channel does not delay SIGTERM",
          "[integration][hostile]") {
  DaemonPair pair(pairOptions());
  // A peer with the right token says Hello, takes the HelloAck and never
  // dials the tcp data port: the daemon waits for the data channel.
  auto channel = grpc::CreateChannel(pair.b().grpcAddress(), grpc::InsecureChannelCredentials());
  auto stub = v1::Link::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-framelink-token", "integ-secret");
  auto stream = stub->Session(&ctx);
  REQUIRE(stream->Write(helloOf(kPeerProtocolVersion, "stalling-peer", 0x5eed)));
  v1::PeerMessage ack;
  REQUIRE(stream->Read(&ack));
  REQUIRE(ack.has_hello_ack());
  CHECK(ack.hello_ack().transport() == "tcp");
  requireQuickCleanStop(pair.b());
  ctx.TryCancel();
  requireQuickCleanStop(pair.a());
}

TEST_CASE(
    "hostile: strangers on the gRPC and tcp data ports are refused, counted, logged a few times, not kept",
    "[integration][hostile]") {
  DaemonPair pair(pairOptions());
  requireServing(pair.a(), pair.b(), "good", 2);
  const int64_t auth_before = pair.b().metric("framelink_auth_failures_total");
  // Calls without the token, as fast as they go.
  auto channel = grpc::CreateChannel(pair.b().grpcAddress(), grpc::InsecureChannelCredentials());
  auto stub = v1::Link::NewStub(channel);
  constexpr int kCalls = 300;
  for (int i = 0; i < kCalls; ++i) {
    grpc::ClientContext ctx;
    if (i % 2 == 1) ctx.AddMetadata("x-framelink-token", "guess-" + std::to_string(i));
    auto stream = i % 3 == 0 ? nullptr : stub->Session(&ctx);
    if (stream) {
      CHECK(stream->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED);
    } else {
      auto data = stub->Data(&ctx);
      CHECK(data->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED);
    }
  }
  CHECK(pair.b().metric("framelink_auth_failures_total") - auth_before == kCalls);
  // Complete tcp data handshakes with a guessed token: refused and counted the same way.
  constexpr int kHellos = 20;
  for (int i = 0; i < kHellos; ++i) {
    uint8_t hello[64] = {'F', 'L', 'T', 'C', 'P', 'D', 'A', 'T', kTcpWireVersion};  // magic, version (LE)
    std::memset(hello + 16, 0x5a + i, sizeof hello - 16);  // session id, token digest
    int fd = stalledTcp(pair.b().dataPort(), 0);
    REQUIRE(::send(fd, hello, sizeof hello, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof hello));
    uint32_t reply[2] = {};
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);
    CHECK(::recv(fd, reply, sizeof reply, MSG_WAITALL) == static_cast<ssize_t>(sizeof reply));
    CHECK(reply[0] == static_cast<uint32_t>(FL_ERR_AUTH));
    ::close(fd);
  }
  CHECK(pair.b().metric("framelink_auth_failures_total") - auth_before == kCalls + kHellos);
  // Connections that never say anything (no TLS, no HTTP/2 preface) are
  // closed after the connect timeout, not kept for minutes.
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(stalledTcp(pair.b().grpcPort(), 0));
  const auto start = std::chrono::steady_clock::now();
  for (int fd : silent) {
    // The server's own preface may come first; then the close (or a reset).
    ssize_t n = 1;
    while (n > 0) {
      pollfd p{fd, POLLIN, 0};
      const auto left =
          Millis(15000) - std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
      REQUIRE(::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) == 1);
      char buf[256];
      n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) n = 1;
    }
    CHECK(n <= 0);
    ::close(fd);
  }
  const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
  INFO("silent connections closed after " << took.count() << " ms");
  CHECK(took < Millis(10000));
  // The peers are still linked and serving; the log says it a few times, not 300.
  requireServing(pair.a(), pair.b(), "good2", 3);
  const std::string log = pair.b().log();
  size_t lines = 0;
  for (size_t at = log.find("wrong or missing token"); at != std::string::npos;
       at = log.find("wrong or missing token", at + 1)) {
    ++lines;
  }
  INFO("log lines about the token: " << lines);
  CHECK(lines >= 1);
  CHECK(lines <= 6);
  requireQuickCleanStop(pair.a());
  requireQuickCleanStop(pair.b());
}
