// What a peer can write into this daemon's memory over rdma, tried as a
// hostile peer would against FakeVerbs: only into the slot of a credit it
// holds, only up to that slot's size, only on the link the credit was
// granted on, only until the credit is consumed or retracted.  Anything
// else the adapter refuses (IBV_WC_REM_ACCESS_ERR) and the slot's bytes
// stay as they were.
#include <arpa/inet.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_verbs.h"
#include "rdma_test_pair.h"
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_transport.h"

namespace framelink::transport::rdma::testing {
namespace {

constexpr uint8_t kHostile = 0x42;  // what the peer's source memory holds
constexpr uint8_t kFill = 0xEE;     // what the receiving slots hold

// Slots of 4096 bytes from p as the consumer left them (kFill), but for the
// header's length, which holds the poison once the slot's credit is exposed.
bool untouched(const uint8_t* p, size_t n) {
  constexpr size_t kLength = offsetof(RdmaWireHeader, length);
  for (size_t i = 0; i < n; ++i) {
    const size_t at = i % 4096;
    if (at >= kLength && at < kLength + sizeof(uint64_t) && p[i] == 0xFF) continue;
    if (p[i] != kFill) return false;
  }
  return true;
}

// A plain RDMA_WRITE (no immediate: the receiver gets no completion) of
// `length` bytes of src, posted on `t`'s queue pair behind its back.
void rawWrite(DataPath& p, Transport* t, uint64_t remote_addr, uint32_t rkey, uint32_t length) {
  ibv_sge sge{reinterpret_cast<uint64_t>(p.src.data), length, p.src.mr->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = uint64_t{1} << 60;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  ibv_qp* qp = static_cast<RdmaTransport*>(t)->cmId()->qp;
  REQUIRE(p.fake->postSend(qp, &wr, &bad) == 0);
}

// The frame fails on the sender with the adapter's remote access error and
// takes the link down; nothing arrived at the receiver.
void refused(Endpoint& tx, Endpoint& rx) {
  const size_t arrived = rx.arrivals.size();
  until(tx, rx, [&] { return !tx.sends.empty() && !tx.errors.empty(); });
  CHECK(tx.sends.back().status == FL_ERR_TRANSPORT);
  CHECK_THAT(tx.errors[0].message, Catch::Contains(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)));
  rx.pump();
  for (size_t i = arrived; i < rx.arrivals.size(); ++i) CHECK(rx.arrivals[i].status != FL_OK);
}

}  // namespace

TEST_CASE("rdma refuses a plain write into a slot the peer holds no credit for", "[rdma][hostile]") {
  auto p = makeDataPath({}, 3 * 4096, kHostile);
  auto good = p->credit(1, 4096 - 256, 0);
  uint8_t* slot1 = p->dst.data + 4096;
  ibv_qp* qp = p->ra()->cmId()->qp;

  SECTION("under the key of a credit for another slot") {
    rawWrite(*p, p->a.get(), reinterpret_cast<uint64_t>(slot1 + 256), good.rkey, 1024);
  }
  SECTION("under the key of the whole segment") {
    rawWrite(*p, p->a.get(), reinterpret_cast<uint64_t>(slot1 + 256), p->dst.mr->rkey(), 1024);
  }
  SECTION("into its own slot's neighbour from the slot's start") {
    rawWrite(*p, p->a.get(), good.remote_addr + 4096, good.rkey, 256);
  }
  CHECK(p->fake->qpState(qp) == IBV_QPS_ERR);
  CHECK(untouched(slot1, 4096));
}

TEST_CASE("rdma takes a frame's header only from a write into the slot its immediate names",
          "[rdma][hostile]") {
  auto p = makeDataPath({}, 2 * 4096, kHostile);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  // An honest frame leaves its header in slot 1.
  auto earlier = p->credit(1, 4096 - 256, 1);
  REQUIRE(p->a->post(request(0, earlier, p->src, 1024, 7)) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return rx.arrivals.size() == 1; });
  REQUIRE(rx.arrivals[0].status == FL_OK);
  // Both slots are granted again; the peer writes a frame's worth into slot 0's window and names
  // slot 1's credit, whose slot still holds the old header (length 1024, sequence 7, its CRC).
  auto a = p->credit(2, 4096 - 256, 0);
  p->credit(3, 4096 - 256, 1);
  ibv_qp* b_qp = p->fake->qpOnDevice("fake_b");
  REQUIRE(b_qp != nullptr);
  const std::vector<uint8_t> frame(kWireHeaderBytes + 1024, kHostile);
  REQUIRE(p->fake->peerWrite(b_qp, a.rkey, a.remote_addr, frame, htonl(3)) == IBV_WC_SUCCESS);
  until(tx, rx, [&] { return !rx.errors.empty(); });
  CHECK(rx.arrivals.size() == 1);  // the old frame is not delivered again
  CHECK(rx.errors[0].status == FL_ERR_PROTOCOL);
  CHECK_THAT(rx.errors[0].message, Catch::Contains("named credit 3 but wrote no header into its slot"));
}

TEST_CASE("rdma refuses a frame longer than its slot; the next slot is untouched", "[rdma][hostile]") {
  auto p = makeDataPath({}, 3 * 4096, kHostile);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto c = p->credit(1, 4096 - 256, 0);
  // The peer claims more room than the credit gave (post() trusts the
  // credit it is handed): the write would run 256 bytes into slot 1.
  RemoteCredit lie = c;
  lie.length = 4096;
  REQUIRE(p->a->post(request(0, lie, p->src, 4096, 1)) == PostResult::kOk);
  p->ra()->flush();
  refused(tx, rx);
  CHECK(untouched(p->dst.data + 4096, 4096));
  CHECK(untouched(p->dst.data, 4096));
}

TEST_CASE("rdma refuses on one link the key of a credit granted on another", "[rdma][hostile]") {
  auto p = makeDataPath({}, 2 * 4096, kHostile);
  // A second link between the same two devices (the same PD on each side).
  std::promise<std::unique_ptr<Transport>> accepted;
  auto listener = RdmaListener::listen(
      p->dev_b, "10.0.0.2", 0, [](uint64_t s) { return s == kSession; },
      [&](uint64_t, std::unique_ptr<Transport> t) { accepted.set_value(std::move(t)); }, {});
  REQUIRE(listener.ok());
  auto a2 = dialRdma(p->dev_a, "10.0.0.2", (*listener)->port(), kSession, 2s, {});
  REQUIRE(a2.ok());
  auto fut = accepted.get_future();
  REQUIRE(fut.wait_for(2s) == std::future_status::ready);
  std::unique_ptr<Transport> b2 = fut.get();
  Endpoint tx2{a2->get()}, rx2{b2.get()};

  auto c = p->credit(1, 4096 - 256, 1);  // granted on link 1
  REQUIRE(a2.value()->post(request(0, c, p->src, 1024, 1)) == PostResult::kOk);
  a2.value()->flush();
  refused(tx2, rx2);
  CHECK(untouched(p->dst.data + 4096, 4096));
  a2.value().reset();
  b2.reset();
}

TEST_CASE("rdma refuses a second window on one key, and windows past its window queue, leaving none behind",
          "[rdma][windows]") {
  RdmaTransportOptions o;
  o.window_queue_depth = 2;
  auto p = makeDataPath(o, 4 * 4096, kHostile);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto slot = [&](size_t i) { return p->dst.data + i * 4096 + 256; };
  auto c1 = p->b->exposeCredit({1, slot(0), 1024, nullptr});
  REQUIRE(c1.ok());
  // The same low 32 bits: the same window key.
  auto twin = p->b->exposeCredit({(uint64_t{1} << 32) | 1, slot(1), 1024, nullptr});
  REQUIRE_FALSE(twin.ok());
  CHECK(twin.error().code == FL_EINVAL);
  CHECK_THAT(twin.error().message, Catch::Contains("credit key 1 is exposed already"));
  REQUIRE(p->b->exposeCredit({2, slot(2), 1024, nullptr}).ok());
  // Two binds wait for the next flush: the window queue is full.
  auto c3 = p->b->exposeCredit({3, slot(3), 1024, nullptr});
  REQUIRE_FALSE(c3.ok());
  CHECK(c3.error().code == FL_ERR_RESOURCES);
  CHECK_THAT(c3.error().message,
             Catch::Contains("exposeCredit: all 2 memory-window work requests are in use"));
  CHECK(p->fake->stats().binds == 0);
  p->b->flush();
  until(tx, rx, [&] { return p->fake->stats().binds == 2; });
  // Executed and completed: the queue has room again, and the refused ones left nothing bound.
  until(tx, rx, [&] { return p->b->exposeCredit({3, slot(3), 1024, nullptr}).ok(); });
  p->b->flush();
  until(tx, rx, [&] { return p->fake->stats().binds == 3; });
  REQUIRE(p->a->post(request(0, c1.value(), p->src, 64, 1)) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return rx.arrivals.size() == 1; });
  CHECK(rx.arrivals[0].status == FL_OK);
  CHECK(rx.arrivals[0].header.credit_id == 1);
  CHECK(untouched(p->dst.data + 4096, 4096));  // the twin's slot
  CHECK(tx.errors.empty());
  CHECK(rx.errors.empty());

  // A source's window the same way, on the other side.
  const auto s1 = p->a->exposeSource({5, p->src.data, 100, nullptr});
  REQUIRE(s1.ok());
  auto s_twin = p->a->exposeSource({(uint64_t{1} << 32) | 5, p->src.data + 200, 100, nullptr});
  REQUIRE_FALSE(s_twin.ok());
  CHECK(s_twin.error().code == FL_EINVAL);
  CHECK_THAT(s_twin.error().message, Catch::Contains("source key 5 is exposed already"));
}

TEST_CASE("rdma refuses a credit's key once the credit is consumed or retracted", "[rdma][hostile]") {
  auto p = makeDataPath({}, 2 * 4096, kHostile);
  Endpoint tx{p->a.get()}, rx{p->b.get()};

  SECTION("consumed: its frame arrived") {
    auto c = p->credit(1, 4096 - 256, 0);
    REQUIRE(p->a->post(request(0, c, p->src, 1024, 1)) == PostResult::kOk);
    p->ra()->flush();
    until(tx, rx, [&] { return tx.sends.size() == 1 && rx.arrivals.size() == 1; });
    REQUIRE(rx.arrivals[0].status == FL_OK);
    std::memset(p->dst.data, kFill, 4096);  // the consumer's copy of the frame
    REQUIRE(p->a->post(request(1, c, p->src, 1024, 2)) == PostResult::kOk);
    p->ra()->flush();
    refused(tx, rx);
    CHECK(untouched(p->dst.data, 4096));
  }
  SECTION("retracted") {
    auto c = p->credit(2, 4096 - 256, 1);
    p->b->retractCredit(2);
    REQUIRE(p->a->post(request(0, c, p->src, 1024, 1)) == PostResult::kOk);
    p->ra()->flush();
    refused(tx, rx);
    CHECK(untouched(p->dst.data + 4096, 4096));
  }
  SECTION("the slot's next credit has a new key") {
    auto c1 = p->credit(3, 4096 - 256, 0);
    REQUIRE(p->a->post(request(0, c1, p->src, 64, 1)) == PostResult::kOk);
    p->ra()->flush();
    until(tx, rx, [&] { return rx.arrivals.size() == 1; });
    auto c2 = p->credit(4, 4096 - 256, 0);
    CHECK(c2.rkey != c1.rkey);
    CHECK(c2.remote_addr == c1.remote_addr);
  }
}

TEST_CASE("rdma keeps a credit's memory until its window is invalidated, then lets it go",
          "[rdma][lifetime]") {
  // A consumer leaves: its credits are retracted and its segment goes.  The
  // invalidation of a window waits on the send queue behind what is queued
  // there; until it has executed, a write the peer posted may still land and
  // the slot's registration cannot be deregistered (rxe refuses it, and the
  // pinned pages would stay until the daemon exits).
  auto p = makeDataPath();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto segment = std::make_shared<Memory>(*p->dev_b, 4096, MemoryAccess::kCreditWindows);
  const std::weak_ptr<Memory> alive = segment;
  SECTION("retracted") {
    REQUIRE(p->b->exposeCredit({7, segment->data + 256, 4096 - 256, segment}).ok());
    p->b->flush();
    CHECK(p->fake->stats().binds == 1);
    // b's send queue is busy: a control record the paused adapter holds.
    p->fake->pauseDelivery(true);
    REQUIRE(p->b->postControl("ahead of the invalidation") == PostResult::kOk);
    p->rb()->flush();
    p->b->retractCredit(7);
  }
  SECTION("consumed") {
    auto c = p->b->exposeCredit({7, segment->data + 256, 4096 - 256, segment});
    REQUIRE(c.ok());
    p->b->flush();
    REQUIRE(p->a->post(request(0, c.value(), p->src, 64, 1)) == PostResult::kOk);
    p->ra()->flush();  // the adapter wrote it; b has not polled its arrival yet
    CHECK(p->fake->stats().binds == 1);
    // The frame's arrival ends the window; b's send queue is busy then.
    p->fake->pauseDelivery(true);
    REQUIRE(p->b->postControl("ahead of the invalidation") == PostResult::kOk);
    p->rb()->flush();
    until(tx, rx, [&] { return rx.arrivals.size() == 1; });
    REQUIRE(rx.arrivals[0].status == FL_OK);
  }
  segment.reset();  // the consumer left
  rx.pump();
  CHECK_FALSE(alive.expired());
  CHECK(p->fake->stats().invalidations == 0);
  p->fake->pauseDelivery(false);
  until(tx, rx, [&] { return alive.expired(); });
  CHECK(p->fake->stats().invalidations == 1);
  CHECK(p->fake->errors().empty());
}

TEST_CASE("rdma binds a credit's window in the chain of its grant, before the grant", "[rdma][windows]") {
  RdmaTransportOptions o;
  o.window_queue_depth = 4;
  auto p = makeDataPath(o, 6 * 4096);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  rx.pump();
  const auto before = p->fake->stats();
  std::vector<RemoteCredit> credits;
  for (uint64_t i = 0; i < 3; ++i) {
    auto c = p->b->exposeCredit({i + 1, p->dst.data + i * 4096 + 256, 1000, nullptr});
    REQUIRE(c.ok());
    credits.push_back(c.value());
  }
  REQUIRE(p->b->postControl("the grant of credits 1 to 3") == PostResult::kOk);
  CHECK(p->fake->stats().binds == before.binds);  // nothing is posted before the flush
  SECTION("one chain: three binds, then the grant") {
    p->b->flush();
    const auto after = p->fake->stats();
    CHECK(after.post_send_calls == before.post_send_calls + 1);
    CHECK(after.send_wrs == before.send_wrs + 4);
    CHECK(after.binds == before.binds + 3);
    // The binds' last WR is signalled (its completion is the others' too), and the chain's end.
    CHECK(after.signalled_wrs == before.signalled_wrs + 2);
    for (uint64_t i = 0; i < 3; ++i)
      REQUIRE(p->a->post(request(i, credits[i], p->src, 100, i + 1)) == PostResult::kOk);
    p->a->flush();
    until(tx, rx, [&] { return rx.arrivals.size() == 3 && tx.sends.size() == 3 && tx.controls.size() == 1; });
    for (const auto& a : rx.arrivals) CHECK(a.status == FL_OK);
    CHECK(tx.controls[0] == "the grant of credits 1 to 3");
    CHECK(p->fake->stats().invalidations == before.invalidations + 3);
  }
  SECTION("window work requests are bounded: a grant waits while all are in use") {
    p->fake->pauseDelivery(true);
    p->b->flush();
    REQUIRE(p->b->exposeCredit({4, p->dst.data + 3 * 4096 + 256, 1000, nullptr}).ok());
    // Three binds on the paused queue and one waiting: all four in use.
    auto refused = p->b->exposeCredit({5, p->dst.data + 4 * 4096 + 256, 1000, nullptr});
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().code == FL_ERR_RESOURCES);
    p->b->flush();
    CHECK_FALSE(p->b->exposeCredit({5, p->dst.data + 4 * 4096 + 256, 1000, nullptr}).ok());
    p->fake->pauseDelivery(false);
    until(tx, rx, [&] { return p->fake->stats().binds == before.binds + 4; });
    rx.pump();  // the binds' completion frees their entries
    CHECK(p->b->exposeCredit({5, p->dst.data + 4 * 4096 + 256, 1000, nullptr}).ok());
    CHECK(p->b->connected());
  }
  CHECK(p->fake->errors().empty());
}

// A peer that stops taking b's sends holds b's send queue -- and every window invalidation queued
// behind what is on it.  windowOpen says so (the data agent grants such a slot on no other link
// until it is false), and the queue's watchdog ends the link when nothing completes for
// send_stall_ms (link_timeout_ms in the daemon): a queue pair in error takes no write.
TEST_CASE(
    "rdma: a retracted credit's window stays open behind a stalled send queue, until it executes or the "
    "watchdog ends the link",
    "[rdma][hostile][windows]") {
  RdmaTransportOptions options;
  options.send_stall_ms = 300;
  auto p = makeDataPath(options);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto c = p->credit(9, 4096 - 256, 0);
  ibv_qp* b_qp = p->fake->qpOnDevice("fake_b");
  REQUIRE(b_qp != nullptr);
  const std::vector<uint8_t> hostile(16, kHostile);
  CHECK_FALSE(p->b->windowOpen(9));  // live, not ending: the agent asks only of ended ones
  // b's next SEND waits (the peer posts no receive); the retraction's invalidation waits behind it.
  p->fake->pauseDelivery(true);
  REQUIRE(p->b->postControl("ahead of the invalidation") == PostResult::kOk);
  p->rb()->flush();
  p->b->retractCredit(9);
  rx.pump();
  CHECK(p->b->windowOpen(9));
  // What the agent's fence is for: the old key still writes into the slot.
  CHECK(p->fake->peerWrite(b_qp, c.rkey, c.remote_addr, hostile, std::nullopt) == IBV_WC_SUCCESS);
  std::memset(p->dst.data, kFill, 4096);

  SECTION("the queue moves: the invalidation executes and the window shuts") {
    p->fake->pauseDelivery(false);
    until(tx, rx, [&] { return !p->b->windowOpen(9); });
    CHECK(p->fake->peerWrite(b_qp, c.rkey, c.remote_addr, hostile, std::nullopt) == IBV_WC_REM_ACCESS_ERR);
    CHECK(untouched(p->dst.data, 4096));
    CHECK(rx.errors.empty());
  }
  SECTION("the queue stays stalled: the watchdog ends the link after send_stall_ms") {
    const auto start = std::chrono::steady_clock::now();
    until(tx, rx, [&] { return !rx.errors.empty(); });
    CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(250));
    CHECK(rx.errors[0].status == FL_ERR_LINK_LOST);
    CHECK_THAT(rx.errors[0].message, Catch::Contains("completed in") && Catch::Contains("link_timeout_ms"));
    CHECK(p->fake->qpState(b_qp) == IBV_QPS_ERR);
    CHECK_FALSE(p->b->windowOpen(9));
    p->fake->pauseDelivery(false);
  }
}

}  // namespace framelink::transport::rdma::testing
