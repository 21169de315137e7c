// The tcp transport's receiving side (tcp_receive.cpp): a burst of small
// frames is read with one call per staging buffer, not one a frame; a large
// payload goes straight into its buffer past the first staged bytes; frames
// that straddle the staging buffer's end arrive whole.
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "tcp_socket_pair.h"
#include "transport/tcp/tcp_transport.h"
#include "transport_test_util.h"

namespace framelink::transport::tcp {
namespace {

struct StagePair {
  std::unique_ptr<TcpTransport> a;
  std::unique_ptr<TcpTransport> b;
};

StagePair makeStagePair(size_t stage_bytes) {
  testing::g_pair = nullptr;  // no registered memory here
  auto [x, y] = testing::socketPair(4 << 20);
  TcpTransportOptions receiving;
  receiving.stage_bytes = stage_bytes;
  auto a = TcpTransport::make(std::move(x), "a");
  auto b = TcpTransport::make(std::move(y), "b", receiving);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  return StagePair{std::move(a).value(), std::move(b).value()};
}

// Sends frames of `sizes` from a to b in one flush, waits for every arrival,
// and checks each payload; returns b's socket counters.
TcpTransport::SocketCounters sendAndCheck(StagePair& p, const std::vector<size_t>& sizes) {
  std::vector<testing::Buffer> bufs;
  std::vector<testing::Payload> payloads;
  bufs.reserve(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    bufs.emplace_back(sizes[i]);
    payloads.push_back(testing::pattern(i + 7, sizes[i]));
    RemoteCredit credit = testing::expose(*p.b, bufs.back().credit(i + 1));
    REQUIRE(p.a->post(testing::request(i, credit, payloads.back(), i + 1)) == PostResult::kOk);
  }
  p.a->flush();
  testing::Endpoint a{p.a.get()};
  testing::Endpoint b{p.b.get()};
  testing::waitFor(
      a, b, [&] { return a.sends.size() == sizes.size() && b.arrivals.size() == sizes.size(); },
      "every frame");
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("frame " << i << " of " << sizes[i] << " bytes");
    CHECK(b.arrivals[i].status == FL_OK);
    CHECK(testing::firstMismatch(bufs[i].data(), payloads[i]) == -1);
  }
  return p.b->socketCounters();
}

}  // namespace

TEST_CASE("tcp: a burst of small frames is read a staging buffer at a time, not a call each",
          "[transport][tcp][stage]") {
  const std::vector<size_t> sizes(32, 512);  // 32 frames in 18 KiB on the wire
  StagePair staged = makeStagePair(32 << 10);
  const auto with = sendAndCheck(staged, sizes);
  StagePair direct = makeStagePair(0);  // the baseline: no staging
  const auto without = sendAndCheck(direct, sizes);
  INFO("reads with staging " << with.reads << ", without " << without.reads);
  CHECK(without.reads >= 32);
  CHECK(with.reads <= 4);
  CHECK(with.staged_reads == with.reads);
  CHECK(without.staged_reads == 0);
}

TEST_CASE("tcp: a large payload is read straight into its buffer past the staged bytes",
          "[transport][tcp][stage]") {
  StagePair p = makeStagePair(32 << 10);
  const auto counters = sendAndCheck(p, {1 << 20});
  // The header and the first staged bytes, then the rest in reads of its own:
  // 1 MiB through the staging buffer would take 32 staged reads.
  CHECK(counters.staged_reads <= 2);
  CHECK(counters.reads > counters.staged_reads);
}

TEST_CASE("tcp: frames of every size across the staging buffer's end arrive whole",
          "[transport][tcp][stage]") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<size_t> size(0, 40 << 10);
  std::vector<size_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back(size(rng));
  sizes.push_back(8 << 10);  // exactly the staging buffer
  sizes.push_back((8 << 10) - 64);
  sizes.push_back(1);
  StagePair p = makeStagePair(8 << 10);
  const auto counters = sendAndCheck(p, sizes);
  CHECK(counters.staged_reads > 0);
  CHECK(counters.reads > counters.staged_reads);  // the large ones' rests went straight in
}

}  // namespace framelink::transport::tcp
