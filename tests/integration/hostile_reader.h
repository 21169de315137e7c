// A local reader that tries to write what the daemon lends it (design.md
// section 4a): a subscriber speaking the attach ABI itself -- libframelink
// closes a lent fd once it mapped it, an attacker keeps it -- that, on every
// frame, tries each way the kernel offers to write, punch, resize, re-own,
// seal or re-open for writing the producer's segment, and writes junk
// through any that works.  And the producer it reads, on its own.  Both run
// in forked children as other users: no Catch macros here.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace framelink::integ {

enum class LendAttack : uint32_t {
  kPwrite,            // pwrite(2) on the lent fd
  kMmapShared,        // mmap(PROT_WRITE, MAP_SHARED) of the lent fd
  kMprotect,          // mprotect(PROT_WRITE) of the reader's read-only mapping
  kMadviseRemove,     // madvise(MADV_REMOVE) of that mapping: a hole punched through it
  kPunchHole,         // fallocate(FALLOC_FL_PUNCH_HOLE) on the lent fd
  kFtruncate,         // ftruncate(0) of the lent fd
  kFchmod,            // fchmod(0666) of the lent fd, which would open it to every re-open
  kFchown,            // fchown to the reader
  kAddSeals,          // fcntl(F_ADD_SEALS, F_SEAL_FUTURE_WRITE): the producer's memory sealed
  kReopenSelfRdwr,    // open("/proc/self/fd/N", O_RDWR)
  kReopenSelfWronly,  // open("/proc/self/fd/N", O_WRONLY)
  kReopenPidRdwr,     // open("/proc/<own pid>/fd/N", O_RDWR)
  kReopenPidWronly,   // open("/proc/<own pid>/fd/N", O_WRONLY)
  kMapFiles,          // open("/proc/self/map_files/<the mapping>", O_RDWR)
  kProducerFd,        // open("/proc/<producer pid>/fd/*", O_RDWR): the producer's own writable fd, again
  kProducerGetfd,     // pidfd_getfd(2) of the producer's fds
  kProducerMem,       // open("/proc/<producer pid>/mem", O_RDWR)
  kDaemonFd,          // open("/proc/<daemon pid>/fd/*", O_RDWR)
  kDaemonGetfd,       // pidfd_getfd(2) of the daemon's fds
  kDaemonMem,         // open("/proc/<daemon pid>/mem", O_RDWR)
  kCount
};
constexpr uint32_t kLendAttacks = static_cast<uint32_t>(LendAttack::kCount);
const char* lendAttackName(LendAttack attack);
// Works for whoever may ptrace the producer -- its own uid, unless the
// producer made itself undumpable or Yama forbids it -- whatever the daemon
// does: a reader of the producer's own uid is not tried with these.
bool throughProducerProcess(LendAttack attack);

// What an attack came to, over every frame it was tried on.
inline constexpr int32_t kAttackNotTried = 0;
inline constexpr int32_t kAttackWrote = -1;  // it wrote (or could have written) the segment at least once
// Otherwise the errno of its last failure.

// Shared (MAP_SHARED) between a test and its two children; see makeLendTrial().
struct LendTrial {
  std::atomic<int32_t> producer_pid{0};  // stored by the producer before it attaches
  // The hostile reader's findings.
  uint32_t frames = 0;            // frames it received, attacked and released
  uint32_t lent_frames = 0;       // of those, lent (not copied into its own slot)
  uint32_t lends = 0;             // segments lent to it
  int32_t lent_access_mode = -1;  // fcntl(F_GETFL) & O_ACCMODE of the first lent fd
  uint32_t lent_file_mode = 0;    // its st_mode & 07777
  int64_t lent_file_uid = -1;
  int32_t outcome[kLendAttacks] = {};
  char reader_failure[256] = {};  // what stopped the reader, if anything did
  // The producer's.
  uint32_t delivered = 0;  // DELIVERED completions, each with its frame's id
  char producer_failure[256] = {};
};
// A LendTrial in fresh shared anonymous memory, unmapped by the deleter.
struct LendTrialDeleter {
  void operator()(LendTrial* t) const noexcept;
};
using LendTrialPtr = std::unique_ptr<LendTrial, LendTrialDeleter>;
LendTrialPtr makeLendTrial();

struct HostileReaderOptions {
  std::string socket;
  std::string stream;
  uint32_t frames = 0;  // returns after this many
  uint64_t slot_size = 0;
  bool spare_producer_process = false;  // skip throughProducerProcess() attacks
  int progress_fd = -1;  // gets a uint64_t 0 once attached, then each frame's id after the attacks on it
  LendTrial* trial = nullptr;
};
// The reader: 0 when it attached, got `frames` frames and released each one,
// else non-zero with trial->reader_failure saying why.  Whether an attack
// worked is in trial->outcome, not in the exit code.
int runHostileReader(const HostileReaderOptions& options);

// A producer of `frames` synthetic frames (frame_pattern.h) of `length`
// bytes, ids 1..frames: 0 when each came back DELIVERED with its id.
int runLendProducer(const std::string& socket, const std::string& stream, uint32_t frames, uint64_t length,
                    LendTrial* trial);

}  // namespace framelink::integ
