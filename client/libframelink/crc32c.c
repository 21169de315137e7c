/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as framelinkd and
 * every client compute it.  The seed is a previous result, so a CRC can be
 * built up over pieces: fl_crc32c(fl_crc32c(0, a), b) == fl_crc32c(0, a||b).
 *
 * SSE4.2 is chosen at run time: the library must also run on baseline x86-64
 * (no -march flags anywhere), so the instruction is only used through a
 * target attribute behind __builtin_cpu_supports.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "crc32c_internal.h"
#include "framelink/framelink.h"

#if defined(__x86_64__) || defined(__i386__)
#define FL_CRC_HAVE_X86 1
#include <nmmintrin.h>
#else
#define FL_CRC_HAVE_X86 0
#endif

#define FL_CRC32C_POLY 0x82F63B78u

typedef uint32_t (*fl_crc_fn)(uint32_t, const void*, size_t);

static uint32_t g_table[8][256];
static fl_crc_fn g_impl = fl_crc32c_sw;
static int g_hw_available;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void fl_crc32c_init(void) {
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int j = 0; j < 8; ++j) crc = (crc & 1u) ? (crc >> 1) ^ FL_CRC32C_POLY : crc >> 1;
    g_table[0][i] = crc;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int k = 1; k < 8; ++k)
      g_table[k][i] = (g_table[k - 1][i] >> 8) ^ g_table[0][g_table[k - 1][i] & 0xFFu];
  }
#if FL_CRC_HAVE_X86
  __builtin_cpu_init();
  g_hw_available = __builtin_cpu_supports("sse4.2") ? 1 : 0;
  if (g_hw_available) g_impl = fl_crc32c_hw;
#endif
}

uint32_t fl_crc32c_sw(uint32_t seed, const void* data, size_t length) {
  pthread_once(&g_once, fl_crc32c_init);
  const uint8_t* p = (const uint8_t*)data;
  uint32_t crc = ~seed;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  while (length >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= crc;
    crc = g_table[7][w & 0xFFu] ^ g_table[6][(w >> 8) & 0xFFu] ^ g_table[5][(w >> 16) & 0xFFu] ^
          g_table[4][(w >> 24) & 0xFFu] ^ g_table[3][(w >> 32) & 0xFFu] ^ g_table[2][(w >> 40) & 0xFFu] ^
          g_table[1][(w >> 48) & 0xFFu] ^ g_table[0][w >> 56];
    p += 8;
    length -= 8;
  }
#endif
  while (length--) crc = g_table[0][(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

int fl_crc32c_hw_available(void) {
  pthread_once(&g_once, fl_crc32c_init);
  return g_hw_available;
}

#if FL_CRC_HAVE_X86
__attribute__((target("sse4.2"))) uint32_t fl_crc32c_hw(uint32_t seed, const void* data, size_t length) {
  const uint8_t* p = (const uint8_t*)data;
  uint32_t crc32 = ~seed;
  while (length > 0 && ((uintptr_t)p & 7u) != 0) {
    crc32 = _mm_crc32_u8(crc32, *p++);
    --length;
  }
#if defined(__x86_64__)
  uint64_t crc = crc32;
  while (length >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    crc = _mm_crc32_u64(crc, w);
    p += 8;
    length -= 8;
  }
  crc32 = (uint32_t)crc;
#endif
  while (length >= 4) {
    uint32_t w;
    memcpy(&w, p, 4);
    crc32 = _mm_crc32_u32(crc32, w);
    p += 4;
    length -= 4;
  }
  while (length--) crc32 = _mm_crc32_u8(crc32, *p++);
  return ~crc32;
}
#else
uint32_t fl_crc32c_hw(uint32_t seed, const void* data, size_t length) {
  return fl_crc32c_sw(seed, data, length);
}
#endif

FL_API uint32_t fl_crc32c(uint32_t seed, const void* data, size_t length) {
  pthread_once(&g_once, fl_crc32c_init);
  return g_impl(seed, data, length);
}
