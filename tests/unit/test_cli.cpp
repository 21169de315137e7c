// The synthetic frame definition (client/cli/frame_pattern.h) that send/recv, demo, bench and the
// integration tests share, the CLI's size parsing, and how `bench` reads ucx_perftest's output.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "bench_sockperf.h"
#include "bench_ucx.h"
#include "cli_util.h"
#include "frame_pattern.h"

using namespace framelink;

TEST_CASE("pattern: word i of frame f is splitmix64(f * golden + i), little-endian") {
  unsigned char buf[16];
  pattern::fillPattern(0, buf, sizeof buf);
  // Word 0 of frame 0 is the first output of the reference SplitMix64 seeded with 0.
  const unsigned char w0[8] = {0xaf, 0xcd, 0x1d, 0x7b, 0x39, 0xa8, 0x20, 0xe2};
  CHECK(std::memcmp(buf, w0, 8) == 0);
  // Word i is counter-based (state = f * golden + i), not the generator's (i+1)-th output.
  auto reference = [](uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  uint64_t w1 = 0;
  std::memcpy(&w1, buf + 8, 8);
  CHECK(w1 == reference(1));
  CHECK(pattern::splitmix64(7 * pattern::kGolden + 3) == pattern::patternWord(7, 3));
}

TEST_CASE("pattern: fill and verify agree for every length and alignment; a flipped byte is located") {
  std::vector<unsigned char> buf(5000 + 16);
  for (size_t len : {0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 4096, 5000}) {
    for (size_t align = 0; align < 8; ++align) {
      unsigned char* p = buf.data() + align;
      pattern::fillPattern(12345, p, len);
      REQUIRE(pattern::verifyPattern(12345, p, len) == pattern::kNpos);
      if (len == 0) continue;
      CHECK(pattern::verifyPattern(12346, p, len) != pattern::kNpos);
      for (size_t off : {size_t{0}, len / 2, len - 1}) {
        p[off] ^= 0x10;
        CHECK(pattern::verifyPattern(12345, p, len) == off);
        p[off] ^= 0x10;
      }
    }
  }
}

TEST_CASE("pattern: the tail of a frame is a prefix of the full word") {
  unsigned char a[13], b[16];
  pattern::fillPattern(9, a, sizeof a);
  pattern::fillPattern(9, b, sizeof b);
  CHECK(std::memcmp(a, b, sizeof a) == 0);
}

TEST_CASE("pattern: metadata") {
  CHECK(pattern::waferOf(0) == 0);
  CHECK(pattern::waferOf(24) == 0);
  CHECK(pattern::waferOf(25) == 1);
  CHECK(pattern::makeAttrs(51) == "frame=51;wafer=2");
}

TEST_CASE("pattern: random sizes depend only on (seed, frame id), whatever order they are asked in") {
  pattern::SizeSequence forward(1, 8u << 20, 42);
  std::vector<uint64_t> sizes;
  for (uint64_t i = 0; i < 100; ++i) sizes.push_back(forward.sizeOf(i));
  pattern::SizeSequence backward(1, 8u << 20, 42);
  for (uint64_t i = 100; i-- > 0;) CHECK(backward.sizeOf(i) == sizes[i]);
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<uint64_t> dist(1, 8u << 20);
  for (uint64_t i = 0; i < 100; ++i) CHECK(dist(rng) == sizes[i]);
  for (uint64_t s : sizes) CHECK((s >= 1 && s <= (8u << 20)));
  pattern::SizeSequence fixed(4096);
  CHECK(fixed.sizeOf(77) == 4096);
}

TEST_CASE("cli: sizes with binary suffixes") {
  using cli::parseSize;
  CHECK(parseSize("4096") == 4096u);
  CHECK(parseSize("64K") == 65536u);
  CHECK(parseSize("64KiB") == 65536u);
  CHECK(parseSize("1m") == 1048576u);
  CHECK(parseSize("1.5M") == 1572864u);
  CHECK(parseSize("2G") == (2ull << 30));
  CHECK(parseSize("8MB") == (8ull << 20));
  CHECK_FALSE(parseSize(""));
  CHECK_FALSE(parseSize("K"));
  CHECK_FALSE(parseSize("-1"));
  CHECK_FALSE(parseSize("12Q"));
  CHECK_FALSE(parseSize("99999999999999999999"));
  CHECK(cli::parseSizeRange("1:8M") == std::make_pair(uint64_t{1}, uint64_t{8} << 20));
  CHECK_FALSE(cli::parseSizeRange("8M:1"));
  CHECK_FALSE(cli::parseSizeRange("8M"));
  CHECK(cli::parseSizeList("64K,1M,4M") == std::vector<uint64_t>{65536, 1048576, 4194304});
  CHECK_FALSE(cli::parseSizeList("64K,,x"));
}

TEST_CASE("cli: nearest-rank percentiles") {
  std::vector<double> v = {5, 1, 4, 2, 3};
  CHECK(cli::percentile(v, 50) == 3);
  CHECK(cli::percentile(v, 99) == 5);
  CHECK(cli::percentile(v, 0) == 1);
  std::vector<double> empty;
  CHECK(cli::percentile(empty, 50) == 0);
}

TEST_CASE("pattern: the vectorised fill equals the word-by-word definition") {
  std::vector<unsigned char> buf(70000 + 8);
  for (uint64_t frame : {uint64_t{0}, uint64_t{1}, uint64_t{25}, uint64_t{1} << 40, ~uint64_t{0}}) {
    for (size_t len : {size_t{127}, size_t{128}, size_t{129}, size_t{70000}}) {
      unsigned char* p = buf.data() + (frame & 7);
      pattern::fillPattern(frame, p, len);
      for (size_t i = 0; i < len / 8; ++i) {
        uint64_t w = 0;
        std::memcpy(&w, p + i * 8, 8);
        if (w != pattern::patternWord(frame, i)) {
          FAIL("frame " << frame << " len " << len << " word " << i);
        }
      }
      CHECK(pattern::verifyPattern(frame, p, len) == pattern::kNpos);
    }
  }
}

TEST_CASE("bench: ucx_perftest's progress and final lines (ucx-utils 1.13), nothing else") {
  cli::UcxReport r;
  REQUIRE(
      cli::parseUcxReport("[thread 0]            493435      3.552     4.217     4.055      926.28     "
                          "963.40      237128      246629",
                          r));
  CHECK_FALSE(r.final);
  CHECK(r.iterations == 493435);
  CHECK(r.percentile_us == Approx(3.552));
  CHECK(r.bw_overall == Approx(963.40));
  CHECK(r.rate_overall == 246629);
  REQUIRE(
      cli::parseUcxReport("Final:                 20000      4.872     5.640     5.640      692.59     "
                          "692.59      177303      177303",
                          r));
  CHECK(r.final);
  CHECK(r.iterations == 20000);
  CHECK(r.percentile_us == Approx(4.872));
  CHECK(r.avg_us == Approx(5.640));
  CHECK(r.rate_avg == 177303);
  for (const char* other :
       {"|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  "
        "overall  |",
        "+--------------+--------------+----------+---------+---------+----------+----------+-----------+",
        "Waiting for connection...", "Final:  20000  4.872  (truncated)",
        "[1795538170.248004] [vm:305  :0]  select.c:549  UCX  ERROR   no auxiliary transport", ""}) {
    CAPTURE(other);
    CHECK_FALSE(cli::parseUcxReport(other, r));
  }
}

TEST_CASE("bench: sockperf's percentile lines (sockperf 3.7), nothing else") {
  double pct = 0, us = 0;
  REQUIRE(cli::parseSockperfPercentile("sockperf: ---> percentile 50.000 =   40.745", pct, us));
  CHECK(pct == 50);
  CHECK(us == Approx(40.745));
  REQUIRE(cli::parseSockperfPercentile("sockperf: ---> percentile 99.000 =   68.863", pct, us));
  CHECK(pct == 99);
  CHECK(us == Approx(68.863));
  for (const char* other :
       {"sockperf: ---> <MAX> observation = 1486.584", "sockperf: ---> <MIN> observation =    8.250",
        "sockperf: Summary: Latency is 43.456 usec", "sockperf: ---> percentile (truncated)",
        "sockperf: \x1b[2;35m====> avg-latency=43.456 (std-dev=20.119)\x1b[0m", ""}) {
    CAPTURE(other);
    CHECK_FALSE(cli::parseSockperfPercentile(other, pct, us));
  }
}

TEST_CASE("bench: sockperf against its own server on 127.0.0.1 gives a one-way latency") {
  if (cli::sockperfPath().empty()) FAIL(cli::kSockperfMissing);
  const cli::LatencyResult r = cli::sockperfOneWay(4096, 1);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(r.samples > 100);
  CHECK(r.p50_us > 0);
  CHECK(r.p99_us >= r.p50_us);
}

TEST_CASE("recv: a frame id is known again until 4096 others came after it") {
  framelink::cli::RecentFrameIds recent;
  REQUIRE_FALSE(recent.seenBefore(7));
  REQUIRE(recent.seenBefore(7));  // a restarted daemon's redelivery of frame 7
  for (uint64_t id = 100; id < 100 + framelink::cli::RecentFrameIds::kRemembered - 1; ++id) {
    REQUIRE_FALSE(recent.seenBefore(id));
  }
  REQUIRE(recent.seenBefore(7));         // the 4095 later ones leave it remembered
  REQUIRE_FALSE(recent.seenBefore(99));  // the 4096th pushes frame 7 out
  REQUIRE_FALSE(recent.seenBefore(7));
  REQUIRE(recent.seenBefore(99));
}
