// The Transport conformance suite (transport_conformance.h), control
// records: they arrive whole, in order and exactly once, in both directions
// and among frames; empty and oversized ones, and any after the link failed,
// are refused.
//
// Sizes around 4 KiB cross rdma's control fragment size (one fragment per
// SEND, kControlChunkBytes); tcp and grpc frame records in-band.
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/transport.h"
#include "transport_conformance.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {

TEMPLATE_TEST_CASE("control records arrive in order with exact bytes, both directions",
                   "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  const std::vector<size_t> sizes = {1, 2, 7, 8, 64, 255, 4095, 4096, 4097, 8192, 12'289, 1000, 3};
  for (int dir = 0; dir < 2; ++dir) {
    CAPTURE(dir);
    Endpoint tx{dir == 0 ? pair->a.get() : pair->b.get()};
    Endpoint rx{dir == 0 ? pair->b.get() : pair->a.get()};
    std::vector<std::string> sent;
    for (size_t i = 0; i < sizes.size(); ++i) {
      sent.push_back(controlRecord(100 * dir + i, sizes[i]));
      REQUIRE(tx.t->postControl(sent.back()) == PostResult::kOk);
    }
    // A record that is all zero bytes is a record too.
    sent.push_back(std::string(300, '\0'));
    REQUIRE(tx.t->postControl(sent.back()) == PostResult::kOk);
    waitFor(
        tx, rx, [&] { return rx.controls.size() >= sent.size(); }, "every control record");
    // Nothing more arrives, nothing arrives twice, and records are no frames.
    settle(tx, rx);
    REQUIRE(rx.controls.size() == sent.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      CAPTURE(i, sent[i].size());
      CHECK(rx.controls[i].size() == sent[i].size());
      CHECK(firstDifference(rx.controls[i], sent[i]) == -1);
    }
    CHECK(rx.arrivals.empty());
    CHECK(tx.sends.empty());  // records are not frames: no SendComplete
    CHECK(tx.controls.empty());
    CHECK(tx.errors.empty());
    CHECK(rx.errors.empty());
  }
}

TEMPLATE_TEST_CASE("empty and oversized control records are refused, the largest one arrives whole",
                   "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  CHECK(tx.t->postControl(std::string()) == PostResult::kInvalid);
  CHECK(tx.t->postControl(controlRecord(1, kMaxControlBytes + 1)) == PostResult::kInvalid);
  CHECK(tx.t->postControl(controlRecord(2, 4 * kMaxControlBytes)) == PostResult::kInvalid);
  // Nothing of the refused ones was queued: the first record to arrive is
  // the largest allowed one, then a small one after it.
  const std::string largest = controlRecord(3, kMaxControlBytes);
  const std::string small = controlRecord(4, 10);
  REQUIRE(tx.t->postControl(largest) == PostResult::kOk);
  REQUIRE(tx.t->postControl(small) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return rx.controls.size() >= 2 || !rx.errors.empty(); }, "the two records");
  REQUIRE(rx.errors.empty());
  settle(tx, rx);
  REQUIRE(rx.controls.size() == 2);
  CHECK(rx.controls[0].size() == kMaxControlBytes);
  CHECK(firstDifference(rx.controls[0], largest) == -1);
  CHECK(rx.controls[1] == small);
  CHECK(tx.errors.empty());
  CHECK(tx.t->connected());
  CHECK(rx.t->connected());
}

TEMPLATE_TEST_CASE("a 100 KiB control record arrives whole", "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  // Several of them back to back, so that one record's last fragment and
  // the next one's first follow each other on the wire.
  std::vector<std::string> sent;
  for (uint64_t i = 0; i < 5; ++i) {
    sent.push_back(controlRecord(50 + i, 100 * 1024 + i));
    REQUIRE(tx.t->postControl(sent.back()) == PostResult::kOk);
  }
  waitFor(
      tx, rx, [&] { return rx.controls.size() >= sent.size() || !rx.errors.empty(); },
      "five 100 KiB records");
  REQUIRE(rx.errors.empty());
  REQUIRE(rx.controls.size() == sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    CAPTURE(i);
    CHECK(rx.controls[i].size() == 100 * 1024 + i);
    CHECK(firstDifference(rx.controls[i], sent[i]) == -1);
  }
}

TEMPLATE_TEST_CASE("many control records interleaved with frames all arrive", "[transport][control]",
                   FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  constexpr size_t kFrames = 300;
  constexpr size_t kRecordsPerFrame = 4;
  constexpr size_t kWindow = 32;  // credits outstanding
  constexpr size_t kFrameSize = 16 * 1024;
  std::mt19937_64 rng(20261124);
  // Mostly small records (like grants and ACKs), some beyond one rdma fragment.
  auto record_size = [&] { return rng() % 8 == 0 ? 1 + rng() % 20'000 : 1 + rng() % 200; };

  CreditWindow window(*rx.t, kFrames, kWindow, [&](size_t) { return kFrameSize; });
  std::map<uint64_t, Payload> in_flight;

  std::vector<std::string> sent;
  std::vector<std::string> reverse_sent;  // b -> a, at the same time
  size_t next_post = 0;
  size_t records_due = 0;  // records to post before the next frame
  size_t verified = 0;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline * 3;
  while (verified < kFrames || tx.sends.size() < kFrames || rx.controls.size() < sent.size() ||
         tx.controls.size() < reverse_sent.size() || next_post < kFrames) {
    while (next_post < kFrames) {
      bool blocked = false;
      while (records_due > 0) {
        std::string r = controlRecord(sent.size(), record_size());
        PostResult pr = tx.t->postControl(r);
        if (pr == PostResult::kBackpressure) {
          blocked = true;
          break;
        }
        REQUIRE(pr == PostResult::kOk);
        sent.push_back(std::move(r));
        --records_due;
      }
      if (blocked || window.granted(next_post) == nullptr) break;
      auto payload = pattern(next_post, kFrameSize);
      PostResult pr = tx.post(request(next_post, *window.granted(next_post), payload, next_post + 1));
      if (pr == PostResult::kBackpressure) break;
      REQUIRE(pr == PostResult::kOk);
      in_flight.emplace(next_post, std::move(payload));
      window.posted(next_post);
      ++next_post;
      records_due = kRecordsPerFrame;
    }
    tx.pump();
    rx.pump();
    for (; verified < rx.arrivals.size(); ++verified) {
      const auto& ev = rx.arrivals[verified];
      REQUIRE(ev.status == FL_OK);
      REQUIRE(ev.header.sequence == verified + 1);
      long bad = firstMismatch(window.landed(verified).data(), pattern(verified, kFrameSize));
      if (bad != -1) FAIL("frame " << verified << " differs at byte " << bad);
      window.release(verified);
      // The receiver answers each frame with a record, as it would ACK it.
      std::string ack = controlRecord(1'000'000 + verified, 24);
      REQUIRE(rx.t->postControl(ack) == PostResult::kOk);
      reverse_sent.push_back(std::move(ack));
    }
    for (const auto& ev : tx.sends) REQUIRE(ev.status == FL_OK);
    REQUIRE(tx.errors.empty());
    REQUIRE(rx.errors.empty());
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("timed out: posted " << next_post << " frames and " << sent.size() << " records; "
                                << tx.sends.size() << " completed, " << verified << " frames and "
                                << rx.controls.size() << " records arrived, " << tx.controls.size() << " of "
                                << reverse_sent.size() << " answers");
    }
    awaitEvents(tx, rx, 5);
  }
  REQUIRE(rx.controls.size() == sent.size());
  CHECK(sent.size() == (kFrames - 1) * kRecordsPerFrame);
  for (size_t i = 0; i < sent.size(); ++i) {
    if (rx.controls[i] != sent[i]) {
      FAIL("record " << i << " of " << sent.size() << " (" << sent[i].size() << " bytes) arrived as "
                     << rx.controls[i].size() << " bytes differing at "
                     << firstDifference(rx.controls[i], sent[i]));
    }
  }
  REQUIRE(tx.controls.size() == reverse_sent.size());
  CHECK(tx.controls == reverse_sent);
  for (size_t i = 0; i < kFrames; ++i) REQUIRE(tx.sends[i].cookie == i);
}

TEMPLATE_TEST_CASE("control records after the link failed are refused with kNotConnected",
                   "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint survivor{pair->a.get()}, leaver{pair->b.get()};
  // The link works first.
  REQUIRE(survivor.t->postControl("before") == PostResult::kOk);
  waitFor(
      survivor, leaver, [&] { return !leaver.controls.empty(); }, "the record before the failure");
  CHECK(leaver.controls[0] == "before");

  leaver.t->shutdown();
  CHECK(leaver.t->postControl("after shutdown") == PostResult::kNotConnected);
  waitFor(
      survivor, leaver, [&] { return !survivor.errors.empty(); }, "LinkError on the peer");
  CHECK(survivor.t->postControl("after the peer left") == PostResult::kNotConnected);
  CHECK(survivor.t->postControl(controlRecord(9, 100 * 1024)) == PostResult::kNotConnected);
  survivor.pump();
  leaver.pump();
  CHECK(survivor.errors.size() == 1);
  CHECK(leaver.errors.size() == 1);
}

TEMPLATE_TEST_CASE("control records arrive in order, exactly once, among frames of any size",
                   "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  for (int dir = 0; dir < 2; ++dir) {
    CAPTURE(dir);
    Endpoint tx{dir == 0 ? pair->a.get() : pair->b.get()};
    Endpoint rx{dir == 0 ? pair->b.get() : pair->a.get()};
    constexpr size_t kRecords = 600;
    constexpr size_t kEvery = 50;  // a frame after every 50th record
    constexpr size_t kFrames = kRecords / kEvery;
    auto recordSize = [](size_t i) {
      return i == 300 || i == 301 ? kMaxControlBytes : 1 + (i * 37) % 2000;  // the largest allowed, twice
    };
    std::vector<Buffer> buffers;
    std::vector<Payload> payloads;
    for (size_t f = 0; f < kFrames; ++f) {
      const size_t size = f % 3 == 0 ? (3u << 20) + f : 1024 * (f + 1);
      buffers.emplace_back(size);
      payloads.push_back(pattern(500 + f, size));
    }
    size_t frames = 0;
    for (size_t i = 0; i < kRecords; ++i) {
      PostResult pr;
      while ((pr = tx.t->postControl(controlRecord(i, recordSize(i)))) == PostResult::kBackpressure) {
        tx.pump();
        rx.pump();
      }
      REQUIRE(pr == PostResult::kOk);
      if (i % kEvery == kEvery - 1) {
        RemoteCredit c = expose(*rx.t, buffers[frames].credit(100 + frames));
        REQUIRE(tx.post(request(frames, c, payloads[frames], frames + 1)) == PostResult::kOk);
        ++frames;
      }
    }
    tx.t->flush();
    waitFor(
        tx, rx,
        [&] {
          return rx.controls.size() == kRecords && rx.arrivals.size() == kFrames &&
                 tx.sends.size() == kFrames;
        },
        "every record and frame");
    for (size_t i = 0; i < kRecords; ++i) {
      if (rx.controls[i] != controlRecord(i, recordSize(i))) {
        FAIL("record " << i << " differs, is out of order or was doubled");
      }
    }
    for (size_t f = 0; f < kFrames; ++f) {
      REQUIRE(tx.sends[f].status == FL_OK);
      REQUIRE(tx.sends[f].cookie == f);
      REQUIRE(rx.arrivals[f].status == FL_OK);
      REQUIRE(rx.arrivals[f].header.sequence == f + 1);
      long bad = firstMismatch(buffers[f].data(), payloads[f]);
      if (bad != -1) FAIL("frame " << f << " differs at byte " << bad);
    }
    CHECK(tx.controls.empty());  // nothing echoes back
    CHECK(tx.errors.empty());
    CHECK(rx.errors.empty());
  }
}

}  // namespace framelink::transport::testing
