// What the data agent's parts share: the ids it resolves once (interned
// stream names, peers), and a link's control records to its transport.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "agent/agent_state.h"

using namespace framelink;

TEST_CASE("stream names are interned while in use and forgotten with the last user", "[agent_state]") {
  NameTable names;
  const NameKey cam = names.acquire("cam");
  const NameKey cam_again = names.acquire("cam");
  const NameKey other = names.acquire("other");
  CHECK(cam == cam_again);
  CHECK(cam != other);
  CHECK(names.name(cam) == "cam");
  CHECK(names.size() == 2);
  names.release(cam);
  CHECK(names.size() == 2);  // one user left
  names.release(cam);
  CHECK(names.size() == 1);
  // A peer churning through names reuses the keys: the table does not grow.
  for (int i = 0; i < 1000; ++i) {
    const NameKey k = names.acquire("churn-" + std::to_string(i));
    CHECK(k <= 1);
    names.release(k);
  }
  CHECK(names.size() == 1);
  CHECK(names.name(other) == "other");
  names.release(other);
  names.release(other);  // one release too many is ignored
  CHECK(names.size() == 0);
}

TEST_CASE("peers keep the id they were first given", "[agent_state]") {
  PeerTable peers;
  const PeerId a = peers.resolve("host-a");
  const PeerId b = peers.resolve("host-b");
  CHECK(a != b);
  CHECK(peers.resolve("host-a") == a);
  CHECK(peers[b].name == "host-b");
  CHECK(peers[a].link_id == 0);
  peers[a].link_id = 7;
  CHECK(peers[peers.resolve("host-a")].link_id == 7);
  CHECK(peers.size() == 2);
}

TEST_CASE("a forgotten peer's id goes to the next new name, and its old name is a new peer",
          "[agent_state]") {
  PeerTable peers;
  const PeerId a = peers.resolve("host-a");
  const PeerId b = peers.resolve("host-b");
  peers[a].link_id = 7;
  peers[a].ever_linked = true;
  peers.forget(a);
  CHECK(peers.size() == 1);
  CHECK(peers.byName().count("host-a") == 0);
  peers.forget(a);  // twice: nothing more
  CHECK(peers.size() == 1);
  const PeerId c = peers.resolve("host-c");
  CHECK(c == a);  // the table does not grow while ids come and go
  CHECK(peers[c].name == "host-c");
  CHECK(peers[c].link_id == 0);
  CHECK_FALSE(peers[c].ever_linked);
  const PeerId again = peers.resolve("host-a");
  CHECK(again != a);
  CHECK(again != b);
  CHECK(peers.resolve("host-b") == b);
  CHECK(peers.size() == 3);
}

namespace {

// A link's transport that only takes control records: it keeps each one,
// or, while `full`, turns every one away as a transport whose peer stopped
// reading does once its own backlog is full.
class ControlSink final : public transport::Transport {
 public:
  bool full = false;
  std::vector<std::string> records;

  const char* name() const noexcept override { return "sink"; }
  bool connected() const noexcept override { return true; }
  Result<transport::RemoteCredit> exposeCredit(transport::LocalCredit) override {
    return transport::RemoteCredit{};
  }
  void retractCredit(uint64_t) override {}
  transport::PostResult post(const transport::SendRequest&) noexcept override {
    return transport::PostResult::kInvalid;
  }
  transport::PostResult postControl(std::string record) noexcept override {
    if (full) return transport::PostResult::kBackpressure;
    records.push_back(std::move(record));
    return transport::PostResult::kOk;
  }
  size_t poll(transport::TransportEvent*, size_t) noexcept override { return 0; }
  int eventFd() const noexcept override { return -1; }
  void shutdown() noexcept override {}
  transport::TransportCounters counters() const noexcept override { return {}; }
};

// An ACK of `count` consecutive frames from `first`, as one run.
v1::PeerMessage ackRun(uint64_t stream_id, uint64_t first, uint64_t count) {
  v1::PeerMessage m;
  m.mutable_ack()->set_stream_id(stream_id);
  m.mutable_ack()->add_runs(first);
  m.mutable_ack()->add_runs(count);
  return m;
}

}  // namespace

TEST_CASE("a control record ACKs at most the per-record budget of frames", "[agent_state]") {
  // Runs make an ACK of 4096 frames a few bytes long, so a record would
  // otherwise ACK millions: the receiver refuses a record past the budget,
  // and this side cuts its records so that it never sends one.
  auto sink = std::make_shared<ControlSink>();
  AgentLink link;
  link.transport = sink;
  const uint64_t messages = peer::kMaxAckFramesPerRecord / peer::kMaxAcksPerMessage + 1;
  for (uint64_t i = 0; i < messages; ++i) {
    link.send(ackRun(3, 1 + i * peer::kMaxAcksPerMessage, peer::kMaxAcksPerMessage));
  }
  std::string failed;
  CHECK(link.flushControl(&failed) == 2);
  CHECK(failed.empty());
  uint64_t total = 0;
  for (const std::string& record : sink->records) {
    v1::ControlBatch batch;
    REQUIRE(batch.ParseFromString(record));
    uint64_t frames = 0;
    for (const auto& m : batch.messages()) frames += m.ack().runs(1);
    CHECK(frames <= peer::kMaxAckFramesPerRecord);
    total += frames;
  }
  CHECK(total == messages * peer::kMaxAcksPerMessage);  // nothing lost on the way
}

TEST_CASE("a peer that reads no control records fails its link once they pass the queue bound",
          "[agent_state]") {
  // Each frame such a peer sends may draw a NACK: kept for ever, they would
  // grow without bound.  The transport holds its own backlog; what it turns
  // away waits in the link up to kMaxControlQueueBytes.
  constexpr size_t kBound = kMaxControlQueueBytes;
  auto sink = std::make_shared<ControlSink>();
  sink->full = true;
  AgentLink link;
  link.transport = sink;
  auto queued = [&link] {
    size_t bytes = 0;
    for (const std::string& record : link.controlQueued()) bytes += record.size();
    CHECK(link.controlQueuedBytes() == bytes);
    return bytes;
  };
  std::string why;
  uint64_t sequence = 0;
  size_t rounds = 0;
  // A round of the agent: 64 frames refused, then the flush.
  for (; why.empty() && rounds < 2 * kBound / (64 * 200); ++rounds) {
    for (int i = 0; i < 64; ++i) {
      v1::PeerMessage nack;
      nack.mutable_nack()->set_stream_id(1);
      nack.mutable_nack()->set_sequence(++sequence);
      nack.mutable_nack()->set_code(v1::ERROR_CODE_UNKNOWN_CREDIT);
      nack.mutable_nack()->set_message(std::string(200, 'n'));
      link.send(std::move(nack));
    }
    CHECK(link.flushControl(&why) == 0);
    if (why.empty()) REQUIRE(queued() <= kBound);
  }
  INFO(rounds << " rounds, " << queued() << " bytes queued");
  CHECK_THAT(why, Catch::Contains("has not read") && Catch::Contains("control records"));
  CHECK(queued() == 0);                 // what it would have said is dropped with the link
  CHECK(rounds > kBound / (64 * 300));  // not before the bound
}
