/*
 * Internal CRC32C entry points (not installed).  fl_crc32c() in framelink.h
 * dispatches between them at run time; the unit tests call both directly to
 * prove they agree.
 */
#ifndef FRAMELINK_CRC32C_INTERNAL_H
#define FRAMELINK_CRC32C_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Portable slicing-by-8 table implementation. */
uint32_t fl_crc32c_sw(uint32_t seed, const void* data, size_t length);

/* 1 when this CPU has the SSE4.2 crc32 instruction (fl_crc32c_hw may be called). */
int fl_crc32c_hw_available(void);

/* SSE4.2 implementation.  Only call it when fl_crc32c_hw_available() is 1;
 * on other architectures it falls back to fl_crc32c_sw. */
uint32_t fl_crc32c_hw(uint32_t seed, const void* data, size_t length);

#ifdef __cplusplus
}
#endif

#endif /* FRAMELINK_CRC32C_INTERNAL_H */
