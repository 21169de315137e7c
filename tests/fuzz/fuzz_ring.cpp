// libFuzzer target: the shared-memory ring as the daemon reads it, with
// indices and entries a hostile client wrote.  The ring memory is exactly
// header + capacity entries (the daemon's trusted geometry), so ASan reports
// any read or write outside it.  Invariants checked on every operation:
// pop copies only when tail - head is within capacity, never moves head past
// tail, and reports an impossible index pair as FL_RING_CORRUPT.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "framelink/shm_layout.h"
#include "framelink/shm_ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 18) return 0;
  // The daemon's trusted geometry: capacity a power of two up to 64, the
  // entry size of a submit descriptor.
  const uint32_t cap = 1u << (data[0] % 7);
  const uint32_t esz = sizeof(fl_submit_desc);
  uint64_t tail, head;
  std::memcpy(&tail, data + 1, 8);
  std::memcpy(&head, data + 9, 8);
  const uint8_t ops = data[17];
  data += 18;
  size -= 18;

  std::vector<uint8_t> memory(sizeof(fl_ring_header) + size_t{cap} * esz);
  auto* ring = reinterpret_cast<fl_ring_header*>(memory.data());
  fl_ring_init(ring, cap, esz);
  // What the client wrote: its indices and, into the entries, the input.
  ring->tail = tail;
  ring->head = head;
  std::memcpy(fl_ring_entries(ring), data, std::min(size, size_t{cap} * esz));

  for (int i = 0; i < (ops & 0x3f) + 1; ++i) {
    const uint64_t h = ring->head, t = ring->tail;
    fl_submit_desc d;
    const fl_ring_result r = fl_ring_pop(ring, cap, esz, &d);
    if (t == h) {
      if (r != FL_RING_EMPTY) std::abort();
    } else if (t - h > cap) {
      if (r != FL_RING_CORRUPT || ring->head != h) std::abort();
    } else {
      if (r != FL_RING_OK || ring->head != h + 1) std::abort();
    }
    if (r != FL_RING_OK) {
      // The writer side of the other ring: a push never overruns either.
      const fl_ring_result w = fl_ring_push(ring, cap, esz, &d);
      if (w == FL_RING_OK && ring->tail - ring->head > cap) std::abort();
      if (r == FL_RING_CORRUPT) break;
    }
  }
  return 0;
}
