// Synthetic frames shared by `framelink send/recv/demo/bench` and the integration tests.
//
// A frame's payload is a deterministic function of (frame_id, length) so that a receiver can
// check every byte without being told anything but the frame id:
//
//   word i (8 bytes, little-endian) = splitmix64(frame_id * 0x9E3779B97F4A7C15 + i)
//   the last partial word is truncated.
//
// splitmix64(x) is one step of the SplitMix64 generator whose state before the step is x:
//   z = x + 0x9E3779B97F4A7C15; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//   z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31).
//
// Metadata: wafer_id = frame_id / 25, attrs = "frame=<frame_id>;wafer=<wafer_id>" (ASCII),
// timestamp_ns = CLOCK_REALTIME at submit.
// Random sizes: std::mt19937_64(seed), std::uniform_int_distribution<uint64_t>(min, max),
// one draw per frame in frame_id order starting at frame 0 (a sender that starts at frame K
// discards the first K draws, so the size of a frame depends only on its id).
#ifndef FRAMELINK_CLI_FRAME_PATTERN_H
#define FRAMELINK_CLI_FRAME_PATTERN_H

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace framelink::pattern {

inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
inline constexpr uint64_t kFramesPerWafer = 25;
inline constexpr size_t kNpos = static_cast<size_t>(-1);

constexpr uint64_t splitmix64(uint64_t x) noexcept {
  uint64_t z = x + kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t toLittleEndian(uint64_t v) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    return v;
  } else {
    return __builtin_bswap64(v);
  }
}

constexpr uint64_t patternWord(uint64_t frame_id, uint64_t i) noexcept {
  return toLittleEndian(splitmix64(frame_id * kGolden + i));
}

// Writes the payload of `frame_id` into buf[0, len).  ~1 ns per 8-byte word.
inline void fillPattern(uint64_t frame_id, void* buf, size_t len) noexcept {
  auto* out = static_cast<unsigned char*>(buf);
  const uint64_t base = frame_id * kGolden;
  const size_t words = len / 8;
  size_t i = 0;
  // Four independent chains keep the multipliers busy; memcpy keeps unaligned buffers legal.
  for (; i + 4 <= words; i += 4) {
    uint64_t w[4] = {toLittleEndian(splitmix64(base + i)), toLittleEndian(splitmix64(base + i + 1)),
                     toLittleEndian(splitmix64(base + i + 2)),
                     toLittleEndian(splitmix64(base + i + 3))};
    std::memcpy(out + i * 8, w, sizeof w);
  }
  for (; i < words; ++i) {
    const uint64_t w = toLittleEndian(splitmix64(base + i));
    std::memcpy(out + i * 8, &w, 8);
  }
  const size_t tail = len - words * 8;
  if (tail != 0) {
    const uint64_t w = toLittleEndian(splitmix64(base + words));
    std::memcpy(out + words * 8, &w, tail);
  }
}

// Offset of the first byte of buf[0, len) that differs from the payload of `frame_id`, or kNpos.
inline size_t verifyPattern(uint64_t frame_id, const void* buf, size_t len) noexcept {
  const auto* in = static_cast<const unsigned char*>(buf);
  const uint64_t base = frame_id * kGolden;
  const size_t words = len / 8;
  auto firstDiff = [](uint64_t got, uint64_t want, size_t n) -> size_t {
    for (size_t b = 0; b < n; ++b) {
      if (reinterpret_cast<const unsigned char*>(&got)[b] !=
          reinterpret_cast<const unsigned char*>(&want)[b]) {
        return b;
      }
    }
    return kNpos;
  };
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    uint64_t got[4];
    std::memcpy(got, in + i * 8, sizeof got);
    const uint64_t d = (got[0] ^ toLittleEndian(splitmix64(base + i))) |
                       (got[1] ^ toLittleEndian(splitmix64(base + i + 1))) |
                       (got[2] ^ toLittleEndian(splitmix64(base + i + 2))) |
                       (got[3] ^ toLittleEndian(splitmix64(base + i + 3)));
    if (d != 0) break;  // locate the exact byte in the slow loop below
  }
  for (; i < words; ++i) {
    uint64_t got;
    std::memcpy(&got, in + i * 8, 8);
    const uint64_t want = toLittleEndian(splitmix64(base + i));
    if (got != want) return i * 8 + firstDiff(got, want, 8);
  }
  const size_t tail = len - words * 8;
  if (tail != 0) {
    uint64_t got = 0;
    std::memcpy(&got, in + words * 8, tail);
    const uint64_t want = toLittleEndian(splitmix64(base + words));
    const size_t b = firstDiff(got, want, tail);
    if (b != kNpos) return words * 8 + b;
  }
  return kNpos;
}

constexpr uint64_t waferOf(uint64_t frame_id) noexcept { return frame_id / kFramesPerWafer; }

inline std::string makeAttrs(uint64_t frame_id) {
  return "frame=" + std::to_string(frame_id) + ";wafer=" + std::to_string(waferOf(frame_id));
}

// Frame sizes of a --random-size MIN:MAX --seed S run, addressable by frame id.
class SizeSequence {
 public:
  // Fixed size: every frame is `size` bytes.
  explicit SizeSequence(uint64_t size) : min_(size), max_(size), random_(false) {}
  SizeSequence(uint64_t min, uint64_t max, uint64_t seed)
      : min_(min), max_(max), random_(true), rng_(seed), dist_(min, max) {}

  bool random() const noexcept { return random_; }
  uint64_t min() const noexcept { return min_; }
  uint64_t max() const noexcept { return max_; }

  // Size of `frame_id`; draws lazily so that ids may be asked for in any order.
  uint64_t sizeOf(uint64_t frame_id) {
    if (!random_) return min_;
    while (drawn_.size() <= frame_id) drawn_.push_back(dist_(rng_));
    return drawn_[frame_id];
  }

 private:
  uint64_t min_;
  uint64_t max_;
  bool random_;
  std::mt19937_64 rng_;
  std::uniform_int_distribution<uint64_t> dist_;
  std::vector<uint64_t> drawn_;
};

}  // namespace framelink::pattern

#endif  // FRAMELINK_CLI_FRAME_PATTERN_H
