// SPSC ring protocol (shm_ring.h): ordering, bounds, corruption detection,
// the sleep/wake handshake, and visibility across threads and processes.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "framelink/shm_layout.h"
#include "framelink/shm_ring.h"

namespace {

struct Entry {
  uint64_t seq;
  uint64_t check;  // ~seq: a torn or stale entry shows up as a mismatch
};

Entry makeEntry(uint64_t seq) { return Entry{seq, ~seq}; }

// A ring in private, cache-line aligned memory.
class LocalRing {
 public:
  LocalRing(uint32_t capacity, uint32_t entry_size) : cap_(capacity), esz_(entry_size) {
    void* p = nullptr;
    REQUIRE(posix_memalign(&p, FL_CACHE_LINE, fl_ring_bytes(capacity, entry_size)) == 0);
    mem_.reset(static_cast<fl_ring_header*>(p));
    fl_ring_init(mem_.get(), capacity, entry_size);
  }
  fl_ring_header* get() const { return mem_.get(); }
  fl_ring_result push(const Entry& e) { return fl_ring_push(get(), cap_, esz_, &e); }
  fl_ring_result pop(Entry& e) { return fl_ring_pop(get(), cap_, esz_, &e); }

 private:
  struct Free {
    void operator()(fl_ring_header* p) const { std::free(p); }
  };
  std::unique_ptr<fl_ring_header, Free> mem_;
  uint32_t cap_;
  uint32_t esz_;
};

}  // namespace

TEST_CASE("ring init writes geometry and zero indices", "[ring]") {
  LocalRing r(8, sizeof(Entry));
  CHECK(r.get()->capacity == 8);
  CHECK(r.get()->entry_size == sizeof(Entry));
  CHECK(r.get()->head == 0);
  CHECK(r.get()->tail == 0);
  CHECK(r.get()->reader_sleeping == 0);
  CHECK(fl_ring_entries(r.get()) == reinterpret_cast<uint8_t*>(r.get()) + sizeof(fl_ring_header));
}

TEST_CASE("fl_ring_is_pow2", "[ring]") {
  CHECK_FALSE(fl_ring_is_pow2(0));
  CHECK(fl_ring_is_pow2(1));
  CHECK(fl_ring_is_pow2(2));
  CHECK_FALSE(fl_ring_is_pow2(3));
  CHECK(fl_ring_is_pow2(1024));
  CHECK_FALSE(fl_ring_is_pow2(1023));
  CHECK(fl_ring_is_pow2(0x80000000u));
  CHECK_FALSE(fl_ring_is_pow2(0xFFFFFFFFu));
}

TEST_CASE("ring is FIFO, reports full and empty", "[ring]") {
  LocalRing r(4, sizeof(Entry));
  Entry e{};
  CHECK(r.pop(e) == FL_RING_EMPTY);
  CHECK(fl_ring_readable(r.get()) == 0);
  for (uint64_t i = 0; i < 4; ++i) CHECK(r.push(makeEntry(i)) == FL_RING_OK);
  CHECK(fl_ring_readable(r.get()) == 4);
  CHECK(r.push(makeEntry(99)) == FL_RING_FULL);
  for (uint64_t i = 0; i < 4; ++i) {
    REQUIRE(r.pop(e) == FL_RING_OK);
    CHECK(e.seq == i);
    CHECK(e.check == ~i);
  }
  CHECK(r.pop(e) == FL_RING_EMPTY);
  // Full did not write anything: after draining, the next entry is fresh.
  CHECK(r.push(makeEntry(5)) == FL_RING_OK);
  REQUIRE(r.pop(e) == FL_RING_OK);
  CHECK(e.seq == 5);
}

TEST_CASE("ring wraps around many times over its capacity", "[ring]") {
  LocalRing r(8, sizeof(Entry));
  uint64_t next_push = 0;
  uint64_t next_pop = 0;
  // Varying batch sizes move the indices through every residue.
  for (int round = 0; round < 5000; ++round) {
    uint64_t batch = 1 + static_cast<uint64_t>(round % 8);
    for (uint64_t i = 0; i < batch; ++i) REQUIRE(r.push(makeEntry(next_push++)) == FL_RING_OK);
    for (uint64_t i = 0; i < batch; ++i) {
      Entry e{};
      REQUIRE(r.pop(e) == FL_RING_OK);
      REQUIRE(e.seq == next_pop);
      REQUIRE(e.check == ~next_pop);
      ++next_pop;
    }
  }
  CHECK(next_pop > 8 * 1000);
  CHECK(r.get()->head == next_pop);  // free-running, never wrapped
  CHECK(r.get()->tail == next_push);
}

TEST_CASE("free-running indices survive 64-bit wrap-around", "[ring]") {
  LocalRing r(4, sizeof(Entry));
  const uint64_t start = UINT64_MAX - 2;
  r.get()->head = start;
  r.get()->tail = start;
  for (uint64_t i = 0; i < 4; ++i) REQUIRE(r.push(makeEntry(i)) == FL_RING_OK);
  CHECK(r.push(makeEntry(9)) == FL_RING_FULL);
  for (uint64_t i = 0; i < 4; ++i) {
    Entry e{};
    REQUIRE(r.pop(e) == FL_RING_OK);
    CHECK(e.seq == i);
  }
  CHECK(r.get()->tail == start + 4);  // wrapped past zero
}

TEST_CASE("impossible indices are reported as corrupt, not read", "[ring]") {
  LocalRing r(4, sizeof(Entry));
  Entry e{};
  SECTION("writer moved tail beyond head + capacity") {
    r.get()->tail = r.get()->head + 5;
    CHECK(r.pop(e) == FL_RING_CORRUPT);
    CHECK(r.get()->head == 0);  // nothing consumed
    CHECK(r.push(makeEntry(1)) == FL_RING_CORRUPT);
  }
  SECTION("tail far beyond head") {
    r.get()->tail = UINT64_C(1) << 40;
    CHECK(r.pop(e) == FL_RING_CORRUPT);
  }
  SECTION("reader moved head beyond tail") {
    r.get()->head = 3;
    r.get()->tail = 1;
    CHECK(r.push(makeEntry(1)) == FL_RING_CORRUPT);
    CHECK(r.pop(e) == FL_RING_CORRUPT);
  }
  SECTION("exactly capacity entries is full, not corrupt") {
    r.get()->tail = 4;
    CHECK(r.pop(e) == FL_RING_OK);
    r.get()->tail = r.get()->head + 4;
    CHECK(r.push(makeEntry(1)) == FL_RING_FULL);
  }
}

TEST_CASE("sleep flag protocol", "[ring]") {
  LocalRing r(4, sizeof(Entry));
  SECTION("empty ring: the reader may sleep and the writer must wake it") {
    CHECK(fl_ring_reader_needs_wake(r.get()) == 0);
    CHECK(fl_ring_prepare_sleep(r.get()) == 1);
    CHECK(r.get()->reader_sleeping == 1);
    REQUIRE(r.push(makeEntry(0)) == FL_RING_OK);
    CHECK(fl_ring_reader_needs_wake(r.get()) == 1);
    fl_ring_end_sleep(r.get());
    CHECK(r.get()->reader_sleeping == 0);
    CHECK(fl_ring_reader_needs_wake(r.get()) == 0);
  }
  SECTION("an entry that raced in: prepare_sleep says do not block") {
    REQUIRE(r.push(makeEntry(0)) == FL_RING_OK);
    CHECK(fl_ring_prepare_sleep(r.get()) == 0);
    fl_ring_end_sleep(r.get());
    Entry e{};
    CHECK(r.pop(e) == FL_RING_OK);
    CHECK(fl_ring_prepare_sleep(r.get()) == 1);
  }
}

TEST_CASE("threaded stress: 1M entries arrive complete and in order", "[ring]") {
  constexpr uint64_t kCount = 1000000;
  LocalRing r(64, sizeof(Entry));
  std::thread writer([&] {
    for (uint64_t i = 0; i < kCount;) {
      fl_ring_result res = r.push(makeEntry(i));
      if (res == FL_RING_OK) {
        ++i;
      } else if (res == FL_RING_FULL) {
        sched_yield();
      } else {
        std::abort();
      }
    }
  });
  uint64_t expected = 0;
  uint64_t bad = 0;
  while (expected < kCount) {
    Entry e{};
    fl_ring_result res = r.pop(e);
    if (res == FL_RING_EMPTY) {
      sched_yield();
      continue;
    }
    if (res != FL_RING_OK || e.seq != expected || e.check != ~expected) {
      ++bad;
      break;
    }
    ++expected;
  }
  writer.join();
  CHECK(bad == 0);
  CHECK(expected == kCount);
}

TEST_CASE("threaded: sleeping reader is never left asleep with data", "[ring]") {
  // The full wake protocol with a real eventfd.  A lost wake-up shows as a
  // poll() that times out while entries are waiting.
  constexpr uint64_t kCount = 200000;
  LocalRing r(16, sizeof(Entry));
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  REQUIRE(efd >= 0);
  std::atomic<uint64_t> wakes{0};
  std::thread writer([&] {
    for (uint64_t i = 0; i < kCount;) {
      fl_ring_result res = r.push(makeEntry(i));
      if (res == FL_RING_OK) {
        ++i;
        if (fl_ring_reader_needs_wake(r.get())) {
          uint64_t one = 1;
          if (write(efd, &one, sizeof(one)) != sizeof(one)) std::abort();
          wakes.fetch_add(1, std::memory_order_relaxed);
        }
      } else if (res == FL_RING_FULL) {
        sched_yield();
      } else {
        std::abort();
      }
    }
  });
  uint64_t expected = 0;
  uint64_t lost = 0;
  uint64_t bad = 0;
  while (expected < kCount && lost == 0 && bad == 0) {
    Entry e{};
    fl_ring_result res = r.pop(e);
    if (res == FL_RING_OK) {
      if (e.seq != expected || e.check != ~expected) ++bad;
      ++expected;
      continue;
    }
    if (fl_ring_prepare_sleep(r.get())) {
      pollfd p{efd, POLLIN, 0};
      int n = poll(&p, 1, 5000);
      if (n == 0 && fl_ring_readable(r.get()) > 0) ++lost;
      uint64_t v;
      (void)!read(efd, &v, sizeof(v));
    }
    fl_ring_end_sleep(r.get());
  }
  writer.join();
  close(efd);
  CHECK(lost == 0);
  CHECK(bad == 0);
  CHECK(expected == kCount);
  CHECK(wakes.load() > 0);  // the reader did sleep at least once
}

TEST_CASE("cross-process: a forked writer's entries arrive in order through a memfd", "[ring]") {
  constexpr uint64_t kCount = 200000;
  constexpr uint32_t kCap = 32;
  const size_t bytes = fl_ring_bytes(kCap, sizeof(Entry));
  int mfd = memfd_create("framelink-ring-test", MFD_CLOEXEC);
  REQUIRE(mfd >= 0);
  REQUIRE(ftruncate(mfd, static_cast<off_t>(bytes)) == 0);
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  REQUIRE(efd >= 0);
  // The parent maps first and initialises; the child maps the same memfd
  // separately, as the daemon and a client do.
  void* pm = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  REQUIRE(pm != MAP_FAILED);
  auto* ring = static_cast<fl_ring_header*>(pm);
  fl_ring_init(ring, kCap, sizeof(Entry));

  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    void* cm = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (cm == MAP_FAILED) _exit(2);
    auto* cr = static_cast<fl_ring_header*>(cm);
    for (uint64_t i = 0; i < kCount;) {
      Entry e = makeEntry(i);
      fl_ring_result res = fl_ring_push(cr, kCap, sizeof(Entry), &e);
      if (res == FL_RING_OK) {
        ++i;
        if (fl_ring_reader_needs_wake(cr)) {
          uint64_t one = 1;
          if (write(efd, &one, sizeof(one)) != sizeof(one)) _exit(3);
        }
      } else if (res == FL_RING_FULL) {
        sched_yield();
      } else {
        _exit(4);
      }
    }
    _exit(0);
  }

  uint64_t expected = 0;
  uint64_t bad = 0;
  uint64_t lost = 0;
  while (expected < kCount && bad == 0 && lost == 0) {
    Entry e{};
    fl_ring_result res = fl_ring_pop(ring, kCap, sizeof(Entry), &e);
    if (res == FL_RING_OK) {
      if (e.seq != expected || e.check != ~expected) ++bad;
      ++expected;
      continue;
    }
    if (res != FL_RING_EMPTY) {
      ++bad;
      break;
    }
    if (fl_ring_prepare_sleep(ring)) {
      pollfd p{efd, POLLIN, 0};
      if (poll(&p, 1, 10000) == 0 && fl_ring_readable(ring) == 0) ++lost;  // writer stuck or wake lost
      uint64_t v;
      (void)!read(efd, &v, sizeof(v));
    }
    fl_ring_end_sleep(ring);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(bad == 0);
  CHECK(lost == 0);
  CHECK(expected == kCount);
  munmap(pm, bytes);
  close(mfd);
  close(efd);
}
