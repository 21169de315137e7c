// The rdma transport's reads (pull) against the fake adapter: an offered
// slot is read through a type-2 window over exactly that slot, read only,
// which ends when the source is retracted; reads share the send queue's
// order and signalling with frames; refusals and a link going down.
#include <cstring>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "rdma_test_pair.h"

namespace framelink::transport::rdma::testing {
namespace {

constexpr size_t kSlot = 4096;

// a owns two producer slots (src), b reads into two consumer slots (dst).
struct ReadPath : Pair {
  Memory& src;
  Memory& dst;
  Endpoint owner, reader;

  explicit ReadPath(RdmaTransportOptions options = {})
      : Pair(options, twoDevices()),
        src(mem(*dev_a, 2 * kSlot, MemoryAccess::kLocalRead)),
        dst(mem(*dev_b, 2 * kSlot, MemoryAccess::kCreditWindows)) {
    owner.t = a.get();
    reader.t = b.get();
    for (size_t i = 0; i < 2 * kSlot; ++i) src.data[i] = static_cast<uint8_t>(i * 7 + 3);
  }

  RemoteSource expose(uint64_t id, size_t slot, uint64_t length) {
    auto s = a->exposeSource(LocalSource{id, src.data + slot * kSlot, length, nullptr});
    if (!s) FAIL("exposeSource: " << s.error().message);
    a->flush();  // the window's bind goes with a's next chain (the offer's)
    return s.value();
  }

  ReadRequest read(uint64_t cookie, const RemoteSource& source, size_t slot) {
    ReadRequest r;
    r.cookie = cookie;
    r.source = source;
    r.buffer = dst.data + slot * kSlot;
    r.capacity = kSlot;
    r.local_key = dst.mr->lkey();
    return r;
  }

  void settle() {
    until(owner, reader, [&] { return reader.reads.size() + reader.errors.size() > 0; });
  }
};

}  // namespace

TEST_CASE("rdma read: an offered slot lands in the reader's buffer through a read-only window",
          "[rdma][read]") {
  ReadPath p;
  REQUIRE(p.a->readable());
  REQUIRE(p.b->readable());
  CHECK(p.ra()->readDepth() == 16);
  const RemoteSource source = p.expose(11, 1, 3000);
  CHECK(source.remote_addr == reinterpret_cast<uint64_t>(p.src.data + kSlot));
  CHECK(source.length == 3000u);
  CHECK(source.rkey != p.src.mr->rkey());  // a window's key, never the segment's
  REQUIRE(p.reader.t->postRead(p.read(5, source, 0)) == PostResult::kOk);
  p.b->flush();
  until(p.owner, p.reader, [&] { return p.reader.reads.size() == 1; });
  CHECK(p.reader.reads[0].cookie == 5u);
  CHECK(p.reader.reads[0].status == FL_OK);
  CHECK(std::memcmp(p.dst.data, p.src.data + kSlot, 3000) == 0);
  CHECK(p.dst.data[3000] == 0xEE);
  CHECK(p.fake->stats().reads == 1);
  CHECK(p.b->counters().reads_completed == 1);
  CHECK(p.b->counters().bytes_read == 3000);
  // The window grants reading only: a write under its key is refused.
  ibv_qp* owner_qp = p.fake->qpOnDevice("fake_a");
  REQUIRE(owner_qp != nullptr);
  CHECK(p.fake->peerWrite(owner_qp, source.rkey, source.remote_addr, std::vector<uint8_t>(16, 0x66),
                          std::nullopt) == IBV_WC_REM_ACCESS_ERR);
  CHECK(p.src.data[kSlot] == 3);  // untouched
  CHECK(p.fake->errors().empty());
}

TEST_CASE("rdma read: the adapter refuses a read past the offered slot, and the link fails", "[rdma][read]") {
  ReadPath p;
  RemoteSource source = p.expose(1, 0, 1000);
  // The reader lies about the length: the window covers 1000 bytes only.
  source.length = 1001;
  REQUIRE(p.reader.t->postRead(p.read(1, source, 0)) == PostResult::kOk);
  p.b->flush();
  p.settle();
  until(p.owner, p.reader, [&] { return p.reader.reads.size() == 1 && !p.reader.errors.empty(); });
  CHECK(p.reader.reads[0].status != FL_OK);
  CHECK(p.dst.data[0] == 0xEE);
  CHECK(p.fake->stats().reads == 0);
}

TEST_CASE("rdma read: a long read goes as several READ WRs and completes once, with the last",
          "[rdma][read]") {
  RdmaTransportOptions o;
  SECTION("pieces of read_piece_bytes") { o.read_piece_bytes = 1024; }
  SECTION("at most kMaxReadPieces pieces") {
    o.read_piece_bytes = 1;  // 3000 bytes in 16 pieces of 188 bytes, not 3000 of 1
  }
  ReadPath p(o);
  const RemoteSource source = p.expose(3, 1, 3000);
  REQUIRE(p.reader.t->postRead(p.read(9, source, 0)) == PostResult::kOk);
  p.b->flush();
  until(p.owner, p.reader, [&] { return p.reader.reads.size() == 1; });
  CHECK(p.reader.reads[0].cookie == 9u);
  CHECK(p.reader.reads[0].status == FL_OK);
  CHECK(std::memcmp(p.dst.data, p.src.data + kSlot, 3000) == 0);
  CHECK(p.dst.data[3000] == 0xEE);
  CHECK(p.fake->stats().reads == (o.read_piece_bytes == 1024 ? 3u : kMaxReadPieces));
  CHECK(p.b->counters().reads_completed == 1);
  CHECK(p.b->counters().bytes_read == 3000);
  CHECK(p.reader.errors.empty());
  CHECK(p.fake->errors().empty());
}

TEST_CASE("rdma read: a piece the adapter refuses fails its read once, and the link", "[rdma][read]") {
  RdmaTransportOptions o;
  o.read_piece_bytes = 1024;
  ReadPath p(o);
  RemoteSource source = p.expose(1, 0, 2000);
  // The offer lies about the length: the second piece (1024..2047) runs past
  // the window's 2000 bytes; the first is read, the third is never executed.
  source.length = 2100;
  REQUIRE(p.reader.t->postRead(p.read(4, source, 0)) == PostResult::kOk);
  p.b->flush();
  until(p.owner, p.reader, [&] { return !p.reader.reads.empty() && !p.reader.errors.empty(); });
  for (int i = 0; i < 10; ++i) {  // the third piece's flush completion comes and goes
    p.owner.pump();
    p.reader.pump();
  }
  REQUIRE(p.reader.reads.size() == 1);
  CHECK(p.reader.reads[0].cookie == 4u);
  CHECK(p.reader.reads[0].status != FL_OK);
  CHECK_FALSE(p.reader.reads[0].message.empty());
  CHECK(p.fake->stats().reads == 1);
  CHECK(p.b->counters().reads_completed == 0);
  CHECK(std::memcmp(p.dst.data, p.src.data, 1024) == 0);  // the first piece landed
  CHECK(p.dst.data[1024] == 0xEE);
}

TEST_CASE("rdma read: a retracted source's key is refused by the adapter", "[rdma][read]") {
  ReadPath p;
  const RemoteSource source = p.expose(7, 0, 2000);
  REQUIRE(p.reader.t->postRead(p.read(1, source, 0)) == PostResult::kOk);
  p.b->flush();
  until(p.owner, p.reader, [&] { return p.reader.reads.size() == 1; });
  REQUIRE(p.reader.reads[0].status == FL_OK);
  const uint64_t invalidations = p.fake->stats().invalidations;
  p.a->retractSource(7);  // the invalidation is on the queue when this returns
  until(p.owner, p.reader, [&] { return p.fake->stats().invalidations == invalidations + 1; });
  std::memset(p.dst.data + kSlot, 0xEE, kSlot);
  REQUIRE(p.reader.t->postRead(p.read(2, source, 1)) == PostResult::kOk);
  p.b->flush();
  until(p.owner, p.reader, [&] { return p.reader.reads.size() == 2 && !p.reader.errors.empty(); });
  CHECK(p.reader.reads[1].status != FL_OK);
  CHECK(p.dst.data[kSlot] == 0xEE);  // nothing read
  // The same id may be offered again later (a new window, a new key).
  CHECK(p.fake->stats().reads == 1);
}

TEST_CASE("rdma read: reads share the send queue with frames, in order and selectively signalled",
          "[rdma][read]") {
  ReadPath p;
  Memory& frames = p.mem(*p.dev_b, kSlot, MemoryAccess::kLocalRead, 0x42);
  Memory& landing = p.mem(*p.dev_a, 8 * kSlot, MemoryAccess::kCreditWindows);
  const RemoteSource source = p.expose(3, 0, 512);
  // b reads from a and sends frames to a, interleaved, 8 of each.
  std::vector<RemoteCredit> credits;
  for (uint64_t i = 0; i < 8; ++i) {
    auto c = p.a->exposeCredit({100 + i, landing.data + i * kSlot + 256, 1024, nullptr});
    REQUIRE(c.ok());
    credits.push_back(c.value());
  }
  p.a->flush();
  std::vector<Memory*> bufs;
  for (uint64_t i = 0; i < 8; ++i) {
    bufs.push_back(&p.mem(*p.dev_b, kSlot, MemoryAccess::kCreditWindows));
    ReadRequest r = p.read(i, source, 0);
    r.buffer = bufs.back()->data;
    r.local_key = bufs.back()->mr->lkey();
    REQUIRE(p.b->postRead(r) == PostResult::kOk);
    REQUIRE(p.b->post(request(i, credits[i], frames, 1024, i)) == PostResult::kOk);
  }
  const uint64_t signalled_before = p.rb()->verbsCounters().signalled_wrs;
  p.b->flush();
  Endpoint& tx = p.reader;
  until(p.owner, tx, [&] { return tx.reads.size() == 8 && tx.sends.size() == 8; });
  for (uint64_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(tx.reads[i].cookie == i);
    CHECK(tx.reads[i].status == FL_OK);
    CHECK(tx.sends[i].cookie == i);
    CHECK(tx.sends[i].status == FL_OK);
    CHECK(std::memcmp(bufs[i]->data, p.src.data, 512) == 0);
  }
  // 16 work requests, signalled every 16th and at the chain's end: one or two.
  CHECK(p.rb()->verbsCounters().signalled_wrs - signalled_before <= 2);
  CHECK(p.owner.arrivals.size() == 8);
  CHECK(p.fake->errors().empty());
}

TEST_CASE("rdma read: a read without a key lands through the registration of its slot", "[rdma][read]") {
  // As the daemon registers a consumer: a registration per slot, each its own lkey.
  ReadPath p;
  Memory& slot0 = p.mem(*p.dev_b, kSlot, MemoryAccess::kCreditWindows);
  Memory& slot1 = p.mem(*p.dev_b, kSlot, MemoryAccess::kCreditWindows);
  REQUIRE(slot0.mr->lkey() != slot1.mr->lkey());
  const RemoteSource source = p.expose(21, 0, 2500);
  ReadRequest r = p.read(7, source, 0);
  r.buffer = slot1.data;
  r.local_key.reset();
  REQUIRE(p.b->postRead(r) == PostResult::kOk);
  p.b->flush();
  until(p.owner, p.reader, [&] { return p.reader.reads.size() == 1; });
  CHECK(p.reader.reads[0].status == FL_OK);
  CHECK(std::memcmp(slot1.data, p.src.data, 2500) == 0);
  CHECK(p.fake->errors().empty());
}

TEST_CASE("rdma read: malformed reads and sources are refused, nothing posted", "[rdma][read]") {
  ReadPath p;
  const RemoteSource source = p.expose(1, 0, 1000);
  std::vector<uint8_t> unregistered_buffer(kSlot);
  ReadRequest no_key = p.read(1, source, 0);
  no_key.local_key.reset();
  no_key.buffer = unregistered_buffer.data();
  CHECK(p.b->postRead(no_key) == PostResult::kInvalid);
  CHECK(std::string(p.b->lastRefusal()).find("no local memory key") != std::string::npos);
  ReadRequest small = p.read(2, source, 0);
  small.capacity = 999;
  CHECK(p.b->postRead(small) == PostResult::kInvalid);
  CHECK(std::string(p.b->lastRefusal()).find("larger than") != std::string::npos);

  // A source outside the producer registrations, or in a consumer's, is refused.
  std::vector<uint8_t> loose(100);
  auto unregistered = p.a->exposeSource(LocalSource{2, loose.data(), loose.size(), nullptr});
  REQUIRE_FALSE(unregistered.ok());
  CHECK(unregistered.error().code == FL_EINVAL);
  Memory& consumer = p.mem(*p.dev_a, kSlot, MemoryAccess::kCreditWindows);
  auto wrong_kind = p.a->exposeSource(LocalSource{3, consumer.data, 100, nullptr});
  REQUIRE_FALSE(wrong_kind.ok());
  CHECK(wrong_kind.error().code == FL_EINVAL);
  auto twice = p.a->exposeSource(LocalSource{1, p.src.data, 1000, nullptr});
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.error().code == FL_EINVAL);
  // An empty source needs no window and reads nothing.
  const uint64_t binds = p.fake->stats().binds;
  auto empty = p.a->exposeSource(LocalSource{4, nullptr, 0, nullptr});
  REQUIRE(empty.ok());
  CHECK(p.fake->stats().binds == binds);
  ReadRequest nothing = p.read(9, empty.value(), 0);
  nothing.buffer = nullptr;
  nothing.local_key.reset();
  REQUIRE(p.b->postRead(nothing) == PostResult::kOk);
  until(p.owner, p.reader, [&] { return p.reader.reads.size() == 1; });
  CHECK(p.reader.reads[0].cookie == 9u);
  CHECK(p.reader.reads[0].status == FL_OK);
  CHECK(p.fake->stats().reads == 0);
  CHECK(p.fake->errors().empty());
}

TEST_CASE("rdma read: outstanding reads complete once when the link goes", "[rdma][read]") {
  ReadPath p;
  const RemoteSource source = p.expose(1, 0, 4000);
  p.fake->pauseDelivery(true);
  for (uint64_t i = 0; i < 6; ++i) REQUIRE(p.b->postRead(p.read(i, source, i % 2)) == PostResult::kOk);
  p.b->flush();
  p.b->shutdown();
  p.reader.pump();
  REQUIRE(p.reader.reads.size() == 6);
  std::set<uint64_t> cookies;
  for (const auto& ev : p.reader.reads) {
    CHECK(ev.status == FL_ERR_LINK_LOST);
    cookies.insert(ev.cookie);
  }
  CHECK(cookies.size() == 6);
  CHECK(p.b->postRead(p.read(7, source, 0)) == PostResult::kNotConnected);
  p.fake->pauseDelivery(false);
  p.reader.pump();
  CHECK(p.reader.reads.size() == 6);  // none twice
}

TEST_CASE("rdma read: a failed link keeps its sources' memory until it is torn down", "[rdma][read]") {
  ReadPath p;
  auto kept = std::make_shared<int>(1);
  REQUIRE(p.a->exposeSource(LocalSource{31, p.src.data, 1000, kept}).ok());
  p.a->flush();
  p.owner.pump();
  CHECK(kept.use_count() > 1);
  p.fake->injectAsyncEvent("fake_a", IBV_EVENT_QP_FATAL, p.ra()->cmId()->qp);
  until(p.owner, p.reader, [&] { return !p.owner.errors.empty(); });
  // The agent retracts what it offered once the link is down; the window
  // stays bound on the QP in error, and the memory under it stays mapped.
  p.a->retractSource(31);
  p.owner.pump();
  CHECK(kept.use_count() > 1);
  p.a->shutdown();
  CHECK(kept.use_count() == 1);
}

}  // namespace framelink::transport::rdma::testing
