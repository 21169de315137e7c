// In-process libframelink helpers for the integration tests: an owning
// handle, attach with a status, and "send a few frames and check that they
// arrive" (used after every bad-input test to show the daemons still serve).
#pragma once

#include <framelink/framelink.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace framelink::integ {

class Client {
 public:
  Client() = default;
  explicit Client(fl_client* c) noexcept : c_(c) {}
  Client(Client&& o) noexcept : c_(o.c_) { o.c_ = nullptr; }
  Client& operator=(Client&& o) noexcept {
    if (this != &o) {
      reset();
      c_ = o.c_;
      o.c_ = nullptr;
    }
    return *this;
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { reset(); }

  void reset() noexcept {
    fl_detach(c_);
    c_ = nullptr;
  }
  fl_client* get() const noexcept { return c_; }
  explicit operator bool() const noexcept { return c_ != nullptr; }

 private:
  fl_client* c_ = nullptr;
};

struct AttachResult {
  int status = -1;
  std::string message;  // fl_last_error() when status != FL_OK
  Client client;
};

AttachResult tryAttach(const std::string& socket, uint32_t role, const std::string& stream,
                       uint32_t slot_count, uint64_t slot_size);
// REQUIREs success.
Client attachProducer(const DaemonProcess& d, const std::string& stream, uint32_t slot_count = 4,
                      uint64_t slot_size = 1 << 20);
Client attachConsumer(const DaemonProcess& d, const std::string& stream, uint32_t slot_count = 4,
                      uint64_t slot_size = 1 << 20);

// Any role; a consumer that subscribes gets every frame of the stream (else
// it is a member of the stream's queue group), one with `pull` asks for its
// stream's frames from peers to be pulled.  REQUIREs success.
Client attachWith(const DaemonProcess& d, uint32_t role, const std::string& stream, bool subscribe,
                  uint32_t slot_count = 4, uint64_t slot_size = 256 * 1024, bool pull = false);

// Acquires a slot (bounded wait), fills it with the synthetic pattern of
// `frame_id` (frame_pattern.h), sets the metadata and submits.  REQUIREs success.
uint32_t submitFrame(fl_client* producer, uint64_t frame_id, uint64_t length, bool crc = false);
// The same without Catch (which is not thread-safe), for a thread of its
// own: empty, or what failed.
std::string trySubmitFrame(fl_client* producer, uint64_t frame_id, uint64_t length, bool crc = false,
                           uint32_t* index = nullptr);

// Waits for the next frame; REQUIREs one within `timeout`.
fl_frame receiveFrame(fl_client* consumer, Millis timeout);

// Checks payload, group_id, attrs and length of a synthetic frame.
void checkSyntheticFrame(const fl_frame& frame, uint64_t expected_id, uint64_t expected_length);

// Collects producer completions until `count` have arrived or `timeout`
// expires (returns what arrived).
std::vector<fl_completion> collectCompletions(fl_client* producer, size_t count, Millis timeout);

// A fresh producer on `a` and consumer on `b` for `stream`: sends `frames`
// synthetic frames and REQUIREs every one delivered, verified and DELIVERED
// (FL_OK) to the producer.  This is "the daemons still serve everyone else".
void requireServing(const DaemonProcess& a, const DaemonProcess& b, const std::string& stream,
                    int frames = 3);

// A daemon's counter, polled until it is at least `at_least` or 20 s passed
// (the agent publishes its stats twice a second, so a count lags the frames
// behind it); returns the last value read.
int64_t waitForMetric(const DaemonProcess& d, const std::string& name, int64_t at_least);

std::string statusName(int status);

}  // namespace framelink::integ
