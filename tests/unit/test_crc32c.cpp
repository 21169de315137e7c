// CRC32C: known answers, incremental seeding, and agreement between the
// SSE4.2 and table implementations (the daemon may use one while a client
// uses the other).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "crc32c_internal.h"
#include "framelink/framelink.h"

namespace {
uint32_t crcOf(const std::string& s) { return fl_crc32c(0, s.data(), s.size()); }
}  // namespace

TEST_CASE("crc32c check value", "[crc32c]") {
  CHECK(crcOf("123456789") == 0xE3069283u);
  CHECK(fl_crc32c_sw(0, "123456789", 9) == 0xE3069283u);
  if (fl_crc32c_hw_available()) CHECK(fl_crc32c_hw(0, "123456789", 9) == 0xE3069283u);
  CHECK(fl_crc32c(0, nullptr, 0) == 0u);
  CHECK(crcOf("a") == 0xC1D04330u);
}

TEST_CASE("crc32c RFC 3720 (iSCSI) test vectors", "[crc32c]") {
  std::vector<uint8_t> buf(32);
  std::memset(buf.data(), 0, buf.size());
  CHECK(fl_crc32c(0, buf.data(), buf.size()) == 0x8A9136AAu);
  std::memset(buf.data(), 0xFF, buf.size());
  CHECK(fl_crc32c(0, buf.data(), buf.size()) == 0x62A8AB43u);
  for (size_t i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  CHECK(fl_crc32c(0, buf.data(), buf.size()) == 0x46DD794Eu);
  for (size_t i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  CHECK(fl_crc32c(0, buf.data(), buf.size()) == 0x113FDB5Cu);
}

TEST_CASE("crc32c seeds chain over pieces", "[crc32c]") {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(333);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const uint32_t whole = fl_crc32c(0, buf.data(), buf.size());
  for (size_t split = 0; split <= buf.size(); ++split) {
    uint32_t a = fl_crc32c(0, buf.data(), split);
    REQUIRE(fl_crc32c(a, buf.data() + split, buf.size() - split) == whole);
    uint32_t sa = fl_crc32c_sw(0, buf.data(), split);
    REQUIRE(fl_crc32c_sw(sa, buf.data() + split, buf.size() - split) == whole);
  }
}

TEST_CASE("crc32c SSE4.2 and table implementations agree", "[crc32c]") {
  if (!fl_crc32c_hw_available()) {
    WARN("this CPU has no SSE4.2: only the table implementation is tested");
    return;
  }
  std::mt19937_64 rng(12345);
  std::vector<uint8_t> buf(1 << 20);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  // Every small length and alignment, then random large ones.
  for (size_t off = 0; off < 16; ++off) {
    for (size_t len = 0; len < 300; ++len) {
      uint32_t seed = static_cast<uint32_t>(rng());
      REQUIRE(fl_crc32c_hw(seed, buf.data() + off, len) == fl_crc32c_sw(seed, buf.data() + off, len));
    }
  }
  std::uniform_int_distribution<size_t> len_dist(0, buf.size() - 64);
  for (int i = 0; i < 200; ++i) {
    size_t off = rng() % 64;
    size_t len = len_dist(rng);
    REQUIRE(fl_crc32c_hw(0, buf.data() + off, len) == fl_crc32c_sw(0, buf.data() + off, len));
  }
  CHECK(fl_crc32c(0, buf.data(), buf.size()) == fl_crc32c_sw(0, buf.data(), buf.size()));
}
