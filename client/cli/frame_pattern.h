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
// Metadata: group_id = frame_id / 25, attrs = "frame=<frame_id>;wafer=<group_id>" (ASCII),
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

#if defined(__x86_64__) && defined(__GNUC__) && !defined(FRAMELINK_PATTERN_SCALAR_ONLY)
#include <immintrin.h>
#define FRAMELINK_PATTERN_AVX2 1
#endif

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

#ifdef FRAMELINK_PATTERN_AVX2
namespace detail {
// AVX2 has no 64-bit multiply: lo64(a * c) = lo(a)lo(c) + ((hi(a)lo(c) + lo(a)hi(c)) << 32).
__attribute__((target("avx2"))) inline __m256i mul64(__m256i a, __m256i c_lo, __m256i c_hi) noexcept {
  const __m256i ll = _mm256_mul_epu32(a, c_lo);
  const __m256i hl = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), c_lo);
  const __m256i lh = _mm256_mul_epu32(a, c_hi);
  return _mm256_add_epi64(ll, _mm256_slli_epi64(_mm256_add_epi64(hl, lh), 32));
}

// Words [first, first + 4*n) of the frame whose base is `base`, four per step.
__attribute__((target("avx2"))) inline void fillWordsAvx2(uint64_t base, uint64_t first, unsigned char* out,
                                                          size_t n) noexcept {
  const __m256i m1_lo = _mm256_set1_epi64x(0xBF58476D1CE4E5B9ull & 0xFFFFFFFFull);
  const __m256i m1_hi = _mm256_set1_epi64x(0xBF58476D1CE4E5B9ull >> 32);
  const __m256i m2_lo = _mm256_set1_epi64x(0x94D049BB133111EBull & 0xFFFFFFFFull);
  const __m256i m2_hi = _mm256_set1_epi64x(0x94D049BB133111EBull >> 32);
  const __m256i step = _mm256_set1_epi64x(4);
  const uint64_t s0 = base + first + kGolden;
  // Lane values wrap modulo 2^64 first, then are handed over bit for bit.
  const uint64_t s1 = s0 + 1;
  const uint64_t s2 = s0 + 2;
  const uint64_t s3 = s0 + 3;
  __m256i x = _mm256_set_epi64x(static_cast<long long>(s3), static_cast<long long>(s2),
                                static_cast<long long>(s1), static_cast<long long>(s0));
  for (size_t k = 0; k < n; ++k) {
    __m256i z = x;
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), m1_lo, m1_hi);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), m2_lo, m2_hi);
    z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k * 32), z);
    x = _mm256_add_epi64(x, step);
  }
}

inline bool haveAvx2() noexcept {
  static const bool kHave = __builtin_cpu_supports("avx2");
  return kHave;
}
}  // namespace detail
#endif

// Writes the payload of `frame_id` into buf[0, len).
inline void fillPattern(uint64_t frame_id, void* buf, size_t len) noexcept {
  auto* out = static_cast<unsigned char*>(buf);
  const uint64_t base = frame_id * kGolden;
  const size_t words = len / 8;
  size_t i = 0;
#ifdef FRAMELINK_PATTERN_AVX2
  if (words >= 16 && detail::haveAvx2()) {
    const size_t blocks = words / 4;
    detail::fillWordsAvx2(base, 0, out, blocks);  // x86 is little-endian: no byte swap
    i = blocks * 4;
  }
#endif
  // Four independent chains keep the multipliers busy; memcpy keeps unaligned buffers legal.
  for (; i + 4 <= words; i += 4) {
    uint64_t w[4] = {toLittleEndian(splitmix64(base + i)), toLittleEndian(splitmix64(base + i + 1)),
                     toLittleEndian(splitmix64(base + i + 2)), toLittleEndian(splitmix64(base + i + 3))};
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
#ifdef FRAMELINK_PATTERN_AVX2
  if (words >= 16 && detail::haveAvx2()) {
    // Generate 4 KiB of expected payload at a time and compare with memcmp; the exact byte of a
    // mismatch is found by the scalar loops below, starting at the chunk that differs.
    alignas(32) unsigned char expect[4096];
    constexpr size_t kChunkWords = sizeof expect / 8;
    while (i + kChunkWords <= words) {
      detail::fillWordsAvx2(base, i, expect, kChunkWords / 4);
      if (std::memcmp(in + i * 8, expect, sizeof expect) != 0) break;
      i += kChunkWords;
    }
  }
#endif
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
