// A peer daemon that lies (hostile_peer.h) against a real framelinkd with a
// real local client: what it sends out of bounds closes its own link, what
// names nothing it was given is refused frame by frame, what it leaves
// unread costs the daemon bounded memory, and the daemon goes on serving
// everyone else.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "client_util.h"
#include "flood_util.h"
#include "harness.h"
#include "hostile_peer.h"
#include "hostile_script.h"
#include "hostile_util.h"

using namespace framelink::integ;
namespace v1 = framelink::v1;

namespace {

// Waits for the daemon to cut the peer's link for breaking the protocol:
// the Session ends and the daemon logs why.  A Fin that got through must
// say PROTOCOL and why (whether it gets through is checked on its own below).
void requireProtocolClose(HostilePeer& peer, DaemonProcess& daemon, const std::string& why) {
  REQUIRE(peer.waitFor([](const PeerInbox& in) { return in.session_ended; }, Millis(5000)));
  CHECK(daemon.waitForLog("protocol error: " + why, Millis(2000)));
  v1::Fin fin;
  if (peer.finReceived(&fin)) {
    INFO("Fin reason: " << fin.reason());
    CHECK(fin.code() == v1::ERROR_CODE_PROTOCOL);
    CHECK_THAT(fin.reason(), Catch::Contains(why));
  }
}

// One record whose ACKs, each within its own bound (a run of 4096), name
// more than 65536 frames together.
v1::ControlBatch oversizedAckRecord() {
  v1::ControlBatch record;
  for (uint64_t i = 0; i < 17; ++i) {
    auto* ack = record.add_messages()->mutable_ack();
    ack->set_stream_id(1);
    ack->add_runs(1 + i * 4096);
    ack->add_runs(4096);
  }
  return record;
}

}  // namespace

TEST_CASE("hostile peer: a CreditRevoke naming too many credits closes its link as a protocol error",
          "[integration][hostile_peer]") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  DaemonPair pair(pairOf(transport));
  requireServing(pair.a(), pair.b(), "good", 2);
  Client consumer = attachConsumer(pair.b(), "hp-revoke");
  HostilePeer peer(peerOf(pair, "hostile-revoke", 1, transport));
  peer.readSession();
  peer.readData();
  openAndAwaitCredits(peer, 7, "hp-revoke");
  v1::PeerMessage revoke;
  revoke.mutable_credit_revoke()->set_stream_id(7);
  revoke.mutable_credit_revoke()->set_returned(true);
  for (uint64_t id = 1; id <= 70000; ++id) revoke.mutable_credit_revoke()->add_credit_ids(id);
  REQUIRE(peer.sendControl(revoke));
  requireProtocolClose(peer, pair.b(), "revoke of more than 65536 credits");
  CHECK(pair.b().alive());
  requireServing(pair.a(), pair.b(), "good2", 2);
}

TEST_CASE("hostile peer: ACKs naming more than 65536 frames in one record close its link as a protocol error",
          "[integration][hostile_peer]") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  DaemonPair pair(pairOf(transport));
  requireServing(pair.a(), pair.b(), "good", 2);
  HostilePeer peer(peerOf(pair, "hostile-ack", 2, transport));
  peer.readSession();
  peer.readData();
  REQUIRE(peer.sendControl(oversizedAckRecord()));
  requireProtocolClose(peer, pair.b(), "a control record ACKs more than 65536 frames");
  CHECK(pair.b().alive());
  requireServing(pair.a(), pair.b(), "good2", 2);
}

// The daemon ends the call only once its Session writer wrote the Fin
// (SessionWriter::sendLast), so a peer that reads learns why its link was
// closed, every time.
TEST_CASE("hostile peer: the PROTOCOL fin reaches the peer before its link is cut",
          "[integration][hostile_peer]") {
  const std::string transport = "grpc";
  DaemonPair pair(pairOf(transport));
  int fins = 0;
  constexpr int kTries = 5;
  for (int i = 0; i < kTries; ++i) {
    HostilePeer peer(peerOf(pair, "hostile-fin-" + std::to_string(i), 10 + i, transport));
    peer.readSession();
    peer.readData();
    REQUIRE(peer.sendControl(oversizedAckRecord()));
    REQUIRE(peer.waitFor([](const PeerInbox& in) { return in.session_ended; }, Millis(5000)));
    v1::Fin fin;
    fins += peer.finReceived(&fin) ? 1 : 0;
  }
  INFO("links cut: " << kTries << ", Fins the peer received: " << fins);
  CHECK(fins == kTries);
}

TEST_CASE("hostile peer: frames for a stream it did not open or a credit it was not granted are NACKed",
          "[integration][hostile_peer]") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  DaemonPair pair(pairOf(transport));
  Client consumer = attachConsumer(pair.b(), "hp-nack");
  HostilePeer peer(peerOf(pair, "hostile-nack", 3, transport));
  peer.readSession();
  peer.readData();
  const std::vector<uint64_t> credits = openAndAwaitCredits(peer, 7, "hp-nack");
  REQUIRE(credits.size() >= 2);
  const std::string payload(512, 'h');
  // A granted credit, but a stream the peer never opened.
  REQUIRE(peer.sendFrame(frameHeader(99, 1, credits[0], payload.size()), payload));
  // The stream it opened, but a credit never granted.
  REQUIRE(peer.sendFrame(frameHeader(7, 1, 0x7777777, payload.size()), payload));
  CHECK(
      peer.waitFor([](const PeerInbox& in) { return nacksOf(in, 99, 1, v1::ERROR_CODE_UNKNOWN_STREAM) == 1; },
                   Millis(5000)));
  CHECK(
      peer.waitFor([](const PeerInbox& in) { return nacksOf(in, 7, 1, v1::ERROR_CODE_UNKNOWN_CREDIT) == 1; },
                   Millis(5000)));
  fl_frame frame{};
  CHECK(fl_receive(consumer.get(), &frame, 300) == FL_ETIMEDOUT);
  // The link stays: a frame into a credit it holds arrives, and it is the only one.
  v1::Fin fin;
  CHECK_FALSE(peer.finReceived(&fin));
  REQUIRE(peer.sendFrame(frameHeader(7, 1, credits[1], payload.size()), payload));
  REQUIRE(fl_receive(consumer.get(), &frame, 5000) == FL_OK);
  CHECK(frame.frame_id == 1001);
  CHECK(frame.length == payload.size());
  CHECK(fl_release(consumer.get(), frame.slot) == FL_OK);
  CHECK(fl_receive(consumer.get(), &frame, 200) == FL_ETIMEDOUT);
  CHECK(peer.waitFor(
      [](const PeerInbox& in) {
        return countMessages(
                   in, [](const v1::PeerMessage& m) { return m.has_ack() && m.ack().stream_id() == 7; }) >= 1;
      },
      Millis(5000)));
  CHECK_FALSE(peer.finReceived(&fin));
  CHECK_FALSE(peer.inbox().session_ended);
  requireServing(pair.a(), pair.b(), "good", 2);
}

TEST_CASE(
    "hostile peer: pull credits take no write, offers into credits it does not hold are NACKed, and an offer "
    "into a credit taken already closes its link",
    "[integration][hostile_peer]") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  DaemonPair pair(pairOf(transport, {"--pull-stream", "hp-pull"}));
  Client pulled = attachConsumer(pair.b(), "hp-pull");
  Client pushed = attachConsumer(pair.b(), "hp-push");
  HostilePeer peer(peerOf(pair, "hostile-pull", 9, transport));
  peer.readSession();
  peer.readData();
  const std::vector<uint64_t> credits = openAndAwaitCredits(peer, 7, "hp-pull");
  const std::vector<uint64_t> push_credits = openAndAwaitCredits(peer, 8, "hp-push");
  REQUIRE(credits.size() >= 3);
  REQUIRE(!push_credits.empty());
  // The pull stream's credits say so, and carry no address or key to write to.
  const PeerInbox granted = peer.inbox();
  CHECK(grantsSay(granted, 7, true));
  CHECK_FALSE(grantsSay(granted, 7, false));
  CHECK(grantsSay(granted, 8, false));
  CHECK(countMessages(granted, [](const v1::PeerMessage& m) {
          if (!m.has_credit_grant() || m.credit_grant().stream_id() != 7) return false;
          if (m.credit_grant().regions_size() > 0 || m.credit_grant().slot_credits_size() > 0) return true;
          for (const auto& c : m.credit_grant().credits()) {
            if (c.remote_addr() != 0 || c.rkey() != 0) return true;
          }
          return false;
        }) == 0);
  const std::string payload(512, 'p');
  // Written into a pull credit: refused, never delivered.
  REQUIRE(peer.sendFrame(frameHeader(7, 1, credits[0], payload.size()), payload));
  // Offered into a credit never granted, and into a pushed stream's credit.
  REQUIRE(peer.sendControl(offer(frameHeader(7, 2, 0x7777777, payload.size()), 1)));
  REQUIRE(peer.sendControl(offer(frameHeader(8, 1, push_credits[0], payload.size()), 2)));
  // Offered into a pull credit, larger than its slot: refused before any read.
  REQUIRE(peer.sendControl(offer(frameHeader(7, 3, credits[1], (1 << 20) + 1), 3)));
  CHECK(
      peer.waitFor([](const PeerInbox& in) { return nacksOf(in, 7, 1, v1::ERROR_CODE_UNKNOWN_CREDIT) == 1; },
                   Millis(5000)));
  CHECK(
      peer.waitFor([](const PeerInbox& in) { return nacksOf(in, 7, 2, v1::ERROR_CODE_UNKNOWN_CREDIT) == 1; },
                   Millis(5000)));
  CHECK(
      peer.waitFor([](const PeerInbox& in) { return nacksOf(in, 8, 1, v1::ERROR_CODE_UNKNOWN_CREDIT) == 1; },
                   Millis(5000)));
  CHECK(peer.waitFor([](const PeerInbox& in) { return nacksOf(in, 7, 3, v1::ERROR_CODE_PROTOCOL) == 1; },
                     Millis(5000)));
  fl_frame frame{};
  CHECK(fl_receive(pulled.get(), &frame, 300) == FL_ETIMEDOUT);
  CHECK(fl_receive(pushed.get(), &frame, 100) == FL_ETIMEDOUT);
  v1::Fin fin;
  CHECK_FALSE(peer.finReceived(&fin));
  // A read of this offer goes out (the peer never answers it); a second
  // offer into the same credit would have two frames land in one slot.
  REQUIRE(peer.sendControl(offer(frameHeader(7, 4, credits[2], payload.size()), 4)));
  REQUIRE(peer.sendControl(offer(frameHeader(7, 5, credits[2], payload.size()), 5)));
  requireProtocolClose(peer, pair.b(),
                       "an offer (stream 7 seq 5) into credit " + std::to_string(credits[2]) +
                           ", which an earlier offer has taken");
  CHECK(fl_receive(pulled.get(), &frame, 100) == FL_ETIMEDOUT);
  requireServing(pair.a(), pair.b(), "good", 2);
}

namespace {

constexpr uint64_t kFrameBytes = 1 << 20;
constexpr size_t kFrames = 8;

}  // namespace

TEST_CASE(
    "hostile peer: ACKs that come before the frames were sent settle nothing early, even when the producer "
    "exits",
    "[integration][hostile_peer]") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  const std::string name = GENERATE(as<std::string>{}, "hp-ack-early", "hp-ack-exit");
  const bool producer_exits = name == "hp-ack-exit";
  DaemonPair pair(pairRoutingTo(transport, "hostile-rx"));
  HostilePeer peer(peerOf(pair, "hostile-rx", 4, transport));
  peer.readSession();
  Client producer = attachProducer(pair.b(), name, kFrames, kFrameBytes);
  const uint64_t stream = awaitStreamOpen(peer, name);
  REQUIRE(peer.sendControl(grant(stream, 1, kFrames, kFrameBytes)));
  for (uint64_t i = 1; i <= kFrames; ++i) submitFrame(producer.get(), i, kFrameBytes);
  // Every sequence ACKed while the data channel is not read: most of the
  // frames cannot have left the daemon yet.
  std::this_thread::sleep_for(Millis(100));
  REQUIRE(peer.sendControl(ackRun(stream, 1, kFrames)));
  std::vector<fl_completion> early;
  if (producer_exits) {
    producer.reset();
  } else {
    early = collectCompletions(producer.get(), kFrames, Millis(1000));
  }
  peer.readData();
  REQUIRE(peer.waitFor([](const PeerInbox& in) { return in.frames.size() == kFrames || in.data_ended; },
                       Millis(10000)));
  const PeerInbox in = peer.inbox();
  CHECK(in.frames.size() == kFrames);
  CHECK(in.payload_bytes == kFrames * kFrameBytes);
  for (size_t i = 0; i < in.frames.size(); ++i) {
    CHECK(in.frames[i].sequence() == i + 1);
    CHECK(in.frames[i].frame_id() == i + 1);
    CHECK(in.frames[i].length() == kFrameBytes);
  }
  INFO("completions before the peer read any frame: " << early.size());
  if (!producer_exits) {
    // A completion means the daemon is done with the slot: not before its
    // frame left, which for most of them needs the peer to read.  Those
    // that left did so in order, on the one data channel.
    CHECK(early.size() < kFrames);
    for (size_t i = 0; i < early.size(); ++i) CHECK(early[i].sequence == i + 1);
    std::vector<fl_completion> rest =
        collectCompletions(producer.get(), kFrames - early.size(), Millis(5000));
    early.insert(early.end(), rest.begin(), rest.end());
    REQUIRE(early.size() == kFrames);
    for (const auto& c : early) CHECK(c.status == FL_OK);
  }
  CHECK(pair.b().alive());
  v1::Fin fin;
  CHECK_FALSE(peer.finReceived(&fin));
  requireServing(pair.a(), pair.b(), "good-" + name, 2);
}

TEST_CASE("hostile peer: a peer that reads nothing while it provokes NACKs is cut, in bounded memory",
          "[integration][hostile_peer]") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  DaemonPair pair(pairOf(transport));
  Client consumer = attachConsumer(pair.b(), "hp-deaf");
  HostilePeer peer(peerOf(pair, "hostile-deaf", 5, transport));
  // The peer reads neither its Session nor its data channel, ever.
  REQUIRE(peer.sendSession(streamOpen(7, "hp-deaf")));
  // Each frame names a credit never granted: a NACK to send back for each,
  // and a keepalive to echo every thousand.
  const std::string payload(16, 'x');
  const Flood flood = floodUntilCut(pair.b().pid(), Millis(30000), 1024, [&](uint64_t sent) {
    const bool more = sent % 64 != 0;
    if (!peer.sendFrame(frameHeader(7, sent, 0x70000000 + sent, payload.size()), payload, more)) return false;
    if (sent % 1024 != 0) return true;
    v1::PeerMessage keepalive;
    keepalive.mutable_keepalive()->set_timestamp_ns(sent);
    return peer.sendSession(keepalive);
  });
  INFO("frames sent: " << flood.rounds << " in " << flood.took.count() << " ms; VmRSS " << flood.rss_before
                       << " KiB before, " << flood.rss_peak << " KiB at most");
  CHECK(flood.cut);
  CHECK(flood.took < Millis(kSanitized ? 30000 : 15000));
  // What the daemon may hold for a peer that reads nothing: its control
  // queue and the transport's backlog (8 MiB each), and the flow-control
  // windows; not a NACK for every frame sent.
  if (!kSanitized) CHECK(flood.rss_peak - flood.rss_before < 64 * 1024);
  CHECK(pair.b().waitForLog("has not read its control records", Millis(5000)));
  CHECK(pair.b().alive());
  requireServing(pair.a(), pair.b(), "good", 2);
}

// What a Session's reader hands the data agent is bounded (SessionBacklog):
// a peer that sends stream opens and closes faster than the agent answers
// them is cut, and each round of the agent handles a bounded part of it,
// so its control queue is checked against its bound before it can grow far.
TEST_CASE(
    "hostile peer: a peer that reads nothing while it floods its Session with opens and closes is cut, "
    "in bounded memory",
    "[integration][hostile_peer]") {
  const std::string transport = "grpc";
  DaemonPair pair(pairOf(transport));
  // Many small slots: each stream the peer opens gets a grant of a credit
  // for each free one.
  Client consumer = attachConsumer(pair.b(), "hp-deaf", 1024, 4096);
  HostilePeer peer(peerOf(pair, "hostile-deaf", 6, transport));
  // The peer reads nothing, ever; it opens the stream, sends a frame for a
  // credit never granted (a NACK), closes the stream and sends a keepalive,
  // over and over.
  const std::string payload(16, 'x');
  // It is cut after about 50,000 rounds (3 s on an idle machine); 20 s leaves room for a loaded
  // machine and a sanitizer build.
  const Flood flood = floodUntilCut(pair.b().pid(), Millis(20000), 100, [&](uint64_t round) {
    v1::PeerMessage close;
    close.mutable_stream_close()->set_stream_id(round);
    v1::PeerMessage keepalive;
    keepalive.mutable_keepalive()->set_timestamp_ns(round);
    return peer.sendSession(streamOpen(round, "hp-deaf")) &&
           peer.sendFrame(frameHeader(round, 1, 0x70000000 + round, payload.size()), payload) &&
           peer.sendSession(close) && peer.sendSession(keepalive);
  });
  INFO("rounds: " << flood.rounds << " in " << flood.took.count() << " ms; VmRSS " << flood.rss_before
                  << " KiB before, " << flood.rss_peak << " KiB at most");
  CHECK(flood.cut);
  if (!kSanitized) CHECK(flood.rss_peak - flood.rss_before < 64 * 1024);
  CHECK(pair.b().alive());
  requireServing(pair.a(), pair.b(), "good", 2);
}

// A holder of the shared token can open and close links as fast as its
// handshakes finish, under a new daemon id each time.  Each link's lines
// (connected, up, down) are rate-limited like a client's attach and
// detach: the churn costs a bounded amount of log, and the log still says
// how much was left out.  The link of the real peer keeps working.
TEST_CASE("hostile peer: a token holder churning links costs a bounded amount of log",
          "[integration][hostile_peer]") {
  DaemonPair pair(pairOf("grpc"));
  requireServing(pair.a(), pair.b(), "churn-before", 2);
  constexpr int kLinks = 150;
  const auto start = Clock::now();
  for (int i = 0; i < kLinks; ++i) {
    HostilePeer peer(peerOf(pair, "churn-" + std::to_string(i), 100 + i, "grpc"));
  }
  // Every link the churn opened is down before the lines are counted.
  REQUIRE(waitUntil([&] { return pair.b().metric("framelink_links_up") == 1; }, Millis(15000), Millis(50)));
  const auto churn_s = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count();
  const std::string log = pair.b().log();
  int64_t down_lines = 0;
  for (const char* what : {" connected (session ", " is up over ", " is down: "}) {
    int64_t lines = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++lines;
    INFO("'" << what << "' lines: " << lines << " for " << kLinks << " links in " << churn_s << " s");
    CHECK(lines >= 1);
    CHECK(lines <= 20 * (churn_s + 2));
    down_lines = lines;
  }
  // Each link that went down counts once and is one line unless the limit left it out.  On a
  // loaded machine most churners are gone before their link is up, and too few go down to reach
  // the limit: then there is nothing to say was left out.
  const int64_t downs = pair.b().metric("framelink_link_failures_total");
  INFO(downs << " links down, " << down_lines << " lines say so");
  CHECK(down_lines <= downs);
  // A link after a quiet second is logged again, and its lines say how many
  // were left out.
  std::this_thread::sleep_for(Millis(1100));
  {
    // Kept until its link is up: one closed sooner may never come up at all.
    HostilePeer late(peerOf(pair, "churn-late", 99, "grpc"));
    CHECK(pair.b().waitForLog("to peer churn-late is up", Millis(5000)));
  }
  CHECK(pair.b().waitForLog("peer churn-late is down", Millis(5000)));
  if (downs > down_lines) {
    CHECK(pair.b().waitForLog("more lines like the next were suppressed", Millis(1000)));
  }
  CHECK(pair.b().alive());
  requireServing(pair.a(), pair.b(), "churn-after", 2);
}

TEST_CASE(
    "hostile peer: an offer it answers after closing its stream lands in no slot granted since; the honest "
    "sender's frames all verify",
    "[integration][hostile_peer]") {
  // The peer offers into both of the consumer's slots, and before it answers
  // the reads it closes the stream.  A's producer sends the same stream.
  // A late answer still lands in the slot its read was posted for: had that
  // slot gone to A, the answer would replace A's frame, delivered and
  // checked already, and A would be told DELIVERED.
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  DaemonPair pair(pairOf(transport, {"--pull-stream", "hp-late"}));
  Client consumer = attachConsumer(pair.b(), "hp-late", 2);
  HostilePeer peer(peerOf(pair, "hostile-late", 20, transport));
  peer.readSession();
  peer.readData();
  REQUIRE(peer.sendSession(streamOpen(7, "hp-late")));
  std::vector<uint64_t> credits;
  REQUIRE(peer.waitFor(
      [&](const PeerInbox& in) {
        credits = grantedCredits(in, 7);
        return credits.size() == 2;
      },
      Millis(5000)));
  constexpr uint64_t kOffered = 64 * 1024;
  REQUIRE(peer.sendControl(offer(frameHeader(7, 1, credits[0], kOffered), 1)));
  REQUIRE(peer.sendControl(offer(frameHeader(7, 2, credits[1], kOffered), 2)));
  REQUIRE(peer.waitFor([](const PeerInbox& in) { return in.reads.size() == 2; }, Millis(5000)));
  v1::PeerMessage close;
  close.mutable_stream_close()->set_stream_id(7);
  REQUIRE(peer.sendSession(close));
  // The daemon took the close: both reads are still out, their slots kept.
  CHECK(pair.b().waitForLog("the stream left the link while its offer was read", Millis(5000)));

  Client producer = attachProducer(pair.a(), "hp-late");
  const uint64_t lengths[2] = {kOffered, kOffered + 4099};
  for (uint64_t i = 0; i < 2; ++i) submitFrame(producer.get(), 500 + i, lengths[i], true);
  // Nothing of A's can land while the reads are out (both slots are theirs);
  // what arrives is held, so that the late answers would hit it.
  std::vector<fl_frame> got;
  for (fl_frame f{}; got.size() < 2 && fl_receive(consumer.get(), &f, 1000) == FL_OK;) got.push_back(f);
  CHECK(got.empty());
  for (const ReadAsked& read : peer.inbox().reads) {
    REQUIRE(peer.answerRead(read.read_id, read.source_id, std::string(read.length, 'x')));
  }
  CHECK(peer.waitFor(
      [](const PeerInbox& in) {
        return nacksOf(in, 7, 1, v1::ERROR_CODE_UNKNOWN_CREDIT) == 1 &&
               nacksOf(in, 7, 2, v1::ERROR_CODE_UNKNOWN_CREDIT) == 1;
      },
      Millis(5000)));
  while (got.size() < 2) got.push_back(receiveFrame(consumer.get(), Millis(10000)));
  for (const fl_frame& f : got) {
    INFO("frame " << f.frame_id << " in slot " << f.slot);
    REQUIRE(f.frame_id >= 500);
    REQUIRE(f.frame_id < 502);
    checkSyntheticFrame(f, f.frame_id, lengths[f.frame_id - 500]);
    CHECK(fl_release(consumer.get(), f.slot) == FL_OK);
  }
  const std::vector<fl_completion> done = collectCompletions(producer.get(), 2, Millis(10000));
  CHECK(done.size() == 2);
  for (const fl_completion& c : done) CHECK(c.status == FL_OK);
  CHECK(waitForMetric(pair.b(), "framelink_pull_reads_failed_total", 2) == 2);
  v1::Fin fin;
  CHECK_FALSE(peer.finReceived(&fin));  // late, not hostile enough to lose its link
  requireServing(pair.a(), pair.b(), "good", 2);
}
