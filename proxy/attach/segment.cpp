#include "attach/segment.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#ifdef FRAMELINK_HAVE_NUMA
#include <numa.h>
#include <numaif.h>
#endif

#include "framelink/shm_ring.h"

namespace framelink {

namespace {

uint64_t roundUp(uint64_t value, uint64_t align) { return (value + align - 1) / align * align; }

uint32_t nextPow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

std::string errnoText(int err) { return std::string(std::strerror(err)); }

struct Memfd {
  UniqueFd fd;
  bool huge = false;
};

// memfd_create() makes a file of mode 0777: whoever holds any fd of it -- a
// reader lent a read-only one -- could open it again for writing through
// /proc/self/fd/N.  Made 0400 and owned by the daemon's uid, it can be opened
// by name only for reading, and only by the daemon (keepReadOnlyDataFd);
// nobody else may change that mode, and clients get their fds over the socket.
constexpr mode_t kSegmentFileMode = 0400;

// Invalid, with errno set, when the memfd cannot be made or given that mode.
UniqueFd createMemfd(const char* name, unsigned int flags) {
  UniqueFd fd(::memfd_create(name, flags));
  if (fd.valid() && ::fchmod(fd.get(), kSegmentFileMode) != 0) {
    const int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

Result<Memfd> makeMemfd(const char* name, uint64_t size, bool try_huge, bool require_huge) {
  if (try_huge) {
    UniqueFd owned = createMemfd(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB | MFD_HUGE_2MB);
    if (owned.valid()) {
      const off_t huge_size = static_cast<off_t>(roundUp(size, static_cast<uint64_t>(FL_HUGE_PAGE_SIZE)));
      if (::ftruncate(owned.get(), huge_size) == 0) return Memfd{std::move(owned), true};
      if (require_huge) {
        return makeError(FL_ERR_RESOURCES, "cannot size a hugepage memfd of " + std::to_string(size) +
                                               " bytes: " + errnoText(errno) +
                                               "; reserve more: echo N > /proc/sys/vm/nr_hugepages");
      }
    } else if (require_huge) {
      return makeError(FL_ERR_RESOURCES, "memfd_create(MFD_HUGETLB) failed: " + errnoText(errno) +
                                             "; is hugetlbfs available? or set hugepages = \"auto\"");
    }
  }
  UniqueFd owned = createMemfd(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (!owned.valid()) {
    return makeError(FL_ERR_RESOURCES, std::string("memfd_create failed: ") + errnoText(errno));
  }
  if (::ftruncate(owned.get(), static_cast<off_t>(size)) != 0) {
    return makeError(FL_ERR_RESOURCES,
                     "cannot size a memfd of " + std::to_string(size) + " bytes: " + errnoText(errno));
  }
  return Memfd{std::move(owned), false};
}

Result<Mapping> mapShared(int fd, uint64_t size, bool huge, const char* what) {
  // MAP_POPULATE: fault everything in now, so a hugepage shortage shows up
  // here (ENOMEM) and not as a SIGBUS on the data path.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (addr == MAP_FAILED) {
    return makeError(FL_ERR_RESOURCES, std::string("mmap of the ") + what + " segment (" +
                                           std::to_string(size) + " bytes" + (huge ? ", hugepages" : "") +
                                           ") failed: " + errnoText(errno));
  }
  return Mapping(addr, size);
}

std::atomic<bool> g_warned_no_hugepages{false};

}  // namespace

Mapping::Mapping(Mapping&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), length_(std::exchange(other.length_, 0)) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    if (addr_ != nullptr) ::munmap(addr_, length_);
    addr_ = std::exchange(other.addr_, nullptr);
    length_ = std::exchange(other.length_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (addr_ != nullptr) ::munmap(addr_, length_);
}

SegmentGeometry computeGeometry(uint32_t slot_count, uint64_t slot_size, bool hugepages) {
  SegmentGeometry g;
  g.ring_capacity = nextPow2(slot_count < 2 ? 2 : slot_count);
  g.submit_ring_offset = roundUp(sizeof(fl_segment_header), FL_CACHE_LINE);
  g.completion_ring_offset =
      roundUp(g.submit_ring_offset + fl_ring_bytes(g.ring_capacity, sizeof(fl_submit_desc)), FL_CACHE_LINE);
  g.control_size = roundUp(
      g.completion_ring_offset + fl_ring_bytes(g.ring_capacity, sizeof(fl_completion_desc)), FL_PAGE_SIZE);
  // Each slot's header lies immediately before its payload, so that one
  // RDMA write lands both; payloads are page aligned.  (Hugepage-aligning
  // every payload would waste up to half of a hugepage segment for slots a
  // little over 2 MiB; the segment itself is on hugepages either way.)
  g.slot_stride = roundUp(slot_size + sizeof(fl_slot_header), FL_PAGE_SIZE);
  g.slot_header_stride = g.slot_stride;
  g.slots_offset = FL_PAGE_SIZE;
  g.slot_headers_offset = g.slots_offset - sizeof(fl_slot_header);
  g.data_size = g.slots_offset + g.slot_stride * slot_count;
  if (hugepages) g.data_size = roundUp(g.data_size, static_cast<uint64_t>(FL_HUGE_PAGE_SIZE));
  return g;
}

namespace {

// The data memfd, mapped: on 2 MiB hugepages when asked and available
// (required with HugepageMode::kOn), else on plain pages.
struct DataMapping {
  Mapping mapping;
  UniqueFd fd;
  SegmentGeometry geometry;
  bool huge = false;
};

Result<DataMapping> mapDataSegment(const SegmentRequest& request) {
  const bool try_huge = request.hugepages != HugepageMode::kOff;
  const bool require_huge = request.hugepages == HugepageMode::kOn;
  DataMapping out;
  if (try_huge) {
    const SegmentGeometry huge_geometry = computeGeometry(request.slot_count, request.slot_size, true);
    auto memfd = makeMemfd("framelink-data", huge_geometry.data_size, true, require_huge);
    if (!memfd) return std::move(memfd).error();
    if (memfd->huge) {
      auto mapping = mapShared(memfd->fd.get(), huge_geometry.data_size, true, "data");
      if (mapping) {
        out.mapping = std::move(mapping.value());
        out.fd = std::move(memfd->fd);
        out.geometry = huge_geometry;
        out.huge = true;
        return out;
      }
      if (require_huge) {
        return makeError(FL_ERR_RESOURCES, mapping.error().message +
                                               "; reserve hugepages (echo N > /proc/sys/vm/nr_hugepages)");
      }
    }
    // No hugepages (or they could not be mapped): plain pages, with their own geometry.
    if (!g_warned_no_hugepages.exchange(true)) {
      spdlog::warn(
          "no 2 MiB hugepages available: client data segments use 4 KiB pages (slower first touch, more "
          "TLB misses); reserve some with `echo N > /proc/sys/vm/nr_hugepages` or set hugepages = \"off\" to "
          "silence this");
    }
  }
  out.geometry = computeGeometry(request.slot_count, request.slot_size, false);
  auto memfd = makeMemfd("framelink-data", out.geometry.data_size, false, false);
  if (!memfd) return std::move(memfd).error();
  auto mapping = mapShared(memfd->fd.get(), out.geometry.data_size, false, "data");
  if (!mapping) return std::move(mapping).error();
  out.mapping = std::move(mapping.value());
  out.fd = std::move(memfd->fd);
  return out;
}

}  // namespace

Result<std::shared_ptr<ClientSegments>> ClientSegments::create(const SegmentRequest& request) {
  std::shared_ptr<ClientSegments> seg(new ClientSegments());
  seg->slot_count_ = request.slot_count;
  seg->slot_size_ = request.slot_size;
  auto data = mapDataSegment(request);
  if (!data) return std::move(data).error();
#ifdef FRAMELINK_HAVE_NUMA
  if (request.numa_node >= 0 && numa_available() >= 0) {
    // The pages are already populated; move them to the node (best effort).
    unsigned long mask = 1UL << request.numa_node;
    if (::mbind(data->mapping.data(), data->mapping.size(), MPOL_BIND, &mask, sizeof(mask) * 8,
                MPOL_MF_MOVE) != 0) {
      spdlog::debug("mbind of a data segment to node {} failed: {}", request.numa_node, errnoText(errno));
    }
  }
#endif
  const SegmentGeometry& geometry = data->geometry;
  auto control_memfd = makeMemfd("framelink-control", geometry.control_size, false, false);
  if (!control_memfd) return std::move(control_memfd).error();
  auto control = mapShared(control_memfd->fd.get(), geometry.control_size, false, "control");
  if (!control) return std::move(control).error();

  seg->control_fd_ = std::move(control_memfd->fd);
  seg->data_fd_ = std::move(data->fd);
  seg->control_ = std::move(control.value());
  seg->data_ = std::move(data->mapping);
  seg->geometry_ = geometry;
  seg->hugepages_ = data->huge;
  seg->initControl(request);
  if (Status sealed = seg->seal(request.role); !sealed) return std::move(sealed).error();
  return seg;
}

void ClientSegments::initControl(const SegmentRequest& request) {
  const SegmentGeometry& geometry = geometry_;
  std::memset(control_.data(), 0, control_.size());
  auto* h = header();
  h->magic = FL_SEGMENT_MAGIC;
  h->layout_version = FL_LAYOUT_VERSION;
  h->role = request.role;
  h->daemon_pid = request.daemon_pid;
  h->daemon_start_ns = request.daemon_start_ns;
  h->client_id = request.client_id;
  h->slot_count = request.slot_count;
  h->ring_capacity = geometry.ring_capacity;
  h->slot_size = request.slot_size;
  h->slot_stride = geometry.slot_stride;
  h->control_size = geometry.control_size;
  h->submit_ring_offset = geometry.submit_ring_offset;
  h->completion_ring_offset = geometry.completion_ring_offset;
  h->data_size = geometry.data_size;
  h->slot_headers_offset = geometry.slot_headers_offset;
  h->slot_header_stride = geometry.slot_header_stride;
  h->slots_offset = geometry.slots_offset;
  h->data_on_hugepages = hugepages_ ? 1 : 0;
  std::strncpy(h->stream_name, request.stream.c_str(), FL_STREAM_NAME_MAX - 1);
  h->spin_advice_flags = FL_SPIN_ADVICE_SET;
  h->client_wait_spin_us = request.client_wait_spin_us;
  fl_ring_init(submitRing(), geometry.ring_capacity, sizeof(fl_submit_desc));
  fl_ring_init(completionRing(), geometry.ring_capacity, sizeof(fl_completion_desc));
  __atomic_store_n(&h->daemon_state, static_cast<uint32_t>(FL_DAEMON_SERVING), __ATOMIC_RELEASE);
}

Status ClientSegments::seal(uint32_t role) {
  // Seal the sizes so a client cannot truncate memory under the daemon (a
  // SIGBUS in the daemon otherwise), and the seals themselves.  A consumer
  // may only map its data read-only: it gets a read-only file of it
  // (clientDataFd), not a seal against writable mappings, which would also
  // keep the next daemon of a hot restart from mapping it again.
  int control_seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (::fcntl(control_fd_.get(), F_ADD_SEALS, control_seals) != 0) {
    return makeError(FL_ERR_RESOURCES, std::string("sealing the control memfd failed: ") + errnoText(errno));
  }
  (void)role;
  if (::fcntl(data_fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return makeError(FL_ERR_RESOURCES, std::string("sealing the data memfd failed: ") + errnoText(errno));
  }
  return {};
}

namespace {

// The memfd is what a hand-over says: sealed as this daemon seals, of the size given.
Status checkAdoptedFd(int fd, uint64_t size, const char* what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
    return makeError(FL_ERR_BAD_REQUEST,
                     std::string("the ") + what + " memfd is not " + std::to_string(size) + " bytes long");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (seals < 0 || (seals & kNeeded) != kNeeded) {
    return makeError(FL_ERR_BAD_REQUEST,
                     std::string("the ") + what + " memfd is not sealed against resizing");
  }
  return {};
}

}  // namespace

Result<std::shared_ptr<ClientSegments>> ClientSegments::adopt(UniqueFd control, UniqueFd data,
                                                              const Adopted& expect) {
  if (expect.slot_count == 0 || expect.slot_count > (1u << 20) || expect.slot_size == 0) {
    return makeError(FL_ERR_BAD_REQUEST, "the hand-over names no slots");
  }
  std::shared_ptr<ClientSegments> seg(new ClientSegments());
  seg->slot_count_ = expect.slot_count;
  seg->slot_size_ = expect.slot_size;
  seg->hugepages_ = expect.hugepages;
  seg->geometry_ = computeGeometry(expect.slot_count, expect.slot_size, expect.hugepages);
  const SegmentGeometry& g = seg->geometry_;
  if (Status s = checkAdoptedFd(control.get(), g.control_size, "control"); !s) return std::move(s).error();
  if (Status s = checkAdoptedFd(data.get(), g.data_size, "data"); !s) return std::move(s).error();
  auto control_map = mapShared(control.get(), g.control_size, false, "control");
  if (!control_map) return std::move(control_map).error();
  auto data_map = mapShared(data.get(), g.data_size, expect.hugepages, "data");
  if (!data_map) return std::move(data_map).error();
  seg->control_fd_ = std::move(control);
  seg->data_fd_ = std::move(data);
  seg->control_ = std::move(control_map.value());
  seg->data_ = std::move(data_map.value());
  const fl_segment_header* h = seg->header();
  if (h->magic != FL_SEGMENT_MAGIC || h->layout_version != FL_LAYOUT_VERSION || h->role != expect.role ||
      h->client_id != expect.client_id || h->slot_count != expect.slot_count ||
      h->slot_size != expect.slot_size || h->ring_capacity != g.ring_capacity ||
      h->submit_ring_offset != g.submit_ring_offset ||
      h->completion_ring_offset != g.completion_ring_offset) {
    return makeError(FL_ERR_BAD_REQUEST,
                     "the control segment's header does not match the hand-over (another layout version?)");
  }
  if (!seg->keepReadOnlyDataFd()) {
    return makeError(FL_ERR_RESOURCES,
                     std::string("no read-only file of the data segment: ") + errnoText(errno));
  }
  return seg;
}

bool ClientSegments::keepReadOnlyDataFd() noexcept {
  // Opening the memfd again through /proc makes a file of its own, with its
  // own access mode: a mapping of it can never be made writable.
  const std::string path = "/proc/self/fd/" + std::to_string(data_fd_.get());
  read_only_data_fd_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  return read_only_data_fd_.valid();
}

}  // namespace framelink
