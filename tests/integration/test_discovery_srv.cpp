// [discovery] through DNS SRV records, served by a real dnsmasq: daemons named
// by the records ask each other what they are (Describe), under mutual TLS a
// daemon counts only as what its certificate names, and Describe refuses
// what a stranger or a liar sends.
#include <grpcpp/grpcpp.h>
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "client_util.h"
#include "discovery_rig.h"
#include "framelink/framelink.h"
#include "framelink/v1/link.grpc.pb.h"
#include "harness.h"
#include "site_ca.h"

using namespace framelink::integ;

TEST_CASE(
    "discovery (DNS SRV): daemons named by SRV records ask each other what they are; frames go where "
    "readers are; one that claims a taken id or has the wrong token is left out",
    "[integration][discovery]") {
  DnsMasq dns;
  DaemonProcess a(srvMember("srv-a", dns, "fleet-secret"));
  DaemonProcess b(srvMember("srv-b", dns, "fleet-secret"));
  DaemonProcess twin(srvMember("srv-b", dns, "fleet-secret"));      // says it is srv-b too
  DaemonProcess stranger(srvMember("srv-x", dns, "other-secret"));  // not of this fleet
  const uint16_t nobody = freePort();                               // a host whose daemon is down
  dns.serve({{"a", "127.0.0.1", a.grpcPort()},
             {"b", "127.0.0.1", b.grpcPort()},
             {"down", "127.0.0.1", nobody},
             {"twin", "127.0.0.1", twin.grpcPort()},
             {"x", "127.0.0.1", stranger.grpcPort()}});
  CHECK(waitForMetric(a, "framelink_discovery_peers", 1) == 1);
  CHECK(a.metric("framelink_discovery_registry_up") == 1);
  CHECK(a.waitForLog("discovery: srv-b found (not dialed from here; no readers)", Millis(10000)));
  // Records sort by host: b's comes before twin's, and takes the id.
  CHECK(a.waitForLog("twin.fl.test (127.0.0.1:" + std::to_string(twin.grpcPort()) +
                         "): it says it is 'srv-b', as 127.0.0.1:" + std::to_string(b.grpcPort()) + " does",
                     Millis(10000)));
  CHECK(a.waitForLog(
      "x.fl.test (127.0.0.1:" + std::to_string(stranger.grpcPort()) + "): wrong or missing token",
      Millis(10000)));
  CHECK(a.waitForLog("down.fl.test (127.0.0.1:" + std::to_string(nobody) + "): ", Millis(10000)));
  // The twin and the stranger are refused claims, counted once each however often they are read;
  // a daemon that does not answer is left out, not counted.
  CHECK(waitForMetric(a, "framelink_discovery_entries_refused_total", 2) >= 2);
  std::this_thread::sleep_for(Millis(2500));  // two more reads of the records
  CHECK(a.metric("framelink_discovery_entries_refused_total") == 2);
  CHECK(a.metric("framelink_links_up") == 0);

  // A reader on B: B tells the others at once (A, with no producer, asks no one again), then a
  // producer on A: A dials B, and its first frame goes there.
  Client on_b = attachConsumer(b, "srv-line", 4, 256 * 1024);
  REQUIRE(
      a.waitForLog("srv-b changed (not dialed from here; readers: srv-line [queue group])", Millis(5000)));
  Client producer = attachProducer(a, "srv-line", 4, 256 * 1024);
  REQUIRE(a.waitForLog("srv-b changed (dialed at 127.0.0.1:" + std::to_string(b.grpcPort()) +
                           "; readers: srv-line [queue group])",
                       Millis(10000)));
  for (uint64_t id = 1; id <= 3; ++id) sendOne(producer.get(), on_b.get(), id);
  CHECK(a.metric("framelink_links_up") == 1);
  CHECK(twin.metric("framelink_links_up") == 0);

  // The DNS server goes: what runs stays.  Back (with A's and B's records), A reads it again.
  dns.stop();
  CHECK(a.waitForLog("reading the SRV records failed", Millis(10000)));
  CHECK(waitUntil([&] { return a.metric("framelink_discovery_registry_up") == 0; }, Millis(10000)));
  for (uint64_t id = 4; id <= 5; ++id) sendOne(producer.get(), on_b.get(), id);
  // Meanwhile B's readers change: B tells the daemons it knows all the same.
  Client more_on_b = attachConsumer(b, "srv-more", 4, 256 * 1024);
  CHECK(a.waitForLog("srv-b changed (dialed at 127.0.0.1:" + std::to_string(b.grpcPort()) +
                         "; readers: srv-line [queue group], srv-more [queue group])",
                     Millis(5000)));
  CHECK(a.metric("framelink_discovery_registry_up") == 0);  // the DNS server is still away
  dns.serve({{"a", "127.0.0.1", a.grpcPort()}, {"b", "127.0.0.1", b.grpcPort()}});
  CHECK(a.waitForLog("discovery: DNS SRV " + std::string(DnsMasq::kName) + " answers again", Millis(10000)));
  CHECK(waitUntil([&] { return a.metric("framelink_discovery_registry_up") == 1; }, Millis(10000)));
  sendOne(producer.get(), on_b.get(), 6);
}

TEST_CASE(
    "discovery (DNS SRV) under mutual TLS: an answer counts when the certificate names the record's host "
    "and the id given",
    "[integration][discovery][tls]") {
  const SiteCa site("fl-srv-ca", {});
  site.issue("srv-a", {"a.fl.test"});
  site.issue("srv-b", {"b.fl.test"});
  site.issue("srv-c", {"liar.fl.test"});  // a host of the site, whose daemon says it is srv-b
  DnsMasq dns;
  auto member = [&](const std::string& id, const std::string& cert) {
    DaemonProcess::Options o = srvMember(id, dns, "fleet-secret");
    o.extra_args = concat(o.extra_args, site.tls(cert));
    return o;
  };
  DaemonProcess a(member("srv-a", "srv-a"));
  DaemonProcess b(member("srv-b", "srv-b"));
  DaemonProcess liar(member("srv-b", "srv-c"));
  dns.serve({{"a", "127.0.0.1", a.grpcPort()},
             {"b", "127.0.0.1", b.grpcPort()},
             {"liar", "127.0.0.1", liar.grpcPort()}});
  CHECK(waitForMetric(a, "framelink_discovery_peers", 1) == 1);
  CHECK(a.waitForLog("liar.fl.test (127.0.0.1:" + std::to_string(liar.grpcPort()) +
                         "): it says it is 'srv-b', but its certificate does not name it",
                     Millis(10000)));
  Client on_b = attachConsumer(b, "srv-tls", 4, 256 * 1024);
  REQUIRE(
      a.waitForLog("srv-b changed (not dialed from here; readers: srv-tls [queue group])", Millis(10000)));
  Client producer = attachProducer(a, "srv-tls", 4, 256 * 1024);
  for (uint64_t id = 1; id <= 3; ++id) sendOne(producer.get(), on_b.get(), id);
  CHECK(liar.metric("framelink_links_up") == 0);
}

TEST_CASE(
    "discovery (DNS SRV): Describe answers with the daemon's readers and their kinds; a call with a wrong "
    "token, too many streams or a malformed word is refused or left out, and counted",
    "[integration][discovery]") {
  DnsMasq dns;
  DaemonProcess a(srvMember("srv-a", dns, "fleet-secret"));
  Client member = attachConsumer(a, "cam0", 4, 256 * 1024);
  Client subscriber = attachWith(a, FL_ROLE_CONSUMER, "cam1", true, 4, 256 * 1024);
  auto stub =
      framelink::v1::Link::NewStub(grpc::CreateChannel(a.grpcAddress(), grpc::InsecureChannelCredentials()));
  auto describe = [&](const std::string& token, const framelink::v1::DaemonStreams& asker,
                      framelink::v1::DescribeReply* reply) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("x-framelink-token", token);
    framelink::v1::DescribeRequest request;
    *request.mutable_asker() = asker;
    return stub->Describe(&ctx, request, reply);
  };
  framelink::v1::DaemonStreams me;
  me.set_daemon_id("srv-z");
  me.set_instance(5);
  me.set_as_of_ns(1);

  // Its readers, each with its kind (published as the consumers attach).
  framelink::v1::DescribeReply reply;
  REQUIRE(waitUntil(
      [&] {
        reply.Clear();
        return describe("fleet-secret", me, &reply).ok() && reply.answerer().readers_size() == 2;
      },
      Millis(5000), Millis(100)));
  CHECK(reply.answerer().daemon_id() == "srv-a");
  REQUIRE(reply.answerer().grouped_size() == 1);
  CHECK(reply.answerer().grouped(0) == "cam0");
  REQUIRE(reply.answerer().subscribed_size() == 1);
  CHECK(reply.answerer().subscribed(0) == "cam1");
  CHECK(a.metric("framelink_discovery_words_dropped_total") == 0);

  CHECK(describe("wrong-secret", me, &reply).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(a.metric("framelink_auth_failures_total") == 1);

  framelink::v1::DaemonStreams wordy = me;
  for (int i = 0; i < 4097; ++i) wordy.add_readers("s" + std::to_string(i));
  const grpc::Status refused = describe("fleet-secret", wordy, &reply);
  CHECK(refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(refused.error_message() == "more than 4096 streams");
  CHECK(a.metric("framelink_discovery_words_dropped_total") == 1);

  // A word whose subscribed stream is none of its readers: answered, but not kept.
  framelink::v1::DaemonStreams lying = me;
  lying.set_as_of_ns(2);
  lying.add_readers("cam0");
  lying.add_subscribed("cam9");
  CHECK(describe("fleet-secret", lying, &reply).ok());
  CHECK(a.metric("framelink_discovery_words_dropped_total") == 2);
}
