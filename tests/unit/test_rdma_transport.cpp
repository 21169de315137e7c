// Unit tests of the rdma transport's data path against FakeVerbs: the send
// path (batching, selective signalling, backpressure, the request's memory
// key), the receive path (landed headers, unknown credits) and how every
// kind of verbs failure is reported.  No RDMA device needed.  Control
// records: test_rdma_control.cpp.  Device selection, connection setup and the
// listener: test_rdma_connect.cpp.
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_verbs.h"
#include "rdma_test_pair.h"
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_status.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_wire.h"

namespace framelink::transport::rdma::testing {

// ---------------------------------------------------------------- data path

TEST_CASE("rdma write lands header and payload in the credited slot", "[rdma]") {
  auto p = makeDataPath({}, 256 + 4096);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& slot = p->dst;
  for (size_t i = 0; i < 1000; ++i) p->src.data[i] = static_cast<uint8_t>(i * 13);

  auto credit = p->b->exposeCredit({0x7'0000'0005ull, slot.data + 256, 4096, nullptr});
  REQUIRE(credit.ok());
  p->b->flush();  // binds its window
  CHECK(credit->remote_addr == reinterpret_cast<uint64_t>(slot.data));
  CHECK(credit->rkey != slot.mr->rkey());  // a window's key, never the segment's
  CHECK(credit->length == 4096u);

  SendRequest r = request(1, credit.value(), p->src, 1000, 77);
  r.header.frame_id = 0xF1;
  r.header.group_id = 0xA2;
  r.header.timestamp_ns = 123456789;
  r.header.crc32c = 0xC0FFEE;
  r.header.has_crc32c = 1;
  r.header.maybe_redelivered = 1;
  r.header.subscribers_only = 1;
  r.header.stream_id = 0x5555'6666'7777'8888ull;
  r.header.attr_length = 3;
  std::memcpy(r.header.attrs, "abc", 3);
  REQUIRE(p->a->post(r) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return tx.sends.size() == 1 && rx.arrivals.size() == 1; });
  CHECK(tx.sends[0].status == FL_OK);
  const auto& ev = rx.arrivals[0];
  REQUIRE(ev.status == FL_OK);
  CHECK(ev.header.credit_id == 0x7'0000'0005ull);
  CHECK(ev.header.stream_id == 0x5555'6666'7777'8888ull);
  CHECK(ev.header.sequence == 77u);
  CHECK(ev.header.frame_id == 0xF1u);
  CHECK(ev.header.length == 1000u);
  CHECK(ev.header.has_crc32c == 1u);
  CHECK(ev.header.maybe_redelivered == 1u);
  CHECK(ev.header.subscribers_only == 1u);
  CHECK(ev.header.attr_length == 3u);
  CHECK(std::memcmp(slot.data + 256, p->src.data, 1000) == 0);
  CHECK(slot.data[256 + 1000] == 0xEE);
  // What landed is a valid slot header for the consumer.
  fl_slot_header landed;
  std::memcpy(&landed, slot.data, sizeof landed);
  CHECK(landed.frame_id == 0xF1u);
  CHECK(landed.group_id == 0xA2u);
  CHECK(landed.timestamp_ns == 123456789u);
  CHECK(landed.length == 1000u);
  CHECK(landed.sequence == 77u);
  CHECK(landed.crc32c == 0xC0FFEEu);
  CHECK(landed.flags == (FL_SLOT_HAS_CRC32C | FL_SLOT_MAYBE_REDELIVERED | FL_SLOT_GROUP_ELSEWHERE));
  CHECK(landed.attr_length == 3u);
  CHECK(std::memcmp(landed.attrs, "abc", 3) == 0);
  CHECK(p->fake->errors().empty());
}

TEST_CASE("rdma batching: N posts go to the adapter as one chain on flush, selectively signalled", "[rdma]") {
  RdmaTransportOptions o;
  o.signal_interval = 4;
  o.max_batch = 64;
  constexpr size_t kFrames = 10;
  auto p = makeDataPath(o, kFrames * 4096, 0x11);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  // Exposing binds a memory window per credit (one WR each on b's queue).
  std::vector<RemoteCredit> credits;
  for (size_t i = 0; i < kFrames; ++i) credits.push_back(p->credit(i + 1, 1024, i));
  const auto before = p->fake->stats();
  for (size_t i = 0; i < kFrames; ++i) {
    REQUIRE(p->a->post(request(i, credits[i], p->src, 100 + i, i + 1)) == PostResult::kOk);
  }
  CHECK(p->fake->stats().post_send_calls == before.post_send_calls);  // nothing before flush
  p->ra()->flush();
  auto after = p->fake->stats();
  CHECK(after.post_send_calls == before.post_send_calls + 1);
  CHECK(after.send_wrs == before.send_wrs + kFrames);
  // Every 4th WR and the last one of the chain: WRs 4, 8 and 10.
  CHECK(after.signalled_wrs == before.signalled_wrs + 3);
  until(tx, rx, [&] { return tx.sends.size() == kFrames && rx.arrivals.size() == kFrames; });
  // b ended each credit's window when its frame arrived.  All ten had
  // arrived before b polled: their invalidations went in one chain.
  const auto windows = p->rb()->verbsCounters().window_wrs;
  CHECK(windows == 2 * kFrames);
  CHECK(p->fake->stats().post_send_calls == after.post_send_calls + 1);
  after.post_send_calls += 1;
  tx.checkCompletions(kFrames);
  for (auto& s : tx.sends) CHECK(s.status == FL_OK);
  for (size_t i = 0; i < kFrames; ++i) {
    CHECK(rx.arrivals[i].header.credit_id == i + 1);
    CHECK(rx.arrivals[i].header.length == 100 + i);
  }
  p->ra()->flush();  // nothing waits: no empty chain is posted
  CHECK(p->fake->stats().post_send_calls == after.post_send_calls);
  CHECK(p->fake->errors().empty());
}

TEST_CASE("rdma post flushes by itself once max_batch WRs wait", "[rdma]") {
  RdmaTransportOptions o;
  o.max_batch = 8;
  auto p = makeDataPath(o);
  std::vector<RemoteCredit> credits;
  for (uint64_t i = 0; i < 20; ++i) credits.push_back(p->credit(i + 1, 64));
  p->fake->pauseDelivery(true);  // no frame lands, so b posts no invalidation meanwhile
  const auto before = p->fake->stats();
  for (uint64_t i = 0; i < 20; ++i)
    REQUIRE(p->a->post(request(i, credits[i], p->src, 64, i)) == PostResult::kOk);
  CHECK(p->fake->stats().post_send_calls == before.post_send_calls + 2);
  p->ra()->flush();
  CHECK(p->fake->stats().post_send_calls == before.post_send_calls + 3);
  CHECK(p->fake->stats().send_wrs == before.send_wrs + 20);
  p->fake->pauseDelivery(false);
}

TEST_CASE("rdma backpressure at the send queue depth, and no frame lost after it", "[rdma]") {
  RdmaTransportOptions o;
  o.send_queue_depth = 8;
  o.signal_interval = 4;
  auto p = makeDataPath(o);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  std::vector<RemoteCredit> credits;
  for (uint64_t i = 0; i < 20; ++i) credits.push_back(p->credit(i + 1, 64));
  p->fake->pauseDelivery(true);
  size_t posted = 0;
  while (posted < 20 && p->a->post(request(posted, credits[posted], p->src, 64, posted)) == PostResult::kOk) {
    ++posted;
  }
  CHECK(posted == 8);
  p->ra()->flush();
  CHECK(p->a->post(request(99, credits[8], p->src, 64, 8)) == PostResult::kBackpressure);
  CHECK(p->ra()->counters().backpressure == 2);
  p->fake->pauseDelivery(false);
  until(tx, rx, [&] {
    while (posted < 20 &&
           p->a->post(request(posted, credits[posted], p->src, 64, posted)) == PostResult::kOk) {
      ++posted;
    }
    p->ra()->flush();
    return tx.sends.size() == 20 && rx.arrivals.size() == 20;
  });
  tx.checkCompletions(20);
  for (auto& a : rx.arrivals) CHECK(a.status == FL_OK);
  CHECK(p->fake->errors().empty());  // never more WRs than the queue holds
}

TEST_CASE("rdma refuses unregistered memory without crashing", "[rdma]") {
  auto p = makePair();
  Memory& dst = p->mem(*p->dev_b, 8192, MemoryAccess::kCreditWindows);
  Memory& local = p->mem(*p->dev_b, 4096, MemoryAccess::kLocalRead);
  std::vector<uint8_t> plain(4096);
  // Credit buffers: no registration, a local-read one, no header room, past the end.
  CHECK(p->b->exposeCredit({1, plain.data() + 256, 100, nullptr}).error().code == FL_EINVAL);
  CHECK(p->b->exposeCredit({2, local.data + 256, 100, nullptr}).error().code == FL_EINVAL);
  CHECK(p->b->exposeCredit({3, dst.data, 100, nullptr}).error().code == FL_EINVAL);
  CHECK(p->b->exposeCredit({4, dst.data + 256, 8192, nullptr}).error().code == FL_EINVAL);
  // Duplicate ids, and ids that collide in the immediate data.
  REQUIRE(p->b->exposeCredit({5, dst.data + 256, 100, nullptr}).ok());
  CHECK(p->b->exposeCredit({5, dst.data + 4096, 100, nullptr}).error().code == FL_EINVAL);
  CHECK(p->b->exposeCredit({5 + (uint64_t{1} << 32), dst.data + 4096, 100, nullptr}).error().code ==
        FL_EINVAL);
  // Payloads.
  RemoteCredit c{5, 100, reinterpret_cast<uint64_t>(dst.data), dst.mr->rkey()};
  CHECK(p->a->post(request(1, c, plain.data(), 100, 1)) == PostResult::kInvalid);
  CHECK(p->a->post(request(1, c, nullptr, 0, 1)) == PostResult::kOk);  // zero length needs no memory
  CHECK(p->a->post(request(2, c, nullptr, 10, 1)) == PostResult::kInvalid);
}

TEST_CASE("rdma post sends under the request's memory key and refuses a payload without one", "[rdma]") {
  auto p = makeDataPath({}, 2 * 4096, 0x5A);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& other = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
  REQUIRE(p->src.mr->lkey() != other.mr->lkey());
  auto c1 = p->credit(1, 1000);
  auto c2 = p->credit(2, 1000, 1);
  const auto before = p->fake->stats();

  // No key: refused before anything is queued, and the refusal says why.
  CHECK(p->a->post(request(7, c1, p->src.data, 500, 1)) == PostResult::kInvalid);
  CHECK_THAT(std::string(p->a->lastRefusal()),
             Catch::Contains("no local memory key") && Catch::Contains("registered"));
  // The checks every transport makes say why as well.
  CHECK(p->a->post(request(8, c1, p->src, 1001, 1)) == PostResult::kInvalid);
  CHECK_THAT(std::string(p->a->lastRefusal()), Catch::Contains("exceeds the credit"));
  p->ra()->flush();
  CHECK(p->fake->stats().send_wrs == before.send_wrs);

  // The payload's SGE carries the request's key as it is.
  REQUIRE(p->a->post(request(0, c1, p->src, 500, 1)) == PostResult::kOk);
  p->ra()->flush();
  auto sges = p->fake->lastSendSges();
  REQUIRE(sges.size() == 2);
  CHECK(sges[1].lkey == p->src.mr->lkey());
  CHECK(sges[1].addr == reinterpret_cast<uint64_t>(p->src.data));
  CHECK(sges[1].length == 500u);
  until(tx, rx, [&] { return tx.sends.size() == 1 && rx.arrivals.size() == 1; });
  CHECK(tx.sends[0].status == FL_OK);
  CHECK(rx.arrivals[0].status == FL_OK);
  CHECK(std::memcmp(p->dst.data + 256, p->src.data, 500) == 0);

  // The key of a registration that does not hold the payload is not
  // corrected by a lookup: the adapter refuses the access and the frame fails.
  SendRequest wrong = request(1, c2, p->src, 500, 2);
  wrong.local_key = other.mr->lkey();
  REQUIRE(p->a->post(wrong) == PostResult::kOk);
  p->ra()->flush();
  sges = p->fake->lastSendSges();
  REQUIRE(sges.size() == 2);
  CHECK(sges[1].lkey == other.mr->lkey());
  until(tx, rx, [&] { return tx.sends.size() == 2 && !tx.errors.empty(); });
  CHECK(tx.sends[1].status == FL_ERR_TRANSPORT);
  CHECK_THAT(tx.errors[0].message, Catch::Contains(ibv_wc_status_str(IBV_WC_LOC_PROT_ERR)));
  CHECK(rx.arrivals.size() == 1);
}

TEST_CASE("rdma a frame for an unknown credit is reported; the link stays up", "[rdma]") {
  auto p = makeDataPath({}, 3 * 4096, 0x42);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto kept = std::make_shared<int>(1);
  REQUIRE(p->b->exposeCredit({50, p->dst.data + 256, 1000, kept}).ok());
  p->b->retractCredit(50);
  p->b->retractCredit(51);      // never exposed
  CHECK(kept.use_count() > 1);  // mapped while a frame for it may still land and be reported
  rx.pump();                    // the window's invalidation has executed: none can
  CHECK(kept.use_count() == 1);
  auto good = p->credit(60, 1000, 1);
  auto spare = p->credit(62, 1000, 2);
  // An id the receiver never exposed, through a live window.  (A write
  // after a credit is consumed or retracted is refused by the adapter:
  // test_rdma_windows.cpp.)
  RemoteCredit never{61, 1000, spare.remote_addr, spare.rkey};
  REQUIRE(p->a->post(request(0, good, p->src, 500, 2)) == PostResult::kOk);
  REQUIRE(p->a->post(request(1, never, p->src, 10, 3)) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return tx.sends.size() == 2 && rx.arrivals.size() == 2; });
  CHECK(rx.arrivals[0].status == FL_OK);
  CHECK(rx.arrivals[1].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(rx.arrivals[1].header.credit_id == 61u);
  for (auto& s : tx.sends) CHECK(s.status == FL_OK);
  CHECK(rx.errors.empty());
  CHECK(tx.errors.empty());
  CHECK(p->b->connected());
  CHECK(p->rb()->counters().unknown_credit_frames == 1);
}

// ---------------------------------------------------------------- errors

TEST_CASE("rdma work completion statuses map to frame, link and device scope", "[rdma]") {
  struct Case {
    ibv_wc_status status;
    ErrorScope scope;
    int frame_status;
    int link_status;
  };
  const Case cases[] = {
      {IBV_WC_REM_ACCESS_ERR, ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST},
      {IBV_WC_LOC_PROT_ERR, ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST},
      {IBV_WC_LOC_LEN_ERR, ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST},
      {IBV_WC_REM_INV_REQ_ERR, ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST},
      {IBV_WC_RETRY_EXC_ERR, ErrorScope::kLink, FL_ERR_LINK_LOST, FL_ERR_LINK_LOST},
      {IBV_WC_RNR_RETRY_EXC_ERR, ErrorScope::kLink, FL_ERR_LINK_LOST, FL_ERR_LINK_LOST},
      {IBV_WC_WR_FLUSH_ERR, ErrorScope::kLink, FL_ERR_LINK_LOST, FL_ERR_LINK_LOST},
      {IBV_WC_FATAL_ERR, ErrorScope::kDevice, FL_ERR_LINK_LOST, kStatusDevice},
      {IBV_WC_LOC_QP_OP_ERR, ErrorScope::kDevice, FL_ERR_LINK_LOST, kStatusDevice},
  };
  for (const Case& c : cases) {
    CAPTURE(ibv_wc_status_str(c.status));
    WcClassification k = classifyWcStatus(c.status);
    CHECK(k.scope == c.scope);
    CHECK(k.frame_status == c.frame_status);
    CHECK(k.link_status == c.link_status);

    // And end to end: the 2nd of 4 frames fails.
    auto p = makeDataPath();
    Endpoint tx{p->a.get()}, rx{p->b.get()};
    std::vector<RemoteCredit> credits;
    for (uint64_t i = 0; i < 4; ++i) credits.push_back(p->credit(i + 1, 64));
    REQUIRE(p->a->post(request(0, credits[0], p->src, 64, 1)) == PostResult::kOk);
    p->ra()->flush();
    until(tx, rx, [&] { return tx.sends.size() == 1; });
    p->fake->injectSendError(c.status);
    for (uint64_t i = 1; i < 4; ++i)
      REQUIRE(p->a->post(request(i, credits[i], p->src, 64, i + 1)) == PostResult::kOk);
    p->ra()->flush();
    until(tx, rx, [&] { return tx.sends.size() == 4 && !tx.errors.empty(); });
    tx.checkCompletions(4);
    CHECK(tx.sends[0].status == FL_OK);
    CHECK(tx.sends[1].status == c.frame_status);
    CHECK(tx.sends[2].status == FL_ERR_LINK_LOST);
    CHECK(tx.sends[3].status == FL_ERR_LINK_LOST);
    REQUIRE(tx.errors.size() == 1);
    CHECK(tx.errors[0].status == c.link_status);
    CHECK_THAT(tx.errors[0].message, Catch::Contains(ibv_wc_status_str(c.status)));
    CHECK_FALSE(p->a->connected());
    CHECK(p->a->post(request(9, credits[0], p->src, 64, 9)) == PostResult::kNotConnected);
    CHECK(p->a->exposeCredit({99, p->dst.data + 256, 1, nullptr}).error().code == FL_ERR_LINK_LOST);
    // The peer learns through rdma_cm (the failing side disconnects).
    until(tx, rx, [&] { return !rx.errors.empty(); });
    CHECK(rx.errors[0].status == FL_ERR_LINK_LOST);
    tx.pump();
    CHECK(tx.errors.size() == 1);
  }
}

TEST_CASE("rdma write to a bad rkey fails that frame and the link", "[rdma]") {
  auto p = makeDataPath();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto c = p->credit(1, 64);
  c.rkey ^= 1;
  REQUIRE(p->a->post(request(0, c, p->src, 64, 1)) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return tx.sends.size() == 1 && !tx.errors.empty(); });
  CHECK(tx.sends[0].status == FL_ERR_TRANSPORT);
  CHECK(tx.errors[0].status == FL_ERR_LINK_LOST);
  CHECK(p->dst.data[256] == 0xEE);
}

TEST_CASE("rdma asynchronous events fail the links they concern, once", "[rdma]") {
  struct Case {
    ibv_event_type type;
    bool qp;
    int status;
  };
  const Case cases[] = {{IBV_EVENT_DEVICE_FATAL, false, kStatusDevice},
                        {IBV_EVENT_PORT_ERR, false, kStatusDevice},
                        {IBV_EVENT_QP_FATAL, true, FL_ERR_LINK_LOST},
                        {IBV_EVENT_QP_ACCESS_ERR, true, FL_ERR_LINK_LOST}};
  for (const Case& c : cases) {
    CAPTURE(ibv_event_type_str(c.type));
    auto p = makeDataPath();
    Endpoint tx{p->a.get()}, rx{p->b.get()};
    auto credit = p->credit(1, 64);
    p->fake->pauseDelivery(true);
    REQUIRE(p->a->post(request(0, credit, p->src, 64, 1)) == PostResult::kOk);
    p->ra()->flush();
    p->fake->injectAsyncEvent("fake_a", c.type, c.qp ? p->ra()->cmId()->qp : nullptr);
    REQUIRE(readable(p->a->eventFd(), 2000));
    until(tx, rx, [&] { return !tx.errors.empty() && tx.sends.size() == 1; });
    CHECK(tx.errors[0].status == c.status);
    CHECK(tx.sends[0].status == FL_ERR_LINK_LOST);
    p->fake->injectAsyncEvent("fake_a", c.type, nullptr);  // a second one changes nothing
    std::this_thread::sleep_for(20ms);
    tx.pump();
    CHECK(tx.errors.size() == 1);
    p->fake->pauseDelivery(false);
  }
}

TEST_CASE("rdma peer disconnect fails the link once and flushes posted sends", "[rdma]") {
  auto p = makeDataPath();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto credit = p->credit(1, 64);
  p->holdSixFrames(credit);
  p->b->shutdown();
  rx.pump();
  REQUIRE(rx.errors.size() == 1);
  CHECK(rx.errors[0].status == FL_ERR_SHUTDOWN);
  until(tx, rx, [&] { return !tx.errors.empty() && tx.sends.size() == 6; });
  tx.checkCompletions(6);
  for (auto& s : tx.sends) CHECK(s.status == FL_ERR_LINK_LOST);
  CHECK(tx.errors.size() == 1);
  CHECK(tx.errors[0].status == FL_ERR_LINK_LOST);
  CHECK_THAT(tx.errors[0].message, Catch::Contains("disconnected"));
  p->fake->pauseDelivery(false);
}

TEST_CASE("rdma shutdown completes everything and tears down in order", "[rdma]") {
  auto p = makeDataPath();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto credit = p->credit(1, 64);
  p->holdSixFrames(credit);
  const auto before = p->fake->stats();
  p->a->shutdown();
  tx.pump();  // everything is reported by the time shutdown() returns
  tx.checkCompletions(6);
  for (auto& s : tx.sends) CHECK(s.status == FL_ERR_LINK_LOST);
  REQUIRE(tx.errors.size() == 1);
  CHECK(tx.errors[0].status == FL_ERR_SHUTDOWN);
  auto after = p->fake->stats();
  CHECK(after.live_qps == before.live_qps - 1);
  CHECK(after.live_cqs == before.live_cqs - 1);
  CHECK(after.live_ids == before.live_ids - 1);
  CHECK(p->a->post(request(7, credit, p->src, 64, 7)) == PostResult::kNotConnected);
  p->a->shutdown();  // idempotent
  tx.pump();
  CHECK(tx.errors.size() == 1);
  until(tx, rx, [&] { return !rx.errors.empty(); });
  p->b->shutdown();
  p->fake->pauseDelivery(false);
  CHECK(p->fake->errors().empty());  // no QP/CQ/id destroyed out of order, every CQ event acked
}

TEST_CASE("rdma eventFd is readable exactly while something is to be polled", "[rdma]") {
  auto p = makeDataPath({}, 3 * 4096);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  tx.pump();
  rx.pump();
  CHECK_FALSE(readable(p->a->eventFd(), 0));
  CHECK_FALSE(readable(p->b->eventFd(), 0));
  std::vector<RemoteCredit> credits;
  for (uint64_t i = 0; i < 3; ++i) credits.push_back(p->credit(i + 1, 64, i));
  rx.pump();  // the window binds' completions
  CHECK_FALSE(readable(p->b->eventFd(), 0));
  for (uint64_t i = 0; i < 3; ++i)
    REQUIRE(p->a->post(request(i, credits[i], p->src, 64, i)) == PostResult::kOk);
  CHECK_FALSE(readable(p->b->eventFd(), 0));  // not flushed yet
  p->ra()->flush();
  REQUIRE(readable(p->a->eventFd(), 1000));
  REQUIRE(readable(p->b->eventFd(), 1000));
  TransportEvent ev;
  size_t arrived = 0;
  while (arrived < 3) {
    REQUIRE(readable(p->b->eventFd(), 1000));
    arrived += p->b->poll(&ev, 1);
  }
  CHECK(p->b->poll(&ev, 1) == 0);
  CHECK_FALSE(readable(p->b->eventFd(), 0));
  size_t done = 0;
  while (done < 3) {
    REQUIRE(readable(p->a->eventFd(), 1000));
    done += p->a->poll(&ev, 1);
  }
  CHECK(p->a->poll(&ev, 1) == 0);
  CHECK_FALSE(readable(p->a->eventFd(), 0));
  p->b->shutdown();
  REQUIRE(readable(p->a->eventFd(), 1000));
}

// A daemon polls each link every round of its loop: an idle round must not make a system call per
// event channel (under emulation those reads were most of a round).
TEST_CASE("rdma an idle poll reads no event channel; one with something to say is read", "[rdma]") {
  auto p = makeDataPath();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  tx.pump();
  rx.pump();
  const auto before = p->fake->stats();
  TransportEvent ev;
  for (int i = 0; i < 100; ++i) REQUIRE(p->a->poll(&ev, 1) == 0);
  const auto idle = p->fake->stats();
  CHECK(idle.cq_event_reads == before.cq_event_reads);
  CHECK(idle.cm_event_reads == before.cm_event_reads);
  // A frame: its completions raise the armed CQs' events, which the polls take (and ack).
  auto credit = p->credit(1, 64);
  rx.pump();
  REQUIRE(p->a->post(request(0, credit, p->src, 64, 1)) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return tx.sends.size() == 1 && rx.arrivals.size() == 1; });
  CHECK(tx.sends[0].status == FL_OK);
  CHECK(p->fake->stats().cq_event_reads > idle.cq_event_reads);
  // The peer's disconnect: an rdma_cm event, read, and the link fails.
  p->b->shutdown();
  until(tx, rx, [&] { return !tx.errors.empty(); });
  CHECK(tx.errors[0].status == FL_ERR_LINK_LOST);
  CHECK(p->fake->stats().cm_event_reads > idle.cm_event_reads);
}

// The writer's adapter reports the refusal (a completion) and, soon after, the peer's disconnect
// (an rdma_cm event, the peer's queue pair having failed on the bad write).  When both wait for
// the same poll, the link error names the cause, not its consequence.
TEST_CASE("rdma link error names a failed completion ahead of the disconnect that followed it", "[rdma]") {
  auto p = makeDataPath();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  auto c = p->credit(1, 64);
  c.rkey ^= 1;
  REQUIRE(p->a->post(request(0, c, p->src, 64, 1)) == PostResult::kOk);
  p->ra()->flush();
  p->b->shutdown();  // queues DISCONNECTED for a, behind the completion a has not polled yet
  rx.pump();
  until(tx, rx, [&] { return tx.sends.size() == 1 && !tx.errors.empty(); });
  REQUIRE(tx.errors.size() == 1);
  CHECK_THAT(tx.errors[0].message, Catch::Contains(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)));
  CHECK(tx.sends[0].status == FL_ERR_TRANSPORT);
}

}  // namespace framelink::transport::rdma::testing
