#include "raw_client.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "frame_pattern.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"

namespace framelink::integ {

fl_attach_request makeAttachRequest(uint32_t role, const std::string& stream, uint32_t slot_count,
                                    uint64_t slot_size) {
  fl_attach_request req;
  std::memset(&req, 0, sizeof req);
  req.magic = FL_ATTACH_MAGIC;
  req.version = FL_ATTACH_VERSION;
  req.role = role;
  req.slot_count = slot_count;
  req.slot_size = slot_size;
  std::strncpy(req.stream, stream.c_str(), sizeof req.stream - 1);
  std::strncpy(req.client_name, "raw-integration-client", sizeof req.client_name - 1);
  return req;
}

int connectSeqpacket(const std::string& path) {
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof addr.sun_path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  INFO("connect(" << path << "): " << std::strerror(errno));
  if (rc != 0) ::close(s);
  REQUIRE(rc == 0);
  return s;
}

RawReply rawExchange(const std::string& socket, const void* message, size_t length, Millis timeout,
                     int* sock_out) {
  RawReply out;
  int s = connectSeqpacket(socket);
  ssize_t sent = ::send(s, message, length, MSG_NOSIGNAL);
  // A daemon may refuse a garbage message by closing first; that is a valid answer.
  if (sent < 0 && errno != EPIPE && errno != ECONNRESET) {
    ::close(s);
    FAIL("send to the attach socket: " << std::strerror(errno));
  }

  pollfd pfd{s, POLLIN, 0};
  int pr = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
  if (pr == 0) {
    out.timed_out = true;
  } else {
    alignas(8) uint8_t buf[4096];
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 8)];
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    ssize_t n = ::recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) {
      out.closed = true;
    } else {
      out.bytes = size_t(n);
      std::memcpy(&out.reply, buf, std::min(size_t(n), sizeof out.reply));
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          int fds[8];
          std::memcpy(fds, CMSG_DATA(c), nfds * sizeof(int));
          out.fds.assign(fds, fds + nfds);
        }
      }
    }
  }
  if (sock_out != nullptr) {
    *sock_out = s;
  } else {
    ::close(s);
  }
  return out;
}

RawClient::RawClient(const std::string& socket, uint32_t role, const std::string& stream, uint32_t slot_count,
                     uint64_t slot_size)
    : role_(role) {
  fl_attach_request req = makeAttachRequest(role, stream, slot_count, slot_size);
  RawReply r = rawExchange(socket, &req, sizeof req, Millis(10000), &sock_);
  for (size_t i = 0; i < r.fds.size(); ++i) {
    if (i < FL_ATTACH_FD_COUNT) {
      fds_[i] = r.fds[i];
    } else {
      ::close(r.fds[i]);
    }
  }
  INFO("raw attach: closed=" << r.closed << " timed_out=" << r.timed_out << " bytes=" << r.bytes
                             << " status=" << r.reply.status << " message=" << r.reply.message);
  REQUIRE(r.bytes == sizeof(fl_attach_reply));
  REQUIRE(r.reply.magic == FL_ATTACH_MAGIC);
  REQUIRE(r.reply.status == FL_OK);
  REQUIRE(r.reply.fd_count == FL_ATTACH_FD_COUNT);
  REQUIRE(r.fds.size() == FL_ATTACH_FD_COUNT);

  control_size_ = r.reply.control_size;
  data_size_ = r.reply.data_size;
  void* c = ::mmap(nullptr, control_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fds_[0], 0);
  REQUIRE(c != MAP_FAILED);
  control_ = static_cast<uint8_t*>(c);
  const int data_prot = role == FL_ROLE_PRODUCER ? (PROT_READ | PROT_WRITE) : PROT_READ;
  void* d = ::mmap(nullptr, data_size_, data_prot, MAP_SHARED, fds_[1], 0);
  REQUIRE(d != MAP_FAILED);
  data_ = static_cast<uint8_t*>(d);

  const fl_segment_header* h = header();
  REQUIRE(h->magic == FL_SEGMENT_MAGIC);
  REQUIRE(h->layout_version == FL_LAYOUT_VERSION);
  REQUIRE(h->role == role);
  REQUIRE(h->daemon_state == FL_DAEMON_SERVING);
  REQUIRE(h->slot_count == slot_count);
  REQUIRE(h->slot_size >= slot_size);
  REQUIRE(fl_ring_is_pow2(h->ring_capacity));
  REQUIRE(h->submit_ring_offset + fl_ring_bytes(h->ring_capacity, sizeof(fl_submit_desc)) <= control_size_);
  REQUIRE(h->completion_ring_offset + fl_ring_bytes(h->ring_capacity, sizeof(fl_completion_desc)) <=
          control_size_);
  REQUIRE(h->slots_offset + uint64_t(h->slot_count) * h->slot_stride <= data_size_);
  slot_count_ = h->slot_count;
  slot_size_ = h->slot_size;
  capacity_ = h->ring_capacity;
  REQUIRE(submitRing()->capacity == capacity_);
  REQUIRE(submitRing()->entry_size == sizeof(fl_submit_desc));
  REQUIRE(completionRing()->entry_size == sizeof(fl_completion_desc));
}

RawClient::~RawClient() {
  if (control_ != nullptr) ::munmap(control_, control_size_);
  if (data_ != nullptr) ::munmap(data_, data_size_);
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
  if (sock_ >= 0) ::close(sock_);
}

fl_ring_header* RawClient::submitRing() const noexcept {
  return reinterpret_cast<fl_ring_header*>(control_ + header()->submit_ring_offset);
}
fl_ring_header* RawClient::completionRing() const noexcept {
  return reinterpret_cast<fl_ring_header*>(control_ + header()->completion_ring_offset);
}
fl_slot_header* RawClient::slotHeader(uint32_t slot) const noexcept {
  return reinterpret_cast<fl_slot_header*>(data_ + header()->slot_headers_offset +
                                           header()->slot_header_stride * slot);
}
uint8_t* RawClient::slot(uint32_t slot) const noexcept {
  return data_ + header()->slots_offset + header()->slot_stride * slot;
}

void RawClient::doorbell() {
  uint64_t one = 1;
  // The daemon may already have dropped us; a failed write is then expected.
  (void)!::write(fds_[2], &one, sizeof one);
}

void RawClient::submit(uint32_t slot, uint64_t length, uint32_t flags) {
  fl_submit_desc d{};
  d.slot = slot;
  d.flags = flags;
  d.length = length;
  REQUIRE(fl_ring_push(submitRing(), capacity_, sizeof d, &d) == FL_RING_OK);
  // Always ring: the sleeping flag is an optimisation, a spurious wake is harmless.
  doorbell();
}

void RawClient::writeMeta(uint32_t slot, uint64_t frame_id) {
  REQUIRE(role_ == FL_ROLE_PRODUCER);
  fl_slot_header* h = slotHeader(slot);
  std::memset(h, 0, sizeof *h);
  h->frame_id = frame_id;
  h->group_id = pattern::waferOf(frame_id);
  const std::string attrs = pattern::makeAttrs(frame_id);
  h->attr_length = static_cast<uint32_t>(attrs.size());
  std::memcpy(h->attrs, attrs.data(), attrs.size());
}

std::optional<fl_completion_desc> RawClient::waitCompletion(Millis timeout) {
  fl_completion_desc d{};
  bool got = waitUntil([&] { return fl_ring_pop(completionRing(), capacity_, sizeof d, &d) == FL_RING_OK; },
                       timeout, Millis(1));
  if (!got) return std::nullopt;
  return d;
}

bool RawClient::socketClosed() {
  pollfd pfd{sock_, POLLIN, 0};
  if (::poll(&pfd, 1, 0) <= 0) return false;
  if (pfd.revents & (POLLHUP | POLLERR)) return true;
  char b;
  return ::recv(sock_, &b, 1, MSG_DONTWAIT | MSG_PEEK) == 0;
}

bool RawClient::waitDetached(Millis timeout) {
  return waitUntil(
      [&] {
        return socketClosed() ||
               __atomic_load_n(&header()->daemon_state, __ATOMIC_ACQUIRE) == FL_DAEMON_DETACHED;
      },
      timeout, Millis(5));
}

}  // namespace framelink::integ
