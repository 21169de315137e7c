// Peer protocol versions: a daemon speaks a range of them, a link runs at the
// newest version both sides speak, and a peer that shares none with it is
// refused as a version mismatch -- on the listener and on the dialer, each
// naming both ranges and which side to upgrade -- never as a wrong token.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include <memory>
#include <mutex>
#include <string>

#include "client_util.h"
#include "framelink/v1/link.grpc.pb.h"
#include "harness.h"
#include "hostile_util.h"

using namespace framelink::integ;
namespace v1 = framelink::v1;

namespace {

// The range this build speaks (proxy/link/protocol_versions.h): a bump must
// change this test too, on purpose.
constexpr uint32_t kNewest = 3;
constexpr const char* kVersionsKey = "x-framelink-protocol-versions";

struct Answer {
  grpc::Status status;
  bool acked = false;
  uint32_t agreed = 0;   // HelloAck's protocol_version
  std::string versions;  // the refusal's trailing kVersionsKey
};

// A peer with the right token says Hello speaking [oldest, newest] (oldest 0:
// a daemon from before ranges) and reads the answer.
Answer sayHello(const DaemonProcess& d, uint32_t newest, uint32_t oldest, uint64_t session_id) {
  auto stub = v1::Link::NewStub(grpc::CreateChannel(d.grpcAddress(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-framelink-token", "integ-secret");
  auto stream = stub->Session(&ctx);
  v1::PeerMessage hello;
  hello.mutable_hello()->set_protocol_version(newest);
  hello.mutable_hello()->set_min_protocol_version(oldest);
  hello.mutable_hello()->set_daemon_id("versioned-" + std::to_string(session_id));
  hello.mutable_hello()->add_transports("tcp");
  hello.mutable_hello()->set_token("integ-secret");
  hello.mutable_hello()->set_session_id(session_id);
  hello.mutable_hello()->set_instance(session_id);
  Answer a;
  v1::PeerMessage reply;
  if (stream->Write(hello) && stream->Read(&reply) && reply.has_hello_ack()) {
    a.acked = true;
    a.agreed = reply.hello_ack().protocol_version();
  }
  if (a.acked) ctx.TryCancel();  // an admitted Session: no data channel follows
  a.status = stream->Finish();
  for (const auto& [key, value] : ctx.GetServerTrailingMetadata()) {
    if (key == kVersionsKey) a.versions.assign(value.data(), value.size());
  }
  return a;
}

// A listener of a release that speaks only versions 4 and 5: it refuses every
// Session as this build's listener refuses one it shares no version with.
class FutureListener final : public v1::Link::Service {
 public:
  grpc::Status Session(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<v1::PeerMessage, v1::PeerMessage>* stream) override {
    v1::PeerMessage first;
    if (stream->Read(&first) && first.has_hello()) {
      std::lock_guard<std::mutex> lock(mu_);
      newest_ = first.hello().protocol_version();
      oldest_ = first.hello().min_protocol_version();
    }
    ctx->AddTrailingMetadata(kVersionsKey, "4-5");
    return {grpc::StatusCode::FAILED_PRECONDITION, "no protocol version in common"};
  }
  std::pair<uint32_t, uint32_t> heard() {
    std::lock_guard<std::mutex> lock(mu_);
    return {oldest_, newest_};
  }

 private:
  std::mutex mu_;
  uint32_t newest_ = 0;
  uint32_t oldest_ = 0;
};

}  // namespace

TEST_CASE(
    "versions: a listener runs a link at the newest version both speak and refuses a peer it "
    "shares none with as a version mismatch, naming both ranges",
    "[integration][hostile]") {
  DaemonPair pair(pairOptions());
  DaemonProcess& b = pair.b();

  // A release ahead that still speaks this one's version: linked at it.
  const Answer next = sayHello(b, kNewest + 1, kNewest, 0x101);
  INFO("next release: " << next.status.error_message());
  CHECK(next.acked);
  CHECK(next.agreed == kNewest);
  // A malformed range (oldest above newest) is taken as its newest alone.
  const Answer odd = sayHello(b, kNewest, kNewest + 7, 0x102);
  CHECK(odd.acked);
  CHECK(odd.agreed == kNewest);

  // A daemon from before ranges, older: refused, told this daemon's range.
  const Answer old = sayHello(b, 1, 0, 0x103);
  INFO("old: " << old.status.error_message());
  CHECK_FALSE(old.acked);
  CHECK(old.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(old.versions == std::to_string(kNewest));
  CHECK_THAT(old.status.error_message(), Catch::Contains("the peer speaks " + std::to_string(kNewest)) &&
                                             Catch::Contains("this daemon 1") &&
                                             Catch::Contains("upgrade the daemon here"));
  CHECK(b.waitForLog("the peer speaks 1, this daemon " + std::to_string(kNewest), Millis(5000)));
  CHECK(b.waitForLog("upgrade the peer", Millis(5000)));

  // Two releases ahead, no longer speaking this one's version.
  const Answer ahead = sayHello(b, kNewest + 2, kNewest + 1, 0x104);
  CHECK_FALSE(ahead.acked);
  CHECK(ahead.versions == std::to_string(kNewest));
  // (The daemon's log line about it is rate-limited behind the one above;
  // the refusal itself names both ranges from the refused side.)
  const std::string range = std::to_string(kNewest + 1) + "-" + std::to_string(kNewest + 2);
  CHECK_THAT(ahead.status.error_message(),
             Catch::Contains("this daemon " + range) && Catch::Contains("upgrade the peer"));

  // Counted as what they are, not as wrong tokens.
  CHECK(b.metric("framelink_peer_version_mismatches_total") == 2);
  CHECK(b.metric("framelink_auth_failures_total") == 0);
  requireServing(pair.a(), b, "after-versions", 2);
}

TEST_CASE("versions: a dialer refused by a peer it shares no version with says so, with both ranges",
          "[integration][hostile]") {
  FutureListener future;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&future);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server);
  REQUIRE(port > 0);

  DaemonProcess::Options o;
  o.id = "present";
  o.token = "integ-secret";
  o.peers = {"future=127.0.0.1:" + std::to_string(port)};
  o.extra_args = kMetrics;
  DaemonProcess d(o);
  const std::string range = std::to_string(kNewest);
  CHECK(d.waitForLog("no protocol version in common: the peer speaks 4-5, this daemon " + range,
                     Millis(10000)));
  CHECK(d.waitForLog("upgrade the daemon here", Millis(5000)));
  // The Hello offered this build's whole range.
  CHECK(future.heard() == std::make_pair(kNewest, kNewest));
  CHECK(waitUntil([&] { return d.metric("framelink_peer_version_mismatches_total") >= 1; }, Millis(5000),
                  Millis(50)));
  CHECK(d.metric("framelink_auth_failures_total") == 0);
  server->Shutdown();
}
