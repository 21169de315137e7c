// One RDMA device as the daemon uses it: the device context (chosen by name
// or by the IP the daemon binds), its protection domain, the registry of
// memory registrations, and a thread that reads the device's asynchronous
// events and tells the affected transports.  One per daemon; thread-safe.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "transport/rdma/verbs_api.h"

namespace framelink::transport::rdma {

enum class MemoryAccess {
  // Producer segments: the adapter reads them for sends, and a peer reads
  // one offered slot (pull) only through a type-2 memory window the rdma
  // transport binds, remote read only, for as long as the offer lives.
  kLocalRead,
  // Consumer receive segments.  Registered without remote access: a peer
  // reaches a slot only through a type-2 memory window the rdma transport
  // binds on its own queue pair for one live credit (rdma_windows.h).
  kCreditWindows,
};

class RdmaDevice;

// One ibv_mr.  Deregisters (ibv_dereg_mr) and leaves the device's registry
// on destruction; keeps the device alive until then.
class MemoryRegistration {
 public:
  MemoryRegistration(const MemoryRegistration&) = delete;
  MemoryRegistration& operator=(const MemoryRegistration&) = delete;
  virtual ~MemoryRegistration();

  uint32_t lkey() const noexcept { return mr_->lkey; }
  uint32_t rkey() const noexcept { return mr_->rkey; }
  void* addr() const noexcept { return mr_->addr; }
  size_t length() const noexcept { return mr_->length; }
  MemoryAccess access() const noexcept { return access_; }

 private:
  friend class RdmaDevice;
  MemoryRegistration(std::shared_ptr<RdmaDevice> device, ibv_mr* mr, MemoryAccess access)
      : device_(std::move(device)), mr_(mr), access_(access) {}

  std::shared_ptr<RdmaDevice> device_;
  ibv_mr* mr_;
  MemoryAccess access_;
};

struct RdmaDeviceOptions {
  std::string device_name;  // e.g. "rxe_a", "mlx5_0"; empty: the device that owns bind_ip
  std::string bind_ip;      // the IP this daemon uses for rdma; "0.0.0.0" only if device_name is set
};

class RdmaDevice : public std::enable_shared_from_this<RdmaDevice> {
 public:
  // Errors say why and what to do: FL_ERR_TRANSPORT when there is no (such)
  // device, the IP is on no RDMA device or no port is ACTIVE; FL_EINVAL for
  // options that name nothing; FL_ERR_RESOURCES when the PD cannot be made.
  static Result<std::shared_ptr<RdmaDevice>> open(const RdmaDeviceOptions& options,
                                                  std::shared_ptr<VerbsApi> api = realVerbs());

  RdmaDevice(const RdmaDevice&) = delete;
  RdmaDevice& operator=(const RdmaDevice&) = delete;
  ~RdmaDevice();

  const std::string& name() const noexcept { return name_; }
  // /sys/class/infiniband/<dev>/device/numa_node; -1 if unknown (rxe has none).
  int numaNode() const noexcept { return numa_node_; }

  // Registers [addr, addr + length) once.  Overlapping an existing
  // registration is FL_EINVAL (a range has one access mode and one key).
  // Pinning failures say how to raise the locked-memory limit.
  Result<std::unique_ptr<MemoryRegistration>> registerMemory(void* addr, size_t length, MemoryAccess access);

  // ---- for the rdma transport and its connection code
  VerbsApi& api() const noexcept { return *api_; }
  const std::shared_ptr<VerbsApi>& apiPtr() const noexcept { return api_; }
  ibv_context* context() const noexcept { return context_; }
  ibv_pd* pd() const noexcept { return pd_; }
  uint8_t portNum() const noexcept { return port_num_; }
  const std::string& bindIp() const noexcept { return bind_ip_; }
  const ibv_device_attr& attributes() const noexcept { return attr_; }

  // The lkey of any registration containing [addr, addr + length).  False
  // when no single registration contains the range.
  bool lookupLocal(const void* addr, size_t length, uint32_t* lkey) const noexcept;
  // The kCreditWindows registration containing the range (what a memory
  // window is bound to), or null.
  ibv_mr* windowRegion(const void* addr, size_t length) const noexcept;
  // The kLocalRead registration containing the range (what a read window
  // for an offered slot is bound to), or null.
  ibv_mr* sourceRegion(const void* addr, size_t length) const noexcept;

  // Asynchronous events that break a link: `on_error(status, message)` runs
  // on the device's event thread for events of `qp` or `cq` (link scope,
  // FL_ERR_LINK_LOST) and for port / device failures (FL_ERR_DEVICE).  It
  // must be quick and must not call back into the device.  unwatch() returns
  // only when no callback for `id` runs any more.
  using AsyncErrorCallback = std::function<void(int status, const std::string& message)>;
  uint64_t watch(const ibv_qp* qp, const ibv_cq* cq, AsyncErrorCallback on_error);
  void unwatch(uint64_t id) noexcept;

 private:
  RdmaDevice(std::shared_ptr<VerbsApi> api, ibv_context* context, std::string name, uint8_t port_num,
             std::string bind_ip, const ibv_device_attr& attr);
  // Allocates the PD, reads the NUMA node and starts the event thread on
  // the (now non-blocking) async event fd.
  Status start();
  void forget(const ibv_mr* mr) noexcept;
  void asyncLoop() noexcept;
  void dispatch(const ibv_async_event& event) noexcept;
  friend class MemoryRegistration;

  struct Region {
    uintptr_t end;
    uint32_t lkey;
    uint32_t rkey;
    MemoryAccess access;
    ibv_mr* mr;
  };
  const Region* findLocked(uintptr_t start, size_t length) const noexcept FL_REQUIRES(mu_);

  struct Watcher {
    const ibv_qp* qp;
    const ibv_cq* cq;
    AsyncErrorCallback on_error;
  };

  const std::shared_ptr<VerbsApi> api_;
  ibv_context* const context_;  // owned by librdmacm (rdma_get_devices)
  ibv_pd* pd_ = nullptr;
  const std::string name_;
  const uint8_t port_num_;
  const std::string bind_ip_;
  const ibv_device_attr attr_;
  int numa_node_ = -1;

  mutable Mutex mu_;
  std::map<uintptr_t, Region> regions_ FL_GUARDED_BY(mu_);  // by start address

  Mutex watch_mu_;
  std::map<uint64_t, Watcher> watchers_ FL_GUARDED_BY(watch_mu_);
  uint64_t next_watch_id_ FL_GUARDED_BY(watch_mu_) = 1;

  UniqueFd wake_fd_;  // eventfd: stops the event thread
  std::thread async_thread_;
};

}  // namespace framelink::transport::rdma
