#include "hostile_reader.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "client_util.h"
#include "framelink/attach_proto.h"
#include "framelink/framelink.h"
#include "framelink/shm_layout.h"
#include "framelink/shm_ring.h"
#include "raw_client.h"

namespace framelink::integ {

namespace {

constexpr auto kFrameWait = std::chrono::seconds(20);
constexpr int kProcessFds = 64;  // the fds of another process tried: 0..63

// printf into a failure buffer of a LendTrial; returns `code`.
__attribute__((format(printf, 3, 4))) int failWith(char (&out)[256], int code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(out, sizeof out, format, args);
  va_end(args);
  return code;
}

// A segment lent to the reader: its fd (kept, as libframelink does not),
// its geometry, and the reader's own read-only mapping of it.
struct Lent {
  uint64_t id = 0;
  int fd = -1;
  uint8_t* map = nullptr;
  uint64_t size = 0, slots_offset = 0, slot_stride = 0;
  dev_t dev = 0;
  ino_t ino = 0;
};

// The reader's attachment, over the raw ABI: the attach socket (lend
// messages come on it), the control segment (rings) and its own data
// segment (slot headers the daemon writes), read-only.
struct Attachment {
  int sock = -1;
  int fds[FL_ATTACH_FD_COUNT] = {-1, -1, -1, -1};
  uint8_t* control = nullptr;
  const uint8_t* data = nullptr;
  uint32_t capacity = 0;

  const fl_segment_header* header() const { return reinterpret_cast<const fl_segment_header*>(control); }
  fl_ring_header* ring(uint64_t offset) const { return reinterpret_cast<fl_ring_header*>(control + offset); }
  const fl_slot_header* slotHeader(uint32_t slot) const {
    return reinterpret_cast<const fl_slot_header*>(data + header()->slot_headers_offset +
                                                   header()->slot_header_stride * slot);
  }
};

// recvmsg with up to FL_ATTACH_FD_COUNT fds; the message's length, or -1.
ssize_t receiveWithFds(int sock, void* buf, size_t len, std::vector<int>* fds, int flags) {
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * FL_ATTACH_FD_COUNT)];
  iovec iov{buf, len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof cbuf;
  const ssize_t n = ::recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = n >= 0 ? CMSG_FIRSTHDR(&msg) : nullptr; c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds->push_back(fd);
    }
  }
  return n;
}

// Attaches as a subscriber of `o.stream`; 0, or an exit code with the failure set.
int attachRaw(const HostileReaderOptions& o, Attachment* a) {
  char(&failure)[256] = o.trial->reader_failure;
  a->sock = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", o.socket.c_str());
  if (a->sock < 0 || ::connect(a->sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return failWith(failure, 20, "connect(%s): %s", o.socket.c_str(), std::strerror(errno));
  }
  fl_attach_request req = makeAttachRequest(FL_ROLE_CONSUMER, o.stream, 4, o.slot_size);
  req.flags = FL_ATTACH_SUBSCRIBE;
  if (::send(a->sock, &req, sizeof req, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof req)) {
    return failWith(failure, 21, "send(attach): %s", std::strerror(errno));
  }
  fl_attach_reply reply{};
  std::vector<int> fds;
  pollfd pfd{a->sock, POLLIN, 0};
  if (::poll(&pfd, 1, 10000) != 1 || receiveWithFds(a->sock, &reply, sizeof reply, &fds, 0) != sizeof reply ||
      reply.status != FL_OK || fds.size() != FL_ATTACH_FD_COUNT) {
    return failWith(failure, 22, "attach refused or no reply: status %d, %zu fds: %s", reply.status,
                    fds.size(), reply.message);
  }
  std::copy(fds.begin(), fds.end(), a->fds);
  void* c = ::mmap(nullptr, reply.control_size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fds[0], 0);
  void* d = ::mmap(nullptr, reply.data_size, PROT_READ, MAP_SHARED, a->fds[1], 0);
  if (c == MAP_FAILED || d == MAP_FAILED) return failWith(failure, 23, "mmap: %s", std::strerror(errno));
  a->control = static_cast<uint8_t*>(c);
  a->data = static_cast<const uint8_t*>(d);
  a->capacity = a->header()->ring_capacity;
  return 0;
}

// Reads lend messages until segment `id` is known; nullptr when it never came.
Lent* lentSegment(const Attachment& a, uint64_t id, std::vector<Lent>* lent, LendTrial* trial) {
  for (;;) {
    for (Lent& l : *lent) {
      if (l.id == id) return &l;
    }
    fl_lend_message m{};
    std::vector<int> fds;
    if (receiveWithFds(a.sock, &m, sizeof m, &fds, MSG_DONTWAIT) != sizeof m || m.magic != FL_LEND_MAGIC) {
      return nullptr;
    }
    if (m.kind != FL_LEND_SEGMENT || fds.size() != 1) continue;  // a retirement: it stays mapped, harmless
    Lent l;
    l.id = m.lend_id;
    l.fd = fds[0];
    l.size = m.data_size;
    l.slots_offset = m.slots_offset;
    l.slot_stride = m.slot_stride;
    void* p = ::mmap(nullptr, l.size, PROT_READ, MAP_SHARED, l.fd, 0);
    struct stat st {};
    if (p == MAP_FAILED || ::fstat(l.fd, &st) != 0) return nullptr;
    l.map = static_cast<uint8_t*>(p);
    l.dev = st.st_dev;
    l.ino = st.st_ino;
    if (trial->lends++ == 0) {
      trial->lent_access_mode = ::fcntl(l.fd, F_GETFL) & O_ACCMODE;
      trial->lent_file_mode = st.st_mode & 07777;
      trial->lent_file_uid = st.st_uid;
    }
    lent->push_back(l);
  }
}

// Everything tried against one frame's bytes in a lent segment.
class FrameAttacks {
 public:
  FrameAttacks(const Lent& l, uint32_t slot, uint64_t length, LendTrial* trial)
      : l_(l), offset_(l.slots_offset + uint64_t{slot} * l.slot_stride), trial_(trial) {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    length_ = std::max<uint64_t>((length + page - 1) / page * page, page);
    junk_.assign(length_, 0xA5);
  }

  void throughTheFd() {
    note(LendAttack::kPwrite, ::pwrite(l_.fd, junk_.data(), length_, static_cast<off_t>(offset_)) >= 0);
    void* w = ::mmap(nullptr, l_.size, PROT_READ | PROT_WRITE, MAP_SHARED, l_.fd, 0);
    if (w != MAP_FAILED) {
      std::memset(static_cast<uint8_t*>(w) + offset_, 0xA5, length_);
      ::munmap(w, l_.size);
    }
    note(LendAttack::kMmapShared, w != MAP_FAILED);
    uint8_t* bytes = l_.map + offset_;
    const bool writable = ::mprotect(bytes, length_, PROT_READ | PROT_WRITE) == 0;
    if (writable) {
      std::memset(bytes, 0xA5, length_);
      ::mprotect(bytes, length_, PROT_READ);
    }
    note(LendAttack::kMprotect, writable);
    note(LendAttack::kMadviseRemove, ::madvise(bytes, length_, MADV_REMOVE) == 0);
    note(LendAttack::kPunchHole, punch(l_.fd));
    note(LendAttack::kFtruncate, ::ftruncate(l_.fd, 0) == 0);
    note(LendAttack::kFchmod, ::fchmod(l_.fd, 0666) == 0);
    note(LendAttack::kFchown, ::fchown(l_.fd, ::getuid(), ::getgid()) == 0);
    note(LendAttack::kAddSeals, ::fcntl(l_.fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0);
  }

  void byReopening() {
    const std::string self = "/proc/self/fd/" + std::to_string(l_.fd);
    const std::string own = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(l_.fd);
    note(LendAttack::kReopenSelfRdwr, spoil(::open(self.c_str(), O_RDWR | O_CLOEXEC)));
    note(LendAttack::kReopenSelfWronly, spoil(::open(self.c_str(), O_WRONLY | O_CLOEXEC)));
    note(LendAttack::kReopenPidRdwr, spoil(::open(own.c_str(), O_RDWR | O_CLOEXEC)));
    note(LendAttack::kReopenPidWronly, spoil(::open(own.c_str(), O_WRONLY | O_CLOEXEC)));
    char files[96];
    std::snprintf(files, sizeof files, "/proc/self/map_files/%lx-%lx",
                  reinterpret_cast<unsigned long>(l_.map), reinterpret_cast<unsigned long>(l_.map + l_.size));
    note(LendAttack::kMapFiles, spoil(::open(files, O_RDWR | O_CLOEXEC)));
  }

  // Another process's fds opened again through /proc, each as O_RDWR.
  void reopenFdsOf(pid_t pid, LendAttack attack) {
    const std::string dir = "/proc/" + std::to_string(pid) + "/fd/";
    note(attack,
         eachFd([&](int n) { return ::open((dir + std::to_string(n)).c_str(), O_RDWR | O_CLOEXEC); }));
  }

  // Another process's fds taken as they are (pidfd_getfd).
  void takeFdsOf(pid_t pid, LendAttack attack) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) return note(attack, false);
    note(attack, eachFd([&](int n) { return static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, n, 0)); }));
    ::close(pidfd);
  }

  // Another process's memory, which holds its mapping of the segment.
  void openMemOf(pid_t pid, LendAttack attack) {
    const int mem = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDWR | O_CLOEXEC);
    if (mem >= 0) ::close(mem);  // anything in that process could be written now
    note(attack, mem >= 0);
  }

 private:
  void note(LendAttack attack, bool wrote) {
    int32_t& outcome = trial_->outcome[static_cast<uint32_t>(attack)];
    if (wrote) {
      outcome = kAttackWrote;
    } else if (outcome != kAttackWrote) {
      outcome = errno != 0 ? errno : ENOENT;  // ENOENT: it opened nothing of the segment
    }
    errno = 0;
  }

  bool punch(int fd) const {
    return ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset_),
                       static_cast<off_t>(length_)) == 0;
  }

  // A writable fd of the segment is the hole itself (true); what it costs the
  // honest reader shows too: junk written into the frame, then a hole punched
  // in it.  Closes `fd`.
  bool spoil(int fd) {
    if (fd < 0) return false;
    (void)!::pwrite(fd, junk_.data(), length_, static_cast<off_t>(offset_));
    (void)punch(fd);
    ::close(fd);
    return true;
  }

  // `take(n)` for each fd number n of another process: true when one gave a
  // writable fd of the lent segment (spoil()ed), else false with errno the
  // first refusal (0: none, it got only other files).
  template <typename Take>
  bool eachFd(Take take) {
    int refusal = 0;
    for (int n = 0; n < kProcessFds; ++n) {
      errno = 0;
      const int fd = take(n);
      if (fd < 0) {
        if (refusal == 0 && errno != ENOENT && errno != EBADF) refusal = errno;
        continue;
      }
      struct stat st {};
      const bool writable = (::fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDONLY;
      if (::fstat(fd, &st) == 0 && st.st_dev == l_.dev && st.st_ino == l_.ino && writable) return spoil(fd);
      ::close(fd);
    }
    errno = refusal;
    return false;
  }

  const Lent& l_;
  uint64_t offset_ = 0;
  uint64_t length_ = 0;
  LendTrial* trial_;
  std::vector<uint8_t> junk_;
};

void attackFrame(const Attachment& a, const Lent& l, const fl_slot_header& h, const HostileReaderOptions& o) {
  FrameAttacks attacks(l, h.reserved0, h.length, o.trial);
  attacks.throughTheFd();
  attacks.byReopening();
  const auto daemon = static_cast<pid_t>(a.header()->daemon_pid);
  attacks.reopenFdsOf(daemon, LendAttack::kDaemonFd);
  attacks.takeFdsOf(daemon, LendAttack::kDaemonGetfd);
  attacks.openMemOf(daemon, LendAttack::kDaemonMem);
  const pid_t producer = o.trial->producer_pid.load(std::memory_order_acquire);
  if (producer <= 0) return;
  attacks.reopenFdsOf(producer, LendAttack::kProducerFd);  // a re-open: the segment's mode decides
  if (o.spare_producer_process) return;
  attacks.takeFdsOf(producer, LendAttack::kProducerGetfd);
  attacks.openMemOf(producer, LendAttack::kProducerMem);
}

// The next delivery, within kFrameWait.
bool nextDelivery(const Attachment& a, fl_completion_desc* d) {
  const auto until = std::chrono::steady_clock::now() + kFrameWait;
  fl_ring_header* completions = a.ring(a.header()->completion_ring_offset);
  while (fl_ring_pop(completions, a.capacity, sizeof *d, d) != FL_RING_OK) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace

const char* lendAttackName(LendAttack attack) {
  static const char* const kNames[kLendAttacks] = {
      "pwrite on the lent fd",
      "mmap(PROT_WRITE, MAP_SHARED) of the lent fd",
      "mprotect(PROT_WRITE) of the read-only mapping",
      "madvise(MADV_REMOVE) of the read-only mapping",
      "fallocate(PUNCH_HOLE) on the lent fd",
      "ftruncate of the lent fd",
      "fchmod of the lent fd",
      "fchown of the lent fd",
      "fcntl(F_ADD_SEALS) on the lent fd",
      "open(/proc/self/fd/N, O_RDWR)",
      "open(/proc/self/fd/N, O_WRONLY)",
      "open(/proc/<own pid>/fd/N, O_RDWR)",
      "open(/proc/<own pid>/fd/N, O_WRONLY)",
      "open(/proc/self/map_files/..., O_RDWR)",
      "open(/proc/<producer pid>/fd/*, O_RDWR)",
      "pidfd_getfd of the producer's fds",
      "open(/proc/<producer pid>/mem, O_RDWR)",
      "open(/proc/<daemon pid>/fd/*, O_RDWR)",
      "pidfd_getfd of the daemon's fds",
      "open(/proc/<daemon pid>/mem, O_RDWR)",
  };
  const auto i = static_cast<uint32_t>(attack);
  return i < kLendAttacks ? kNames[i] : "?";
}

bool throughProducerProcess(LendAttack attack) {
  return attack == LendAttack::kProducerGetfd || attack == LendAttack::kProducerMem;
}

void LendTrialDeleter::operator()(LendTrial* t) const noexcept {
  t->~LendTrial();
  ::munmap(t, sizeof(LendTrial));
}

LendTrialPtr makeLendTrial() {
  void* p = ::mmap(nullptr, sizeof(LendTrial), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return LendTrialPtr(new (p) LendTrial());
}

int runHostileReader(const HostileReaderOptions& o) {
  Attachment a;
  if (const int rc = attachRaw(o, &a); rc != 0) return rc;
  LendTrial& trial = *o.trial;
  uint64_t progress = 0;  // attached
  if (::write(o.progress_fd, &progress, sizeof progress) != sizeof progress) return 24;
  std::vector<Lent> lent;
  fl_ring_header* releases = a.ring(a.header()->submit_ring_offset);
  while (trial.frames < o.frames) {
    fl_completion_desc d{};
    if (!nextDelivery(a, &d)) return failWith(trial.reader_failure, 25, "no frame %u", trial.frames + 1);
    if (d.status != FL_OK || d.slot >= a.header()->slot_count) {
      return failWith(trial.reader_failure, 26, "delivery status %d slot %u", d.status, d.slot);
    }
    const fl_slot_header h = *a.slotHeader(d.slot);
    if ((h.flags & FL_SLOT_LENT) != 0) {
      uint64_t id = 0;
      std::memcpy(&id, h.reserved1, sizeof id);
      const Lent* l = lentSegment(a, id, &lent, &trial);
      if (l == nullptr) {
        return failWith(trial.reader_failure, 27, "segment %llu never came", (unsigned long long)id);
      }
      attackFrame(a, *l, h, o);
      ++trial.lent_frames;
    }
    ++trial.frames;
    if (::write(o.progress_fd, &h.frame_id, sizeof h.frame_id) != sizeof h.frame_id) return 28;
    const fl_submit_desc release{d.slot, 0, 0};
    if (fl_ring_push(releases, a.capacity, sizeof release, &release) != FL_RING_OK) return 29;
    const uint64_t one = 1;
    (void)!::write(a.fds[2], &one, sizeof one);  // the submit doorbell
  }
  return 0;
}

int runLendProducer(const std::string& socket, const std::string& stream, uint32_t frames, uint64_t length,
                    LendTrial* trial) {
  trial->producer_pid.store(::getpid(), std::memory_order_release);
  fl_client_options opt;
  fl_client_options_init(&opt);
  opt.role = FL_PRODUCER;
  opt.socket_path = socket.c_str();
  opt.stream = stream.c_str();
  opt.slot_count = 4;
  opt.slot_size = length;
  fl_client* c = nullptr;
  if (fl_attach(&opt, &c) != FL_OK) {
    return failWith(trial->producer_failure, 30, "attach: %s", fl_last_error());
  }
  std::vector<bool> done_ids(size_t{frames} + 1, false);
  uint32_t submitted = 0, completed = 0;
  int code = 0;
  const auto until = std::chrono::steady_clock::now() + kFrameWait * 3;
  while (code == 0 && completed < frames && std::chrono::steady_clock::now() < until) {
    if (submitted < frames) {
      const std::string why = trySubmitFrame(c, ++submitted, length);  // waits for a free slot
      if (!why.empty()) code = failWith(trial->producer_failure, 31, "frame %u: %s", submitted, why.c_str());
    }
    fl_completion done[8];
    size_t n = 0;
    if (submitted < frames) {
      fl_poll_completions(c, done, 8, &n);
    } else {
      fl_wait_completions(c, done, 8, &n, 100);
    }
    for (size_t i = 0; i < n && code == 0; ++i) {
      const uint64_t id = done[i].frame_id;
      if (done[i].status != FL_OK || id == 0 || id > frames || done_ids[id]) {
        code = failWith(trial->producer_failure, 32, "completion of frame %llu: %s", (unsigned long long)id,
                        fl_status_str(done[i].status));
      } else {
        done_ids[id] = true;
        ++trial->delivered;
      }
    }
    completed += static_cast<uint32_t>(n);
  }
  fl_detach(c);
  if (code == 0 && completed < frames) {
    code = failWith(trial->producer_failure, 33, "%u completions of %u frames", completed, frames);
  }
  return code;
}

}  // namespace framelink::integ
