// FakeVerbs' private objects and helpers, shared by its source files
// (fake_verbs.cpp: devices, memory and QPs; fake_verbs_cq.cpp: CQs; fake_verbs_cm.cpp: rdma_cm).
#pragma once

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <string>

#include "fake_verbs.h"

namespace framelink::transport::rdma::testing {

struct FakeVerbs::Device {
  std::string name;
  std::string ip;
  ibv_port_state port_state;
  uint32_t max_inline_data = 0;
  ibv_device device{};
  ibv_context context{};
  std::deque<ibv_async_event> async_events;
};
struct FakeVerbs::Mr {
  ibv_mr mr{};
  int access = 0;
};
struct FakeVerbs::Mw {
  ibv_mw mw{};                 // the application's: it sets mw.rkey itself after posting a bind
  uint32_t key = 0;            // the adapter's: what the latest executed bind gave it
  const Qp* qp = nullptr;      // bound on (type 2); null while free
  const ibv_mr* mr = nullptr;  // bound to, while bound
  uint64_t addr = 0;
  uint64_t length = 0;
  int access = 0;
};
struct FakeVerbs::CompChannel {
  ibv_comp_channel channel{};
  std::deque<ibv_cq*> events;
};
struct FakeVerbs::Cq {
  ibv_cq cq{};
  CompChannel* channel = nullptr;
  std::deque<ibv_wc> wcs;
  bool armed = false;
  uint64_t events = 0;
  uint64_t acked = 0;
};
struct FakeVerbs::Qp {
  ibv_qp qp{};
  ibv_qp_cap cap{};
  Qp* peer = nullptr;
  std::deque<SendWr> pending;   // posted, not executed (paused or waiting for a receive WR)
  std::deque<uint64_t> window;  // executed, slot not yet freed by a polled completion
  std::deque<RecvWr> recvs;     // receive WRs, in posting order
};
struct FakeVerbs::EventChannel {
  rdma_event_channel channel{};
  std::deque<rdma_cm_event*> events;
};
struct FakeVerbs::Id {
  rdma_cm_id id{};
  std::string ip;
  uint16_t port = 0;
  std::string dst_ip;
  uint16_t dst_port = 0;
  Id* peer = nullptr;
  bool requested = false;  // a connect request not yet accepted or rejected
  bool connected = false;
  int ack_timeout = -1;  // setAckTimeout; -1: the rdma_cm default
};

namespace fake {

inline int newEventFd() { return ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC | EFD_SEMAPHORE); }
inline void bump(int fd) {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}
inline void unbump(int fd) {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);
}
inline std::string ipOf(const sockaddr* sa, uint16_t* port) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    if (port) *port = ntohs(v4->sin_port);
  }
  return buf;
}

}  // namespace fake
}  // namespace framelink::transport::rdma::testing
