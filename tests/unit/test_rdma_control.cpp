// Unit tests of the rdma transport's control records against FakeVerbs:
// SEND_WITH_IMM fragments ahead of the flush's frames, inline fragments,
// waiting for free chunks and send-queue entries, the bounded backlog, and
// what a receiver does with oversized records and stray SENDs.  No RDMA
// device needed.  The data path: test_rdma_transport.cpp.
#include <arpa/inet.h>

#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_verbs.h"
#include "rdma_test_pair.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_wire.h"

namespace framelink::transport::rdma::testing {

namespace {

std::string record(char seed, size_t n) {
  std::string r(n, '\0');
  for (size_t i = 0; i < n; ++i) r[i] = static_cast<char>(seed + i * 31 + (i >> 8));
  return r;
}

// Posts a raw SEND_WITH_IMM on `qp` from `src` (as a misbehaving peer
// would); its completion carries a wr_id the transport does not know.
void rawSend(FakeVerbs& fake, ibv_qp* qp, const Memory& src, uint32_t length, uint32_t imm) {
  ibv_sge sge{reinterpret_cast<uint64_t>(src.data), length, src.mr->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = (uint64_t{1} << 62) | (uint64_t{1} << 40);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(imm);
  ibv_send_wr* bad = nullptr;
  REQUIRE(fake.postSend(qp, &wr, &bad) == 0);
}

}  // namespace

TEST_CASE("rdma control records go as SEND_WITH_IMM fragments ahead of the flush's frames",
          "[rdma][control]") {
  RdmaTransportOptions o;
  o.control_chunk_bytes = 64;
  o.signal_interval = 4;
  auto p = makeDataPath(o, 2 * 4096, 0x42);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  for (uint64_t i = 0; i < 2; ++i) {
    REQUIRE(p->a->post(request(i, p->credit(i + 1, 1024, i), p->src, 100, i + 1)) == PostResult::kOk);
  }
  const std::string big = record('a', 150);  // 64 + 64 + 22: three fragments
  const std::string small = record('z', 10);
  REQUIRE(p->a->postControl(big) == PostResult::kOk);
  REQUIRE(p->a->postControl(small) == PostResult::kOk);
  const auto before = p->fake->stats();
  p->ra()->flush();
  const auto after = p->fake->stats();
  CHECK(after.post_send_calls == before.post_send_calls + 1);  // one chain
  CHECK(after.send_wrs == before.send_wrs + 4 + 2);
  CHECK(after.signalled_wrs == before.signalled_wrs + 2);  // the 4th WR and the chain's last
  CHECK(after.inline_wrs == before.inline_wrs + 4);        // 64-byte fragments: inline, frames not
  until(tx, rx, [&] { return rx.controls.size() == 2 && rx.arrivals.size() == 2 && tx.sends.size() == 2; });
  CHECK(rx.controls[0] == big);
  CHECK(rx.controls[1] == small);
  // The records went ahead of the frames posted before them.
  REQUIRE(rx.order.size() == 4);
  CHECK(rx.order[0] == Kind::kControl);
  CHECK(rx.order[1] == Kind::kControl);
  CHECK(rx.order[2] == Kind::kFrameArrived);
  // Control WRs report nothing to the sender: one SendComplete per frame.
  tx.checkCompletions(2);
  for (auto& ev : tx.sends) CHECK(ev.status == FL_OK);
  CHECK(p->ra()->verbsCounters().control_wrs == 4);
  CHECK(p->ra()->counters().control_sent == 2);
  CHECK(p->rb()->counters().control_received == 2);
  CHECK(p->rb()->counters().frames_received == 2);
  CHECK(p->fake->errors().empty());
}

TEST_CASE("rdma control fragments up to control_inline_bytes go inline, larger ones from the chunk",
          "[rdma][control]") {
  RdmaTransportOptions o;
  o.control_chunk_bytes = 64;
  o.control_inline_bytes = 32;
  const std::string big = record('b', 150);  // 64 + 64 + 22: the last fragment inline
  const std::string small = record('s', 20);
  SECTION("a device with the inline room") {
    auto p = makePair(o);
    Endpoint tx{p->a.get()}, rx{p->b.get()};
    REQUIRE(p->a->postControl(big) == PostResult::kOk);
    REQUIRE(p->a->postControl(small) == PostResult::kOk);
    const auto before = p->fake->stats();
    p->ra()->flush();
    CHECK(p->fake->stats().inline_wrs == before.inline_wrs + 2);
    CHECK(p->ra()->verbsCounters().control_inline_wrs == 2);
    until(tx, rx, [&] { return rx.controls.size() == 2; });
    CHECK(rx.controls[0] == big);
    CHECK(rx.controls[1] == small);
    CHECK(p->fake->errors().empty());
  }
  SECTION("a device that has none: the queue pair goes without, every fragment from the chunks") {
    auto fake = std::make_shared<FakeVerbs>(std::vector<FakeVerbs::DeviceSpec>{
        {"fake_a", "10.0.0.1", IBV_PORT_ACTIVE, 0}, {"fake_b", "10.0.0.2", IBV_PORT_ACTIVE, 0}});
    auto p = makePair(o, fake);
    Endpoint tx{p->a.get()}, rx{p->b.get()};
    REQUIRE(p->a->postControl(small) == PostResult::kOk);
    p->ra()->flush();
    until(tx, rx, [&] { return rx.controls.size() == 1; });
    CHECK(rx.controls[0] == small);
    CHECK(p->fake->stats().inline_wrs == 0);
    CHECK(p->ra()->verbsCounters().control_inline_wrs == 0);
    CHECK(p->fake->errors().empty());
  }
}

TEST_CASE("rdma control records wait for free chunks and send-queue entries", "[rdma][control]") {
  RdmaTransportOptions o;
  o.control_chunk_bytes = 64;
  o.control_send_chunks = 2;
  o.send_queue_depth = 8;
  o.signal_interval = 8;
  auto p = makeDataPath(o, 8 * 4096, 0x42);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  p->fake->pauseDelivery(true);
  const std::string rec = record('r', 5 * 64 + 1);  // six fragments, two chunks
  REQUIRE(p->a->postControl(rec) == PostResult::kOk);
  const auto before = p->fake->stats();
  p->ra()->flush();
  CHECK(p->fake->stats().send_wrs == before.send_wrs + 2);  // as many as there are chunks
  // Two send-queue entries are taken by control: six frames fit, not seven.
  std::vector<RemoteCredit> credits;
  for (uint64_t i = 0; i < 7; ++i) credits.push_back(p->credit(i + 1, 64, i));
  for (uint64_t i = 0; i < 6; ++i)
    REQUIRE(p->a->post(request(i, credits[i], p->src, 64, i + 1)) == PostResult::kOk);
  CHECK(p->a->post(request(6, credits[6], p->src, 64, 7)) == PostResult::kBackpressure);
  p->ra()->flush();
  p->fake->pauseDelivery(false);
  // Completions free chunks; poll() posts the rest of the record.
  until(tx, rx, [&] { return rx.controls.size() == 1 && rx.arrivals.size() == 6 && tx.sends.size() == 6; });
  CHECK(rx.controls[0] == rec);
  REQUIRE(p->a->post(request(6, credits[6], p->src, 64, 7)) == PostResult::kOk);
  REQUIRE(p->a->postControl("after") == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return rx.controls.size() == 2 && rx.arrivals.size() == 7; });
  CHECK(rx.controls[1] == "after");
  tx.checkCompletions(7);
  CHECK(p->ra()->verbsCounters().control_wrs == 7);
  CHECK(tx.errors.empty());
  CHECK(rx.errors.empty());
  CHECK(p->fake->errors().empty());
}

TEST_CASE("rdma control backlog is bounded by kMaxControlBacklogBytes", "[rdma][control]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  const std::string rec = record('b', kMaxControlBytes);
  size_t accepted = 0;
  PostResult r;
  while ((r = p->a->postControl(rec)) == PostResult::kOk) ++accepted;
  CHECK(r == PostResult::kBackpressure);
  CHECK(accepted == kMaxControlBacklogBytes / kMaxControlBytes);
  CHECK(p->a->postControl("x") == PostResult::kBackpressure);  // not even one byte more
  CHECK(p->ra()->verbsCounters().control_wrs == 0);            // postControl only queues
  until(tx, rx, [&] { return rx.controls.size() == accepted || !rx.errors.empty(); });
  REQUIRE(rx.errors.empty());
  for (size_t i = 0; i < accepted; ++i) REQUIRE(rx.controls[i] == rec);
  CHECK(p->a->postControl("x") == PostResult::kOk);  // room again once sent
  until(tx, rx, [&] { return rx.controls.size() == accepted + 1; });
  CHECK(rx.controls.back() == "x");
  CHECK(p->fake->errors().empty());
}

TEST_CASE("rdma receiver fails the link on an oversized control record", "[rdma][control]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& src = p->mem(*p->dev_a, kControlChunkBytes, MemoryAccess::kLocalRead, 0x11);
  // kMaxControlBytes in "more follows" fragments is still a record in the
  // making; one byte more is too much.
  ibv_qp* qp = p->ra()->cmId()->qp;
  for (size_t i = 0; i < kMaxControlBytes / kControlChunkBytes; ++i) {
    rawSend(*p->fake, qp, src, kControlChunkBytes, kControlImmMore);
    rx.pump();
  }
  rx.pump();
  CHECK(rx.errors.empty());
  rawSend(*p->fake, qp, src, 1, kControlImmLast);
  until(tx, rx, [&] { return !rx.errors.empty(); });
  CHECK(rx.errors[0].status == FL_ERR_PROTOCOL);
  CHECK(rx.errors[0].message.find("control record of more than 262144 bytes") != std::string::npos);
  CHECK(rx.controls.empty());
  CHECK_FALSE(p->b->connected());
}

TEST_CASE("rdma receiver fails the link on a SEND that is no control fragment", "[rdma][control]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& src = p->mem(*p->dev_a, 64, MemoryAccess::kLocalRead, 0x11);
  rawSend(*p->fake, p->ra()->cmId()->qp, src, 16, 0x12345678);
  until(tx, rx, [&] { return !rx.errors.empty(); });
  CHECK(rx.errors[0].status == FL_ERR_PROTOCOL);
  CHECK(rx.errors[0].message.find("no control fragment") != std::string::npos);
  CHECK(rx.controls.empty());
}

TEST_CASE("rdma control records are refused when malformed or after the link failed", "[rdma][control]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  CHECK(p->a->postControl(std::string()) == PostResult::kInvalid);
  CHECK(p->a->postControl(std::string(kMaxControlBytes + 1, 'x')) == PostResult::kInvalid);
  p->fake->pauseDelivery(true);
  REQUIRE(p->a->postControl("lost with the link") == PostResult::kOk);
  p->ra()->flush();
  p->a->shutdown();
  CHECK(p->a->postControl("late") == PostResult::kNotConnected);
  tx.pump();
  CHECK(tx.sends.empty());  // a control WR flushed in error reports nothing either
  REQUIRE(tx.errors.size() == 1);
  until(tx, rx, [&] { return !rx.errors.empty(); });
  CHECK(p->b->postControl("late") == PostResult::kNotConnected);
  p->fake->pauseDelivery(false);
  CHECK(p->fake->errors().empty());
}
}  // namespace framelink::transport::rdma::testing
