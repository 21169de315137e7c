// The Transport conformance suite (transport_conformance.h), pull: a read
// lands exactly the bytes of the source the peer exposed, any number of
// reads of one source and of many sources complete exactly once each,
// alongside frames and control records in both directions; a read of a
// source the peer does not have fails without breaking the link; malformed
// reads are refused, reads beyond the bound wait, and outstanding reads end
// with the link.
//
// FL_READ_TRANSPORTS: every transport reads.  One that does not implement
// pull keeps Transport's defaults and says so (readable() false,
// exposeSource and postRead refused), which the last test pins down.  Built
// for rdma too (FL_CONFORMANCE_RDMA, the Soft-RoCE lane), where a read the
// owner's adapter refuses breaks the link instead of failing alone: that
// test is the byte streams' only.
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/link_bookkeeping.h"
#include "transport/transport.h"
#include "transport_conformance.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {

#ifdef FL_CONFORMANCE_RDMA
#define FL_READ_TRANSPORTS Rdma
#else
#define FL_READ_TRANSPORTS Tcp, Grpc, GrpcSmallChunk, FaultyTcp, Loopback
#endif

namespace {

// A payload exposed as a source on `t` under `id`.
RemoteSource exposeSource(Transport& t, uint64_t id, const Payload& payload) {
  LocalSource source;
  source.source_id = id;
  source.payload = payload.data();
  source.length = payload.size();
  auto r = t.exposeSource(source);
  if (!r) FAIL("exposeSource(" << id << "): " << r.error().message);
  t.flush();
  return r.value();
}

// Exposes `payload` on the owner and tells the reader the way the daemon
// does: in a control record the owner posts after the exposure (its offer).
// On rdma the window's bind is on the owner's send queue ahead of that
// record, so the reader cannot learn the key before the window is up.
RemoteSource offer(Endpoint& owner, Endpoint& reader, uint64_t id, const Payload& payload) {
  const RemoteSource source = exposeSource(*owner.t, id, payload);
  const std::string record = "offer " + std::to_string(id);
  REQUIRE(owner.t->postControl(record) == PostResult::kOk);
  waitFor(
      owner, reader, [&] { return !reader.controls.empty() && reader.controls.back() == record; },
      "the offer");
  reader.controls.pop_back();
  return source;
}

ReadRequest readInto(uint64_t cookie, const RemoteSource& source, const Buffer& buffer) {
  ReadRequest r;
  r.cookie = cookie;
  r.source = source;
  r.buffer = buffer.data();
  r.capacity = buffer.size();
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("a read lands the source's bytes in the reader's buffer", "[transport][read]",
                   FL_READ_TRANSPORTS) {
  auto pair = makePair<TestType>();
  REQUIRE(pair->a->readable());
  REQUIRE(pair->b->readable());
  uint64_t id = 1;
  for (int dir = 0; dir < 2; ++dir) {
    Endpoint owner{dir == 0 ? pair->a.get() : pair->b.get()};
    Endpoint reader{dir == 0 ? pair->b.get() : pair->a.get()};
    for (size_t size : {size_t{0}, size_t{1}, size_t{4097}, size_t{1} << 20, size_t{8} << 20}) {
      CAPTURE(dir, size);
      auto payload = pattern(100 + id, size);
      const RemoteSource source = offer(owner, reader, id, payload);
      CHECK(source.source_id == id);
      CHECK(source.length == size);
      Buffer buf(size + 64);
      reader.reads.clear();
      REQUIRE(reader.postRead(readInto(0xEAD0 + id, source, buf)) == PostResult::kOk);
      waitFor(
          owner, reader, [&] { return !reader.reads.empty(); }, "read completion");
      REQUIRE(reader.reads.size() == 1);
      CHECK(reader.reads[0].cookie == 0xEAD0 + id);
      CHECK(reader.reads[0].status == FL_OK);
      CHECK(firstMismatch(buf.data(), payload) == -1);
      CHECK(buf.data()[size] == 0xEE);  // nothing past the source's length
      owner.t->retractSource(id);
      ++id;
    }
    CHECK(owner.errors.empty());
    CHECK(reader.errors.empty());
    CHECK(owner.sends.empty());
    CHECK(owner.arrivals.empty());
  }
  const TransportCounters ca = pair->a->counters();
  const TransportCounters cb = pair->b->counters();
  CHECK(ca.reads_completed == 5);
  CHECK(cb.reads_completed == 5);
  if (TestType::kKind != TransportKind::kRdma) {  // an RDMA READ responder is the adapter: nothing counts
    CHECK(ca.reads_served == 5);
    CHECK(cb.reads_served == 5);
  }
  const uint64_t bytes = 0 + 1 + 4097 + (1 << 20) + (8 << 20);
  CHECK(ca.bytes_read == bytes);
  CHECK(cb.bytes_read == bytes);
  CHECK(ca.unknown_source_reads + cb.unknown_source_reads == 0);
}

TEMPLATE_TEST_CASE("one source is read by several reads in flight together", "[transport][read]",
                   FL_READ_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint owner{pair->a.get()}, reader{pair->b.get()};
  auto payload = pattern(7, 300'000);
  const RemoteSource source = offer(owner, reader, 77, payload);
  std::vector<Buffer> bufs;
  for (int i = 0; i < 4; ++i) bufs.emplace_back(300'000);
  for (int i = 0; i < 4; ++i) REQUIRE(reader.postRead(readInto(i, source, bufs[i])) == PostResult::kOk);
  waitFor(
      owner, reader, [&] { return reader.reads.size() == 4; }, "four reads");
  std::set<uint64_t> cookies;
  for (const auto& ev : reader.reads) {
    CHECK(ev.status == FL_OK);
    cookies.insert(ev.cookie);
  }
  CHECK(cookies == std::set<uint64_t>{0, 1, 2, 3});
  for (const auto& b : bufs) CHECK(firstMismatch(b.data(), payload) == -1);
  settle(owner, reader);
  CHECK(reader.reads.size() == 4);  // none twice
}

TEMPLATE_TEST_CASE("reads, frames and control records share the link both ways", "[transport][read]",
                   FL_READ_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint a{pair->a.get()}, b{pair->b.get()};
  constexpr size_t kSources = 40;
  // a exposes sources and receives frames; b reads the sources and sends frames, and both
  // send control records.
  std::vector<Payload> payloads;
  std::vector<RemoteSource> sources;
  for (size_t i = 0; i < kSources; ++i) {
    payloads.push_back(pattern(500 + i, 1000 + i * 7919));
    sources.push_back(offer(a, b, 1000 + i, payloads.back()));
  }
  std::vector<Buffer> read_bufs, frame_bufs;
  std::vector<Payload> frames;
  for (size_t i = 0; i < kSources; ++i) {
    read_bufs.emplace_back(payloads[i].size());
    frame_bufs.emplace_back(4096);
    frames.push_back(pattern(900 + i, 4096));
  }
  std::vector<RemoteCredit> credits;
  size_t granted = 0, sent = 0;
  std::map<uint64_t, int> reads_seen;
  waitFor(
      a, b,
      [&] {
        // a grants a credit a frame, a few a round, each in a record posted after its exposure.
        for (int k = 0; k < 3 && granted < kSources; ++k, ++granted) {
          credits.push_back(expose(*a.t, frame_bufs[granted].credit(granted + 1)));
          REQUIRE(a.t->postControl(controlRecord(granted, 100)) == PostResult::kOk);
        }
        // b, once grant i arrived, reads source i, sends frame i and answers with a record.
        for (; sent < b.controls.size() && sent < kSources; ++sent) {
          REQUIRE(b.postRead(readInto(sent, sources[sent], read_bufs[sent])) == PostResult::kOk);
          REQUIRE(b.post(request(sent, credits[sent], frames[sent], sent + 1)) == PostResult::kOk);
          REQUIRE(b.t->postControl(controlRecord(1000 + sent, 100)) == PostResult::kOk);
        }
        return sent == kSources && b.reads.size() == kSources && a.arrivals.size() == kSources &&
               a.controls.size() == kSources;
      },
      "every read, frame and record");
  settle(a, b);
  REQUIRE(b.reads.size() == kSources);
  for (const auto& ev : b.reads) {
    CHECK(ev.status == FL_OK);
    ++reads_seen[ev.cookie];
  }
  CHECK(reads_seen.size() == kSources);
  for (size_t i = 0; i < kSources; ++i) {
    CAPTURE(i);
    CHECK(firstMismatch(read_bufs[i].data(), payloads[i]) == -1);
    CHECK(firstMismatch(frame_bufs[i].data(), frames[i]) == -1);
    CHECK(b.controls[i] == controlRecord(i, 100));  // a posted them
    CHECK(a.controls[i] == controlRecord(1000 + i, 100));
  }
  CHECK(a.errors.empty());
  CHECK(b.errors.empty());
}

#ifndef FL_CONFORMANCE_RDMA
TEMPLATE_TEST_CASE("a read of a source the peer does not have fails and the link stays up",
                   "[transport][read]", FL_READ_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint owner{pair->a.get()}, reader{pair->b.get()};
  auto payload = pattern(3, 10'000);
  const RemoteSource source = exposeSource(*owner.t, 5, payload);
  Buffer buf(20'000);

  // Never exposed.
  RemoteSource unknown = source;
  unknown.source_id = 6;
  REQUIRE(reader.postRead(readInto(1, unknown, buf)) == PostResult::kOk);
  // More bytes than the source holds.
  RemoteSource longer = source;
  longer.length = 10'001;
  REQUIRE(reader.postRead(readInto(2, longer, buf)) == PostResult::kOk);
  waitFor(
      owner, reader, [&] { return reader.reads.size() == 2; }, "two failed reads");
  for (const auto& ev : reader.reads) {
    CAPTURE(ev.cookie, ev.message);
    CHECK(ev.status == FL_ERR_UNKNOWN_CREDIT);
    CHECK_FALSE(ev.message.empty());
  }
  CHECK(buf.data()[0] == 0xEE);  // nothing landed

  // Retracted.
  owner.t->retractSource(5);
  REQUIRE(reader.postRead(readInto(3, source, buf)) == PostResult::kOk);
  waitFor(
      owner, reader, [&] { return reader.reads.size() == 3; }, "a read of a retracted source");
  CHECK(reader.reads[2].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(buf.data()[0] == 0xEE);

  // The link is up: the source exposed again (a new offer) is read whole.
  const RemoteSource again = offer(owner, reader, 5, payload);
  REQUIRE(reader.postRead(readInto(4, again, buf)) == PostResult::kOk);
  waitFor(
      owner, reader, [&] { return reader.reads.size() == 4; }, "a good read");
  CHECK(reader.reads[3].status == FL_OK);
  CHECK(firstMismatch(buf.data(), payload) == -1);
  CHECK(owner.errors.empty());
  CHECK(reader.errors.empty());
  CHECK(owner.t->counters().unknown_source_reads == 3);
  CHECK(owner.t->counters().reads_served == 1);
  CHECK(reader.t->counters().reads_completed == 1);
}

#endif  // FL_CONFORMANCE_RDMA

TEMPLATE_TEST_CASE("malformed reads and sources are refused and nothing is read", "[transport][read]",
                   FL_READ_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint owner{pair->a.get()}, reader{pair->b.get()};
  auto payload = pattern(11, 5000);
  const RemoteSource source = exposeSource(*owner.t, 9, payload);

  // The same id twice.
  LocalSource twice{9, payload.data(), payload.size(), nullptr};
  auto again = owner.t->exposeSource(twice);
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().code == FL_EINVAL);
  // No memory behind a length.
  LocalSource hollow{10, nullptr, 100, nullptr};
  auto no_memory = owner.t->exposeSource(hollow);
  REQUIRE_FALSE(no_memory.ok());
  CHECK(no_memory.error().code == FL_EINVAL);

  Buffer small(4999);
  CHECK(reader.postRead(readInto(1, source, small)) == PostResult::kInvalid);
  CHECK(std::string(reader.t->lastRefusal()).find("larger than") != std::string::npos);
  ReadRequest nowhere = readInto(2, source, small);
  nowhere.buffer = nullptr;
  nowhere.capacity = 5000;
  CHECK(reader.postRead(nowhere) == PostResult::kInvalid);
  CHECK(std::string(reader.t->lastRefusal()).find("null buffer") != std::string::npos);
  settle(owner, reader);
  CHECK(reader.reads.empty());
  CHECK(owner.t->counters().reads_served == 0);
  CHECK(owner.errors.empty());
  CHECK(reader.errors.empty());
}

TEMPLATE_TEST_CASE("reads beyond the bound wait their turn", "[transport][read]", FL_READ_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint owner{pair->a.get()}, reader{pair->b.get()};
  auto payload = pattern(13, 2048);
  const RemoteSource source = offer(owner, reader, 1, payload);
  // Far past the bound: grpc's reader thread completes reads while they are posted, and with only
  // a few dozen to spare it could complete them all before one was refused (seen under ASan).
  constexpr size_t kWanted = kMaxReadsOutstanding * 16;
  std::vector<Buffer> bufs;
  for (size_t i = 0; i < kWanted; ++i) bufs.emplace_back(2048);
  size_t posted = 0;
  size_t refused = 0;
  const uint64_t backpressure_before = reader.t->counters().backpressure;
  // Posted without polling: the bound is reached and the rest is refused.
  for (; posted < kWanted; ++posted) {
    const PostResult r = reader.postRead(readInto(posted, source, bufs[posted]));
    if (r == PostResult::kBackpressure) {
      ++refused;
      break;
    }
    REQUIRE(r == PostResult::kOk);
  }
  // Exactly the bound where reads complete only in poll() (tcp, loopback);
  // grpc's reader thread completes them meanwhile, and each one that did
  // (counted by now) made room for one more.
  CHECK(posted >= kMaxReadsOutstanding);
  CHECK(posted <= kMaxReadsOutstanding + reader.t->counters().reads_completed);
  CHECK(refused == 1);
  CHECK(reader.t->counters().backpressure == backpressure_before + 1);
  // The rest goes once earlier reads completed.
  waitFor(
      owner, reader,
      [&] {
        while (posted < kWanted &&
               reader.postRead(readInto(posted, source, bufs[posted])) == PostResult::kOk) {
          ++posted;
        }
        return reader.reads.size() == kWanted;
      },
      "every read");
  std::set<uint64_t> cookies;
  for (const auto& ev : reader.reads) {
    CHECK(ev.status == FL_OK);
    cookies.insert(ev.cookie);
  }
  CHECK(cookies.size() == kWanted);
  for (const auto& b : bufs) CHECK(firstMismatch(b.data(), payload) == -1);
  CHECK(owner.errors.empty());
  CHECK(reader.errors.empty());
}

TEMPLATE_TEST_CASE("outstanding reads end with the link, each once", "[transport][read]",
                   FL_READ_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint owner{pair->a.get()}, reader{pair->b.get()};
  auto payload = pattern(17, 1 << 20);
  const RemoteSource source = offer(owner, reader, 1, payload);
  std::vector<Buffer> bufs;
  for (int i = 0; i < 20; ++i) bufs.emplace_back(1 << 20);
  for (int i = 0; i < 20; ++i) REQUIRE(reader.postRead(readInto(i, source, bufs[i])) == PostResult::kOk);
  // The owner is not polled, so tcp and loopback never answer and the
  // reader's link goes first; grpc's owner answers on its own threads, and
  // a read it answered before the shutdown may have completed already.
  reader.t->shutdown();
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (reader.reads.size() < 20 && std::chrono::steady_clock::now() < deadline) {
    reader.pump();
    awaitEvents(reader, reader, 10);
  }
  REQUIRE(reader.reads.size() == 20);
  // Reads that completed before the LinkError did FL_OK, every one after it FL_ERR_LINK_LOST.
  size_t before_error = 0;
  for (Kind kind : reader.order) {
    if (kind == Kind::kLinkError) break;
    if (kind == Kind::kReadComplete) ++before_error;
  }
  std::set<uint64_t> cookies;
  for (size_t i = 0; i < reader.reads.size(); ++i) {
    CAPTURE(i, before_error);
    CHECK(reader.reads[i].status == (i < before_error ? FL_OK : FL_ERR_LINK_LOST));
    cookies.insert(reader.reads[i].cookie);
  }
  CHECK(cookies.size() == 20);
  CHECK(reader.errors.size() == 1);
  CHECK(reader.postRead(readInto(99, source, bufs[0])) == PostResult::kNotConnected);
  // The owner learns of the shutdown when it polls; after that its sources are refused.
  waitFor(
      owner, owner, [&] { return !owner.errors.empty(); }, "the owner's link error");
  auto refused = owner.t->exposeSource(LocalSource{3, payload.data(), payload.size(), nullptr});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == FL_ERR_LINK_LOST);
}

namespace {

// A transport that does not implement pull: everything else is beside the
// point here.
class NoPullTransport final : public Transport {
 public:
  const char* name() const noexcept override { return "nopull"; }
  bool connected() const noexcept override { return true; }
  Result<RemoteCredit> exposeCredit(LocalCredit credit) override {
    return RemoteCredit{credit.credit_id, credit.capacity, 0, 0};
  }
  void retractCredit(uint64_t) override {}
  PostResult post(const SendRequest&) noexcept override { return PostResult::kNotConnected; }
  PostResult postControl(std::string) noexcept override { return PostResult::kNotConnected; }
  size_t poll(TransportEvent*, size_t) noexcept override { return 0; }
  int eventFd() const noexcept override { return -1; }
  void shutdown() noexcept override {}
  TransportCounters counters() const noexcept override { return {}; }
};

}  // namespace

TEST_CASE("a transport that cannot read says so", "[transport][read]") {
  g_pair = nullptr;  // no pair: the buffers below register with nothing
  NoPullTransport t;
  CHECK_FALSE(t.readable());
  auto payload = pattern(1, 64);
  auto refused = t.exposeSource(LocalSource{1, payload.data(), payload.size(), nullptr});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == FL_ERR_TRANSPORT);
  CHECK(refused.error().message.find("cannot be read") != std::string::npos);
  CHECK(refused.error().message.find("nopull") != std::string::npos);
  t.retractSource(1);  // nothing to retract, and no harm done
  Buffer buf(64);
  CHECK(t.postRead(readInto(1, RemoteSource{1, 64, 0, 0}, buf)) == PostResult::kInvalid);
}

}  // namespace framelink::transport::testing
