#include "transport/rdma/rdma_device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "transport/rdma/rdma_addr.h"
#include "transport/rdma/rdma_status.h"

namespace framelink::transport::rdma {
namespace {

constexpr const char* kNoDevicesHelp =
    "no RDMA devices found: install the provider (apt-get install rdma-core ibverbs-providers) and load the "
    "driver; for Soft-RoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <if>; check with "
    "ibv_devices";

const char* portStateName(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_NOP:
      return "NOP";
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
  }
  return "?";
}

int readNumaNode(const std::string& device) {
  std::ifstream f("/sys/class/infiniband/" + device + "/device/numa_node");
  int node = -1;
  if (!(f >> node) || node < 0) return -1;
  return node;
}

// The contexts of every RDMA device there is.
Result<std::vector<ibv_context*>> openDevices(VerbsApi& api) {
  int count = 0;
  ibv_context** list = api.getDevices(&count);
  if (list == nullptr || count <= 0) {
    if (list != nullptr) api.freeDevices(list);
    return makeError(FL_ERR_TRANSPORT, std::string("rdma: ") + kNoDevicesHelp);
  }
  std::vector<ibv_context*> contexts(list, list + count);
  api.freeDevices(list);  // frees the array only: librdmacm keeps the contexts open
  return contexts;
}

// The device called `wanted` (null when `wanted` is empty); `names` gets
// every device's name, for the error messages.
Result<ibv_context*> findByName(VerbsApi& api, const std::vector<ibv_context*>& contexts,
                                const std::string& wanted, std::string* names) {
  ibv_context* chosen = nullptr;
  for (ibv_context* c : contexts) {
    const char* n = api.deviceName(c);
    if (!names->empty()) *names += ", ";
    *names += n ? n : "?";
    if (!wanted.empty() && n && wanted == n) chosen = c;
  }
  if (!wanted.empty() && chosen == nullptr) {
    return makeError(FL_ERR_TRANSPORT, "rdma: RDMA device '" + wanted + "' not found; devices present: " +
                                           *names + " (see ibv_devices / rdma link)");
  }
  return chosen;
}

// The device an IP is on, and its port.
struct IpOwner {
  ibv_context* context;
  uint8_t port;
};

// The device and port that own options.bind_ip, found by binding an
// rdma_cm id to it (and destroying the id again); it must be `chosen` when
// a device was named too.
Result<IpOwner> findByIp(VerbsApi& api, const RdmaDeviceOptions& options, const ibv_context* chosen,
                         const std::string& names) {
  auto addr = parseIp(options.bind_ip, 0);
  if (!addr) return std::move(addr).error().context("rdma device");
  rdma_cm_id* id = nullptr;
  if (api.createId(nullptr, &id, nullptr, RDMA_PS_TCP) != 0) {
    return makeError(FL_ERR_RESOURCES, std::string("rdma: rdma_create_id failed: ") + std::strerror(errno) +
                                           " (is rdma_ucm loaded? /dev/infiniband/rdma_cm must exist)");
  }
  int rc = api.bindAddr(id, reinterpret_cast<sockaddr*>(&addr.value()));
  int bind_errno = errno;
  ibv_context* owner = rc == 0 ? id->verbs : nullptr;
  uint8_t owner_port = rc == 0 ? id->port_num : 0;
  api.destroyId(id);
  if (rc != 0) {
    return makeError(FL_ERR_TRANSPORT, "rdma: cannot bind " + options.bind_ip + ": " +
                                           std::strerror(bind_errno) + " (is it an address of this host?)");
  }
  if (owner == nullptr) {
    return makeError(FL_ERR_TRANSPORT, "rdma: IP " + options.bind_ip +
                                           " is not on an RDMA device (its network interface has none; "
                                           "devices present: " +
                                           names +
                                           "; for Soft-RoCE: rdma link add rxe0 type rxe netdev <if>)");
  }
  const char* owner_name = api.deviceName(owner);
  if (chosen != nullptr && owner != chosen) {
    return makeError(FL_ERR_TRANSPORT, "rdma: IP " + options.bind_ip + " belongs to RDMA device '" +
                                           (owner_name ? owner_name : "?") + "', not to '" +
                                           options.device_name + "'; fix one of the two");
  }
  return IpOwner{owner, owner_port};
}

// The port the IP is on (`port`, if not 0), or else the first ACTIVE one
// of the device's `port_count`.
Result<uint8_t> findActivePort(VerbsApi& api, ibv_context* context, const std::string& name, uint8_t port,
                               uint8_t port_count) {
  std::string states;
  uint8_t first = port != 0 ? port : 1;
  uint8_t last = port != 0 ? port : port_count;
  for (uint8_t p = first; p >= 1 && p <= last; ++p) {
    ibv_port_attr pa{};
    if (api.queryPort(context, p, &pa) != 0) {
      return makeError(FL_ERR_TRANSPORT, "rdma: ibv_query_port(" + name + ", " + std::to_string(p) +
                                             ") failed: " + std::strerror(errno));
    }
    if (pa.state == IBV_PORT_ACTIVE) return p;
    if (!states.empty()) states += ", ";
    states += "port " + std::to_string(p) + " " + portStateName(pa.state);
  }
  return makeError(FL_ERR_TRANSPORT, "rdma: device " + name + " has no ACTIVE port (" + states +
                                         "): bring its network interface up / check the cable and "
                                         "`rdma link`");
}

}  // namespace

// ---------------------------------------------------------------- open

Result<std::shared_ptr<RdmaDevice>> RdmaDevice::open(const RdmaDeviceOptions& options,
                                                     std::shared_ptr<VerbsApi> api) {
  if (!api) return makeError(FL_EINVAL, "RdmaDevice::open: no verbs implementation");
  const bool any_ip = options.bind_ip.empty() || isAnyAddress(options.bind_ip);
  if (options.device_name.empty() && any_ip) {
    return makeError(FL_EINVAL,
                     "rdma: set the RDMA device name or the IP this daemon binds for rdma (the device is the "
                     "one that owns that IP); '" +
                         options.bind_ip + "' names no device");
  }

  auto contexts = openDevices(*api);
  if (!contexts) return std::move(contexts).error();
  std::string names;
  auto named = findByName(*api, *contexts, options.device_name, &names);
  if (!named) return std::move(named).error();
  ibv_context* chosen = *named;
  uint8_t port = 0;
  if (!any_ip) {
    auto owner = findByIp(*api, options, chosen, names);
    if (!owner) return std::move(owner).error();
    chosen = owner->context;
    port = owner->port;
  }

  ibv_device_attr attr{};
  if (api->queryDevice(chosen, &attr) != 0) {
    return makeError(FL_ERR_TRANSPORT, std::string("rdma: ibv_query_device failed: ") + std::strerror(errno));
  }
  std::string name = api->deviceName(chosen) ? api->deviceName(chosen) : "?";
  // A peer may write only into the slot of a live credit, through a window
  // bound per credit on the link's queue pair.  Without type-2 windows the
  // only way left would be a registration per slot and link, which pins and
  // re-keys memory per credit: refused instead, the link falls back to tcp.
  if ((attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) == 0) {
    return makeError(FL_ERR_TRANSPORT, "rdma: device " + name +
                                           " has no type-2B memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B), "
                                           "which framelink needs to limit a peer to the slots it holds "
                                           "credits for; use the tcp or grpc transport with this device");
  }
  auto active = findActivePort(*api, chosen, name, port, attr.phys_port_cnt);
  if (!active) return std::move(active).error();

  std::shared_ptr<RdmaDevice> device(
      new RdmaDevice(std::move(api), chosen, name, *active, any_ip ? std::string() : options.bind_ip, attr));
  if (Status s = device->start(); !s) return std::move(s).error();
  spdlog::info("rdma: using device {} port {} (numa node {}){}", name, *active, device->numa_node_,
               device->bind_ip_.empty() ? "" : " for " + device->bind_ip_);
  return device;
}

Status RdmaDevice::start() {
  pd_ = api_->allocPd(context_);
  if (pd_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, "rdma: ibv_alloc_pd on " + name_ + " failed: " + std::strerror(errno));
  }
  numa_node_ = readNumaNode(name_);

  int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) return makeError(FL_ERR_RESOURCES, std::string("rdma: eventfd: ") + std::strerror(errno));
  wake_fd_.reset(wake);
  if (!setNonBlocking(context_->async_fd)) {
    return makeError(FL_ERR_RESOURCES, "rdma: cannot make the async event fd of " + name_ +
                                           " non-blocking: " + std::strerror(errno));
  }
  try {
    async_thread_ = std::thread([this] { asyncLoop(); });
  } catch (const std::system_error& e) {
    return makeError(FL_ERR_RESOURCES,
                     std::string("rdma: cannot start the device event thread: ") + e.what());
  }
  return {};
}

RdmaDevice::RdmaDevice(std::shared_ptr<VerbsApi> api, ibv_context* context, std::string name,
                       uint8_t port_num, std::string bind_ip, const ibv_device_attr& attr)
    : api_(std::move(api)),
      context_(context),
      name_(std::move(name)),
      port_num_(port_num),
      bind_ip_(std::move(bind_ip)),
      attr_(attr) {}

RdmaDevice::~RdmaDevice() {
  if (async_thread_.joinable()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
    async_thread_.join();
  }
  // Every registration holds the device, so none is left here.
  if (pd_ != nullptr && api_->deallocPd(pd_) != 0) {
    spdlog::warn("rdma: ibv_dealloc_pd on {} failed: {}", name_, std::strerror(errno));
  }
}

// ---------------------------------------------------------------- memory

Result<std::unique_ptr<MemoryRegistration>> RdmaDevice::registerMemory(void* addr, size_t length,
                                                                       MemoryAccess access) {
  if (addr == nullptr || length == 0) {
    return makeError(FL_EINVAL, "rdma: registerMemory needs a non-empty range");
  }
  const auto start = reinterpret_cast<uintptr_t>(addr);
  {
    MutexLock lock(mu_);
    auto next = regions_.lower_bound(start);
    bool overlaps = next != regions_.end() && next->first < start + length;
    if (!overlaps && next != regions_.begin()) overlaps = std::prev(next)->second.end > start;
    if (overlaps) {
      return makeError(FL_EINVAL, "rdma: memory at " + std::to_string(start) + " (+" +
                                      std::to_string(length) + ") overlaps a range already registered on " +
                                      name_);
    }
  }
  // No REMOTE_WRITE or REMOTE_READ: an rkey of the whole segment would let a
  // peer write into (or read) any slot, on any queue pair of the PD, for the
  // segment's life.  Windows need MW_BIND, and LOCAL_WRITE on the MR to grant
  // remote write (C10-75); a read window needs neither of the latter.
  const int flags = access == MemoryAccess::kCreditWindows ? (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND)
                                                           : IBV_ACCESS_MW_BIND;
  ibv_mr* mr = api_->regMr(pd_, addr, length, flags);
  if (mr == nullptr) {
    int e = errno;
    std::string hint;
    if (e == ENOMEM || e == EPERM || e == EAGAIN) {
      hint =
          " (the pages cannot be pinned: raise RLIMIT_MEMLOCK — LimitMEMLOCK=infinity in the unit, "
          "ulimit -l — or give the daemon CAP_IPC_LOCK)";
    }
    return makeError(FL_ERR_RESOURCES, "rdma: ibv_reg_mr of " + std::to_string(length) + " bytes on " +
                                           name_ + " failed: " + std::strerror(e) + hint);
  }
  {
    MutexLock lock(mu_);
    regions_[start] = Region{start + length, mr->lkey, mr->rkey, access, mr};
  }
  return std::unique_ptr<MemoryRegistration>(new MemoryRegistration(shared_from_this(), mr, access));
}

MemoryRegistration::~MemoryRegistration() {
  device_->forget(mr_);
  if (device_->api_->deregMr(mr_) != 0) {
    spdlog::warn("rdma: ibv_dereg_mr on {} failed: {}", device_->name(), std::strerror(errno));
  }
}

void RdmaDevice::forget(const ibv_mr* mr) noexcept {
  MutexLock lock(mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(mr->addr));
  if (it != regions_.end() && it->second.mr == mr) regions_.erase(it);
}

const RdmaDevice::Region* RdmaDevice::findLocked(uintptr_t start, size_t length) const noexcept {
  auto it = regions_.upper_bound(start);
  if (it == regions_.begin()) return nullptr;
  --it;
  if (start + length < start || start + length > it->second.end) return nullptr;
  return &it->second;
}

bool RdmaDevice::lookupLocal(const void* addr, size_t length, uint32_t* lkey) const noexcept {
  MutexLock lock(mu_);
  const Region* r = findLocked(reinterpret_cast<uintptr_t>(addr), length);
  if (r == nullptr) return false;
  *lkey = r->lkey;
  return true;
}

ibv_mr* RdmaDevice::windowRegion(const void* addr, size_t length) const noexcept {
  MutexLock lock(mu_);
  const Region* r = findLocked(reinterpret_cast<uintptr_t>(addr), length);
  if (r == nullptr || r->access != MemoryAccess::kCreditWindows) return nullptr;
  return r->mr;
}

ibv_mr* RdmaDevice::sourceRegion(const void* addr, size_t length) const noexcept {
  MutexLock lock(mu_);
  const Region* r = findLocked(reinterpret_cast<uintptr_t>(addr), length);
  if (r == nullptr || r->access != MemoryAccess::kLocalRead) return nullptr;
  return r->mr;
}

// ---------------------------------------------------------------- async events

uint64_t RdmaDevice::watch(const ibv_qp* qp, const ibv_cq* cq, AsyncErrorCallback on_error) {
  MutexLock lock(watch_mu_);
  uint64_t id = next_watch_id_++;
  watchers_.emplace(id, Watcher{qp, cq, std::move(on_error)});
  return id;
}

void RdmaDevice::unwatch(uint64_t id) noexcept {
  MutexLock lock(watch_mu_);
  watchers_.erase(id);
}

void RdmaDevice::asyncLoop() noexcept {
  const int async_fd = context_->async_fd;
  for (;;) {
    pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {async_fd, POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("rdma: {}: poll on the async event fd failed: {}", name_, std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    ibv_async_event event{};
    while (api_->getAsyncEvent(context_, &event) == 0) {
      dispatch(event);
      api_->ackAsyncEvent(&event);
    }
  }
}

void RdmaDevice::dispatch(const ibv_async_event& event) noexcept {
  const ErrorScope scope = classifyAsyncEvent(event.event_type);
  const char* what = ibv_event_type_str(event.event_type);
  if (scope == ErrorScope::kNone) {
    spdlog::info("rdma: {}: async event {}", name_, what);
    return;
  }
  const bool device_wide =
      event.event_type == IBV_EVENT_DEVICE_FATAL || event.event_type == IBV_EVENT_PORT_ERR;
  const int status = scope == ErrorScope::kDevice ? kStatusDevice : FL_ERR_LINK_LOST;
  std::string message = "rdma: " + name_ + ": asynchronous " + what + " (" + scopeName(scope) + " error)";
  if (device_wide) {
    spdlog::error("{}: every link on the device is lost", message);
  } else {
    spdlog::warn("{}", message);
  }
  MutexLock lock(watch_mu_);
  for (auto& [id, w] : watchers_) {
    bool hit = device_wide;
    if (!hit && event.event_type == IBV_EVENT_CQ_ERR) hit = w.cq == event.element.cq;
    if (!hit && event.event_type != IBV_EVENT_CQ_ERR && event.event_type != IBV_EVENT_SRQ_ERR) {
      hit = w.qp == event.element.qp;
    }
    if (hit) w.on_error(status, message);
  }
}

}  // namespace framelink::transport::rdma
