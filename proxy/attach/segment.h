// Shared-memory segments handed to one client: the control segment (header +
// rings) and the data segment (slot headers + slots), each a sealed memfd
// that the daemon maps first.  No names in /dev/shm; the memory goes away
// with the last mapping.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/result.h"
#include "common/unique_fd.h"
#include "framelink/framelink.h"
#include "framelink/shm_layout.h"

namespace framelink {

// A data segment's registration with a device (rdma: the ibv_mr), made
// once when the client attached.  `handle` keeps it registered;
// `local_key` is what a send names the segment's memory by (rdma: the lkey),
// so the data path never looks it up.
struct SegmentRegistration {
  std::shared_ptr<void> handle;
  std::optional<uint32_t> local_key;
};

// A move-only mmap.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t length) noexcept : addr_(addr), length_(length) {}
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  uint8_t* data() const noexcept { return static_cast<uint8_t*>(addr_); }
  size_t size() const noexcept { return length_; }

 private:
  void* addr_ = nullptr;
  size_t length_ = 0;
};

enum class HugepageMode { kAuto, kOn, kOff };

struct SegmentRequest {
  uint32_t role = FL_ROLE_PRODUCER;
  uint32_t slot_count = 0;
  uint64_t slot_size = 0;
  uint64_t client_id = 0;
  std::string stream;
  HugepageMode hugepages = HugepageMode::kAuto;
  int numa_node = -1;  // bind the data segment here when >= 0
  uint64_t daemon_pid = 0;
  uint64_t daemon_start_ns = 0;
  // The host's wait spin for clients that set none (config client_wait_spin_us).
  uint32_t client_wait_spin_us = FL_WAIT_SPIN_DEFAULT_US;
};

// Sizes and offsets of both segments for a request (pure function, testable).
struct SegmentGeometry {
  uint32_t ring_capacity = 0;
  uint64_t slot_stride = 0;
  uint64_t control_size = 0;
  uint64_t submit_ring_offset = 0;
  uint64_t completion_ring_offset = 0;
  uint64_t data_size = 0;
  uint64_t slot_headers_offset = 0;
  uint64_t slot_header_stride = 0;
  uint64_t slots_offset = 0;
};
SegmentGeometry computeGeometry(uint32_t slot_count, uint64_t slot_size, bool hugepages);

class ClientSegments {
 public:
  static Result<std::shared_ptr<ClientSegments>> create(const SegmentRequest& request);
  // The segments of a client another daemon attached (a hot restart), from
  // its memfds: mapped again and checked against what the hand-over says of
  // them -- sizes, seals, the control header -- before they are trusted.
  struct Adopted {
    uint32_t role = FL_ROLE_PRODUCER;
    uint32_t slot_count = 0;
    uint64_t slot_size = 0;
    bool hugepages = false;
    uint64_t client_id = 0;
  };
  static Result<std::shared_ptr<ClientSegments>> adopt(UniqueFd control, UniqueFd data,
                                                       const Adopted& expect);

  fl_segment_header* header() const noexcept { return reinterpret_cast<fl_segment_header*>(control_.data()); }
  fl_ring_header* submitRing() const noexcept {
    return reinterpret_cast<fl_ring_header*>(control_.data() + geometry_.submit_ring_offset);
  }
  fl_ring_header* completionRing() const noexcept {
    return reinterpret_cast<fl_ring_header*>(control_.data() + geometry_.completion_ring_offset);
  }
  fl_slot_header* slotHeader(uint32_t slot) const noexcept {
    return reinterpret_cast<fl_slot_header*>(data_.data() + geometry_.slot_headers_offset +
                                             geometry_.slot_header_stride * slot);
  }
  uint8_t* slot(uint32_t slot) const noexcept {
    return data_.data() + geometry_.slots_offset + geometry_.slot_stride * slot;
  }

  // The whole data segment (slot headers and payloads): what an rdma
  // device registers as this client's memory region.
  uint8_t* dataBase() const noexcept { return data_.data(); }
  uint64_t dataSize() const noexcept { return geometry_.data_size; }

  const SegmentGeometry& geometry() const noexcept { return geometry_; }
  uint32_t slotCount() const noexcept { return slot_count_; }
  uint64_t slotSize() const noexcept { return slot_size_; }
  bool onHugepages() const noexcept { return hugepages_; }
  // The daemon keeps both memfds for the segments' life: a hot restart
  // hands them to the next daemon (hand_over.h), which maps them again.
  int controlFd() const noexcept { return control_fd_.get(); }
  int dataFd() const noexcept { return data_fd_.get(); }
  // The data segment's fd the client gets: a producer's own, writable one; a
  // consumer's read-only file (keepReadOnlyDataFd), which it can never map
  // writable; -1 when a consumer has none.
  int clientDataFd(uint32_t role) const noexcept {
    return role == FL_ROLE_PRODUCER ? data_fd_.get() : read_only_data_fd_.get();
  }
  // Holds the segment's rdma registration until the segment goes:
  // deregistered before the memory is unmapped.  Called once, before the
  // client reaches the data agent.
  void holdRegistration(SegmentRegistration registration) noexcept {
    local_key_ = registration.local_key;
    registration_ = std::move(registration.handle);
  }
  // What the segments count against the daemon's memory caps
  // (SegmentQuota::Charge), given back when the last holder of the segments
  // lets go -- on whatever thread that is.
  void holdCharge(std::shared_ptr<void> charge) noexcept { charge_ = std::move(charge); }
  // The registration's key for sends from this segment (SendRequest::local_key);
  // none without a registration.
  std::optional<uint32_t> localKey() const noexcept { return local_key_; }
  // A new, read-only file of the data segment: what the daemon lends readers
  // on this host and gives a consumer, who cannot map it writable.  False
  // (errno set) when it cannot be opened.
  bool keepReadOnlyDataFd() noexcept;
  int readOnlyDataFd() const noexcept { return read_only_data_fd_.get(); }

 private:
  ClientSegments() = default;
  // The header and both rings of a fresh control segment.
  void initControl(const SegmentRequest& request);
  // Sizes sealed on both memfds; a consumer's data also against new writable mappings.
  Status seal(uint32_t role);

  std::shared_ptr<void> charge_;  // first member: released last, once the memory is gone
  UniqueFd control_fd_;
  UniqueFd data_fd_;
  UniqueFd read_only_data_fd_;
  Mapping control_;
  Mapping data_;
  SegmentGeometry geometry_;
  uint32_t slot_count_ = 0;
  uint64_t slot_size_ = 0;
  bool hugepages_ = false;
  std::optional<uint32_t> local_key_;
  std::shared_ptr<void> registration_;  // last member: released first
};

}  // namespace framelink
