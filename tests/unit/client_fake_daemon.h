// The fake framelinkd the libframelink unit tests run against: the real
// attach path (SOCK_SEQPACKET + SCM_RIGHTS), real memfd segments and
// datagram doorbells, with the test playing the daemon's side of the rings.
#pragma once

#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "framelink/attach_proto.h"
#include "framelink/framelink.h"
#include "framelink/framelink.hpp"
#include "framelink/shm_layout.h"
#include "framelink/shm_ring.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace client_test {

inline uint64_t roundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

inline int countOpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the DIR's own fd
}

inline bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// What the fake daemon does wrong on purpose.
enum class Fault {
  kNone,
  kRefuse,
  kBadMagic,
  kBadLayoutVersion,
  kRingOutOfBounds,
  kSlotsOutOfBounds,
  kThreeFds,
  kNotServing,
  kSilentClose
};

class FakeDaemon {
 public:
  // at: the socket path of an earlier FakeDaemon that died (a restart);
  // empty: a fresh temporary directory.  Destroy the restarted one first.
  explicit FakeDaemon(Fault fault = Fault::kNone, const std::string& at = "") : fault_(fault) {
    if (at.empty()) {
      char tmpl[] = "/tmp/framelink-test-XXXXXX";
      REQUIRE(mkdtemp(tmpl) != nullptr);
      dir_ = tmpl;
      path_ = dir_ + "/framelinkd.sock";
    } else {
      path_ = at;
      unlink(path_.c_str());
    }
    listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    REQUIRE(listen_fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(listen(listen_fd_, 4) == 0);
    thread_ = std::thread([this] { serve(); });
  }
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  ~FakeDaemon() {
    join();
    if (control_) munmap(control_, control_size_);
    if (data_) munmap(data_, data_size_);
    for (int fd : {conn_, listen_fd_, control_fd_, data_fd_, submit_doorbell_, completion_doorbell_})
      if (fd >= 0) close(fd);
    unlink(path_.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }

  const std::string& path() const { return path_; }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  fl_client_options options(uint32_t role, const char* stream = "cam0") const {
    fl_client_options o;
    fl_client_options_init(&o);
    // The tests of the library's own answers to a daemon that went away; the
    // ones of auto_reattach (on by default) turn it on.
    o.auto_reattach = 0;
    o.role = role;
    o.socket_path = path_.c_str();
    o.stream = stream;
    o.slot_count = 4;
    o.slot_size = 64 * 1024;
    return o;
  }

  // The segment header advises this wait spin (client_wait_spin_us), as
  // framelinkd does; without a call it advises nothing, as a daemon from
  // before the advice.  Call before the client attaches.
  void adviseWaitSpin(uint32_t us) { advised_spin_us_ = us; }

  // ---- the daemon's side ----
  bool popSubmit(fl_submit_desc& d) { return fl_ring_pop(submit_, cap_, sizeof(d), &d) == FL_RING_OK; }
  void pushCompletion(const fl_completion_desc& d) {
    REQUIRE(fl_ring_push(completion_, cap_, sizeof(d), &d) == FL_RING_OK);
    ringIfAsleep();
  }
  // Called from helper threads too, so no Catch assertions inside.
  bool ringIfAsleep() {
    if (!fl_ring_reader_needs_wake(completion_)) return false;
    uint64_t one = 1;
    // A full pipe is a doorbell already ringing, as in framelinkd.
    if (write(completion_doorbell_, &one, sizeof(one)) != sizeof(one) && errno != EAGAIN) std::abort();
    wakes_++;
    return true;
  }
  void hangUp() {
    close(conn_);
    conn_ = -1;
  }
  // The daemon process is gone: its end of the attach socket closes and
  // nobody listens on the path any more (connects are refused).
  void die() {
    join();
    hangUp();
    close(listen_fd_);
    listen_fd_ = -1;
    unlink(path_.c_str());
  }
  // An fl_lend_message on the attach socket with `fds` attached (SCM_RIGHTS;
  // the caller keeps its own copies).
  void sendLend(const fl_lend_message& m, const std::vector<int>& fds) {
    std::vector<char> cbuf(CMSG_SPACE(sizeof(int) * fds.size()));
    iovec iov{const_cast<fl_lend_message*>(&m), sizeof(m)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds.empty()) {
      msg.msg_control = cbuf.data();
      msg.msg_controllen = cbuf.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    REQUIRE(sendmsg(conn_, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(m)));
  }
  void setState(uint32_t state) { __atomic_store_n(&hdr_->daemon_state, state, __ATOMIC_RELEASE); }
  fl_slot_header* slotHeader(uint32_t slot) {
    return reinterpret_cast<fl_slot_header*>(data_ + hdr_->slot_headers_offset +
                                             hdr_->slot_header_stride * slot);
  }
  uint8_t* slotData(uint32_t slot) { return data_ + hdr_->slots_offset + slot * hdr_->slot_stride; }
  fl_ring_header* completionRing() { return completion_; }
  fl_ring_header* submitRing() { return submit_; }
  const fl_attach_request& request() const { return req_; }
  int wakes() const { return wakes_.load(); }
  int submitDoorbell() const { return submit_doorbell_; }

 private:
  void serve() {
    conn_ = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn_ < 0) return;
    ssize_t n = recv(conn_, &req_, sizeof(req_), 0);
    if (n != sizeof(req_)) return;
    if (fault_ == Fault::kSilentClose) {
      hangUp();
      return;
    }
    fl_attach_reply reply{};
    reply.magic = FL_ATTACH_MAGIC;
    reply.version = FL_ATTACH_VERSION;
    reply.client_id = 77;
    if (fault_ == Fault::kRefuse) {
      reply.status = FL_ERR_QUOTA;
      std::snprintf(reply.message, sizeof(reply.message),
                    "4 slots of 65536 bytes exceed max_client_bytes; ask less");
      send(conn_, &reply, sizeof(reply), MSG_NOSIGNAL);
      return;
    }
    build();
    reply.status = FL_OK;
    reply.fd_count = FL_ATTACH_FD_COUNT;
    reply.control_size = control_size_;
    reply.data_size = data_size_;
    int fds[4] = {control_fd_, data_fd_, client_submit_.get(), client_completion_.get()};
    int nfds = fault_ == Fault::kThreeFds ? 3 : 4;
    char cbuf[CMSG_SPACE(sizeof(fds))] = {};
    iovec iov{&reply, sizeof(reply)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    sendmsg(conn_, &msg, MSG_NOSIGNAL);
    client_submit_.reset();  // the client has its own copies now
    client_completion_.reset();
  }

  // Segments laid out the way framelinkd lays them out.
  void build() {
    count_ = req_.slot_count ? req_.slot_count : 8;
    uint64_t slot_size = req_.slot_size ? req_.slot_size : 64 * 1024;
    cap_ = 1;
    while (cap_ < count_ || cap_ < 2) cap_ <<= 1;
    uint64_t sub_off = 256;
    uint64_t comp_off = roundUp(sub_off + fl_ring_bytes(cap_, sizeof(fl_submit_desc)), FL_CACHE_LINE);
    control_size_ = roundUp(comp_off + fl_ring_bytes(cap_, sizeof(fl_completion_desc)), FL_PAGE_SIZE);
    uint64_t stride = roundUp(slot_size, FL_PAGE_SIZE);
    uint64_t slots_off = roundUp(uint64_t{count_} * sizeof(fl_slot_header), FL_PAGE_SIZE);
    data_size_ = slots_off + stride * count_;

    control_fd_ = memfd_create("framelink-control", MFD_CLOEXEC);
    data_fd_ = memfd_create("framelink-data", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    // Doorbells as framelinkd makes them (proxy/attach/client_session.cpp): the submit
    // doorbell a datagram socket pair, the completion doorbell a pipe the client reads.
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) std::abort();
    submit_doorbell_ = sv[0];
    client_submit_.reset(sv[1]);
    if (pipe2(sv, O_CLOEXEC | O_NONBLOCK) != 0) std::abort();
    completion_doorbell_ = sv[1];
    client_completion_.reset(sv[0]);
    if (ftruncate(control_fd_, static_cast<off_t>(control_size_)) != 0) std::abort();
    if (ftruncate(data_fd_, static_cast<off_t>(data_size_)) != 0) std::abort();
    control_ = static_cast<uint8_t*>(
        mmap(nullptr, control_size_, PROT_READ | PROT_WRITE, MAP_SHARED, control_fd_, 0));
    data_ = static_cast<uint8_t*>(mmap(nullptr, data_size_, PROT_READ | PROT_WRITE, MAP_SHARED, data_fd_, 0));
    if (req_.role == FL_ROLE_CONSUMER &&
        fcntl(data_fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE) != 0)
      std::abort();

    hdr_ = reinterpret_cast<fl_segment_header*>(control_);
    hdr_->magic = fault_ == Fault::kBadMagic ? 0x1234 : FL_SEGMENT_MAGIC;
    hdr_->layout_version = fault_ == Fault::kBadLayoutVersion ? FL_LAYOUT_VERSION + 1 : FL_LAYOUT_VERSION;
    hdr_->role = req_.role;
    hdr_->daemon_pid = static_cast<uint64_t>(getpid());
    hdr_->daemon_start_ns = 123456789;
    hdr_->client_id = 77;
    hdr_->slot_count = count_;
    hdr_->ring_capacity = cap_;
    hdr_->slot_size = slot_size;
    hdr_->slot_stride = stride;
    hdr_->control_size = control_size_;
    hdr_->submit_ring_offset = fault_ == Fault::kRingOutOfBounds ? control_size_ - 64 : sub_off;
    hdr_->completion_ring_offset = comp_off;
    hdr_->data_size = data_size_;
    hdr_->slot_headers_offset = 0;
    hdr_->slot_header_stride = sizeof(fl_slot_header);
    hdr_->slots_offset = fault_ == Fault::kSlotsOutOfBounds ? slots_off + FL_PAGE_SIZE : slots_off;
    std::snprintf(hdr_->stream_name, sizeof(hdr_->stream_name), "%.63s", req_.stream);
    if (const int64_t advised = advised_spin_us_.load(); advised >= 0) {
      hdr_->spin_advice_flags = FL_SPIN_ADVICE_SET;
      hdr_->client_wait_spin_us = static_cast<uint32_t>(advised);
    }
    submit_ = reinterpret_cast<fl_ring_header*>(control_ + sub_off);
    completion_ = reinterpret_cast<fl_ring_header*>(control_ + comp_off);
    fl_ring_init(submit_, cap_, sizeof(fl_submit_desc));
    fl_ring_init(completion_, cap_, sizeof(fl_completion_desc));
    __atomic_store_n(
        &hdr_->daemon_state,
        fault_ == Fault::kNotServing ? uint32_t{FL_DAEMON_DETACHED} : uint32_t{FL_DAEMON_SERVING},
        __ATOMIC_RELEASE);
  }

  Fault fault_;
  std::string dir_;
  std::string path_;
  int listen_fd_ = -1;
  int conn_ = -1;
  std::thread thread_;
  fl_attach_request req_{};
  int control_fd_ = -1, data_fd_ = -1, submit_doorbell_ = -1, completion_doorbell_ = -1;  // the daemon's ends
  struct OwnedFd {
    int fd = -1;
    ~OwnedFd() { reset(); }
    void reset(int n = -1) {
      if (fd >= 0) close(fd);
      fd = n;
    }
    int get() const { return fd; }
  } client_submit_, client_completion_;  // the client's ends until they are sent
  uint8_t* control_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t control_size_ = 0, data_size_ = 0;
  uint32_t cap_ = 0, count_ = 0;
  fl_segment_header* hdr_ = nullptr;
  fl_ring_header* submit_ = nullptr;
  fl_ring_header* completion_ = nullptr;
  std::atomic<int> wakes_{0};
  std::atomic<int64_t> advised_spin_us_{-1};  // -1: no advice
};

// fl_attach against `d`, with the fake's thread joined afterwards.
inline fl_client* attach(FakeDaemon& d, const fl_client_options& o) {
  fl_client* c = nullptr;
  int rc = fl_attach(&o, &c);
  d.join();
  INFO(fl_last_error());
  REQUIRE(rc == FL_OK);
  REQUIRE(c != nullptr);
  return c;
}

}  // namespace client_test
