// libframelink against an in-process fake framelinkd: the real attach path
// (SOCK_SEQPACKET + SCM_RIGHTS), real memfd segments and eventfds, with the
// test playing the daemon's side of the rings.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
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

namespace {

uint64_t roundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

int countOpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the DIR's own fd
}

bool contains(const std::string& hay, const std::string& needle) {
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
  explicit FakeDaemon(Fault fault = Fault::kNone) : fault_(fault) {
    char tmpl[] = "/tmp/framelink-test-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/framelinkd.sock";
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
    for (int fd : {conn_, listen_fd_, control_fd_, data_fd_, submit_efd_, completion_efd_})
      if (fd >= 0) close(fd);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  const std::string& path() const { return path_; }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  fl_client_options options(uint32_t role, const char* stream = "cam0") const {
    fl_client_options o;
    fl_client_options_init(&o);
    o.role = role;
    o.socket_path = path_.c_str();
    o.stream = stream;
    o.slot_count = 4;
    o.slot_size = 64 * 1024;
    return o;
  }

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
    // A full doorbell queue is a doorbell already ringing, as in framelinkd.
    if (send(completion_efd_, &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL) != sizeof(one) &&
        errno != EAGAIN)
      std::abort();
    wakes_++;
    return true;
  }
  void hangUp() {
    close(conn_);
    conn_ = -1;
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
  int submitEventfd() const { return submit_efd_; }

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
    // Doorbells as framelinkd makes them: datagram socket pairs, one end each.
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) std::abort();
    submit_efd_ = sv[0];
    client_submit_.reset(sv[1]);
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) std::abort();
    completion_efd_ = sv[0];
    client_completion_.reset(sv[1]);
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
  int control_fd_ = -1, data_fd_ = -1, submit_efd_ = -1, completion_efd_ = -1;  // the daemon's ends
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
};

// fl_attach against `d`, with the fake's thread joined afterwards.
fl_client* attach(FakeDaemon& d, const fl_client_options& o) {
  fl_client* c = nullptr;
  int rc = fl_attach(&o, &c);
  d.join();
  INFO(fl_last_error());
  REQUIRE(rc == FL_OK);
  REQUIRE(c != nullptr);
  return c;
}

}  // namespace

// ---------------------------------------------------------------- library

TEST_CASE("version and status strings", "[client]") {
  CHECK(std::string(fl_version()) == "0.1.0");
  REQUIRE(fl_last_error() != nullptr);
  const int codes[] = {FL_OK,
                       FL_EAGAIN,
                       FL_ETIMEDOUT,
                       FL_EINVAL,
                       FL_EINTR,
                       FL_EBUSY,
                       FL_ERR_BAD_SLOT,
                       FL_ERR_SLOT_NOT_OWNED,
                       FL_ERR_TOO_LARGE,
                       FL_ERR_BAD_METADATA,
                       FL_ERR_BAD_DESCRIPTOR,
                       FL_ERR_DOUBLE_RELEASE,
                       FL_ERR_NO_CONSUMER,
                       FL_ERR_TIMEOUT,
                       FL_ERR_PEER_REJECTED,
                       FL_ERR_CRC_MISMATCH,
                       FL_ERR_NO_ROUTE,
                       FL_ERR_LINK_LOST,
                       FL_ERR_SHUTDOWN,
                       FL_ERR_DAEMON_UNREACHABLE,
                       FL_ERR_ATTACH_REFUSED,
                       FL_ERR_QUOTA,
                       FL_ERR_VERSION,
                       FL_ERR_BAD_REQUEST,
                       FL_ERR_DAEMON_GONE,
                       FL_ERR_RESOURCES,
                       FL_ERR_RING_CORRUPT,
                       FL_ERR_AUTH,
                       FL_ERR_PEER_VERSION,
                       FL_ERR_PROTOCOL,
                       FL_ERR_UNKNOWN_STREAM,
                       FL_ERR_UNKNOWN_CREDIT,
                       FL_ERR_TRANSPORT,
                       FL_ERR_DEVICE};
  for (int code : codes) {
    std::string s = fl_status_str(code);
    INFO(code << " -> " << s);
    CHECK(s.rfind("FL_", 0) == 0);
    CHECK(contains(s, ": "));
    CHECK(s.size() > 12);
  }
  CHECK(std::string(fl_status_str(FL_ERR_TOO_LARGE)) ==
        "FL_ERR_TOO_LARGE: frame length exceeds the slot size");
  CHECK(std::string(fl_status_str(9999)) == "unknown status 9999");
  CHECK(std::string(fl_status_str(-1)) == "unknown status -1");
}

TEST_CASE("fl_attach to a socket nobody listens on", "[client]") {
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_PRODUCER;
  o.stream = "cam0";
  o.socket_path = "/nonexistent/framelink/framelinkd.sock";
  fl_client* c = reinterpret_cast<fl_client*>(0x1);
  CHECK(fl_attach(&o, &c) == FL_ERR_DAEMON_UNREACHABLE);
  CHECK(c == nullptr);
  std::string msg = fl_last_error();
  CHECK(contains(msg, "/nonexistent/framelink/framelinkd.sock"));
  CHECK(contains(msg, "is framelinkd running? (systemctl status framelinkd)"));

  SECTION("$FRAMELINK_SOCKET is used when no path is given") {
    setenv("FRAMELINK_SOCKET", "/nonexistent/from-env.sock", 1);
    o.socket_path = nullptr;
    CHECK(fl_attach(&o, &c) == FL_ERR_DAEMON_UNREACHABLE);
    CHECK(contains(fl_last_error(), "/nonexistent/from-env.sock"));
    unsetenv("FRAMELINK_SOCKET");
  }
}

TEST_CASE("fl_attach rejects bad arguments locally", "[client]") {
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_PRODUCER;
  o.socket_path = "/nonexistent.sock";
  fl_client* c = nullptr;
  const std::string long64(64, 'a');
  const std::string ok63(63, 'a');
  for (const char* bad : {"", "cam 0", "cam/0", "cam0\n", "kamera-\xc3\xa4", "*", long64.c_str()}) {
    o.stream = bad;
    INFO("stream '" << bad << "'");
    CHECK(fl_attach(&o, &c) == FL_EINVAL);
    CHECK(contains(fl_last_error(), "[A-Za-z0-9._-]"));
  }
  o.stream = nullptr;
  CHECK(fl_attach(&o, &c) == FL_EINVAL);
  for (const char* good : {"cam0", "A.b_c-9", ok63.c_str()}) {
    o.stream = good;
    CHECK(fl_attach(&o, &c) == FL_ERR_DAEMON_UNREACHABLE);  // passed validation
  }
  o.stream = "cam0";
  o.role = 3;
  CHECK(fl_attach(&o, &c) == FL_EINVAL);
  o.role = FL_CONSUMER;
  o.struct_size = 8;
  CHECK(fl_attach(&o, &c) == FL_EINVAL);
  CHECK(fl_attach(nullptr, &c) == FL_EINVAL);
  CHECK(fl_attach(&o, nullptr) == FL_EINVAL);
  fl_detach(nullptr);  // allowed
}

// ---------------------------------------------------------------- attach

TEST_CASE("attach sends the request and maps the segments", "[client]") {
  FakeDaemon d;
  fl_client_options o = d.options(FL_PRODUCER, "wafer.cam-1");
  o.client_name = "unit-test";
  fl_client* c = attach(d, o);
  CHECK(d.request().magic == FL_ATTACH_MAGIC);
  CHECK(d.request().version == FL_ATTACH_VERSION);
  CHECK(d.request().role == FL_ROLE_PRODUCER);
  CHECK(d.request().slot_count == 4);
  CHECK(d.request().slot_size == 64 * 1024);
  CHECK(std::string(d.request().stream) == "wafer.cam-1");
  CHECK(std::string(d.request().client_name) == "unit-test");
  CHECK(d.request().flags == 0);

  fl_client_info info{};
  REQUIRE(fl_client_get_info(c, &info) == FL_OK);
  CHECK(info.client_id == 77);
  CHECK(info.slot_count == 4);
  CHECK(info.slot_size == 64 * 1024);
  CHECK(info.role == FL_PRODUCER);
  CHECK(info.daemon_pid == static_cast<uint64_t>(getpid()));
  CHECK(info.daemon_start_ns == 123456789);
  CHECK(fl_check_daemon(c) == FL_OK);
  int efd = fl_doorbell_fd(c);
  CHECK(efd >= 0);
  CHECK((fcntl(efd, F_GETFD) & FD_CLOEXEC) != 0);
  fl_detach(c);
}

TEST_CASE("attach failures are reported and leak nothing", "[client]") {
  struct Case {
    Fault fault;
    int status;
    const char* text;
  };
  const Case cases[] = {
      {Fault::kRefuse, FL_ERR_QUOTA, "max_client_bytes"},
      {Fault::kBadMagic, FL_ERR_VERSION, "magic"},
      {Fault::kBadLayoutVersion, FL_ERR_VERSION, "layout version"},
      {Fault::kRingOutOfBounds, FL_ERR_RING_CORRUPT, "do not fit"},
      {Fault::kSlotsOutOfBounds, FL_ERR_RING_CORRUPT, "do not fit"},
      {Fault::kThreeFds, FL_ERR_VERSION, "file descriptors"},
      {Fault::kNotServing, FL_ERR_DAEMON_GONE, "attach again"},
      {Fault::kSilentClose, FL_ERR_DAEMON_UNREACHABLE, "closed the connection"},
  };
  for (const Case& k : cases) {
    const int before = countOpenFds();
    {
      FakeDaemon d(k.fault);
      fl_client_options o = d.options(FL_PRODUCER);
      fl_client* c = nullptr;
      int rc = fl_attach(&o, &c);
      d.join();
      INFO("fault " << static_cast<int>(k.fault) << ": " << fl_last_error());
      CHECK(rc == k.status);
      CHECK(c == nullptr);
      CHECK(contains(fl_last_error(), k.text));
    }
    CHECK(countOpenFds() == before);
  }
}

// ---------------------------------------------------------------- producer

TEST_CASE("producer: acquire, metadata, submit, completion", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));

  fl_slot slots[4];
  for (uint32_t i = 0; i < 4; ++i) {
    REQUIRE(fl_acquire(c, 0, &slots[i]) == FL_OK);
    CHECK(slots[i].index == i);
    CHECK(slots[i].capacity == 64 * 1024);
    std::memset(slots[i].data, static_cast<int>(i + 1), slots[i].capacity);  // writable
  }
  fl_slot extra{};
  CHECK(fl_acquire(c, 0, &extra) == FL_EAGAIN);
  auto t0 = std::chrono::steady_clock::now();
  CHECK(fl_acquire(c, 50, &extra) == FL_ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(45));
  CHECK(contains(fl_last_error(), "timed out after 50 ms"));

  // Metadata with CRC on slot 0.
  const char attrs[] = "frame=7;wafer=0";
  fl_frame_meta meta{};
  meta.frame_id = 7;
  meta.wafer_id = 0;
  meta.timestamp_ns = 111;
  meta.flags = FL_META_CRC32C;
  meta.attr_length = sizeof(attrs) - 1;
  meta.attrs = reinterpret_cast<const uint8_t*>(attrs);
  REQUIRE(fl_set_meta(c, 0, &meta) == FL_OK);
  REQUIRE(fl_submit(c, 0, 5000) == FL_OK);
  uint32_t n = 0;
  REQUIRE(fl_in_flight(c, &n) == FL_OK);
  CHECK(n == 1);

  fl_submit_desc sd{};
  REQUIRE(d.popSubmit(sd));
  CHECK(sd.slot == 0);
  CHECK(sd.length == 5000);
  CHECK(sd.flags == 0);
  CHECK_FALSE(d.popSubmit(sd));
  const fl_slot_header* h = d.slotHeader(0);
  CHECK(h->frame_id == 7);
  CHECK(h->timestamp_ns == 111);
  CHECK(h->attr_length == sizeof(attrs) - 1);
  CHECK(std::memcmp(h->attrs, attrs, sizeof(attrs) - 1) == 0);
  CHECK((h->flags & FL_SLOT_HAS_CRC32C) != 0);
  CHECK(h->crc32c == fl_crc32c(0, d.slotData(0), 5000));

  // No CRC requested: the flag is clear.
  REQUIRE(fl_submit(c, 1, 10) == FL_OK);
  REQUIRE(d.popSubmit(sd));
  CHECK(sd.slot == 1);
  CHECK((d.slotHeader(1)->flags & FL_SLOT_HAS_CRC32C) == 0);

  // Misuse is caught locally.
  CHECK(fl_submit(c, 0, 10) == FL_EINVAL);  // in flight
  CHECK(contains(fl_last_error(), "in flight"));
  CHECK(fl_submit(c, 2, 64 * 1024 + 1) == FL_ERR_TOO_LARGE);
  CHECK(contains(fl_last_error(), "slot size"));
  CHECK(fl_submit(c, 99, 10) == FL_EINVAL);
  meta.attr_length = FL_MAX_ATTR_BYTES + 1;
  CHECK(fl_set_meta(c, 2, &meta) == FL_EINVAL);
  meta.attr_length = 0;
  meta.flags = 0x80;
  CHECK(fl_set_meta(c, 2, &meta) == FL_EINVAL);
  CHECK(fl_set_meta(c, 1, &meta) == FL_EINVAL);  // in flight
  fl_frame f{};
  CHECK(fl_receive(c, &f, 0) == FL_EINVAL);  // consumer call

  // Abandon returns a slot; it can be acquired again.
  REQUIRE(fl_abandon(c, 3) == FL_OK);
  CHECK(fl_abandon(c, 3) == FL_EINVAL);
  REQUIRE(fl_acquire(c, 0, &extra) == FL_OK);
  CHECK(extra.index == 3);

  // Completions: nothing yet, then the daemon finishes slot 1 (failed) and 0 (delivered).
  fl_completion comps[8];
  size_t count = 99;
  REQUIRE(fl_poll_completions(c, comps, 8, &count) == FL_OK);
  CHECK(count == 0);
  d.pushCompletion(fl_completion_desc{1, FL_ERR_NO_ROUTE, 0, 10, 0});
  d.pushCompletion(fl_completion_desc{0, FL_OK, 5, 5000, 7});
  // Acquire drains them to find a free slot; they are still reported after.
  REQUIRE(fl_acquire(c, 0, &extra) == FL_OK);
  CHECK((extra.index == 0 || extra.index == 1));
  REQUIRE(fl_poll_completions(c, comps, 8, &count) == FL_OK);
  REQUIRE(count == 2);
  CHECK(comps[0].slot == 1);
  CHECK(comps[0].status == FL_ERR_NO_ROUTE);
  CHECK(comps[1].slot == 0);
  CHECK(comps[1].status == FL_OK);
  CHECK(comps[1].sequence == 5);
  CHECK(comps[1].length == 5000);
  CHECK(comps[1].frame_id == 7);
  REQUIRE(fl_in_flight(c, &n) == FL_OK);
  CHECK(n == 0);
  CHECK(fl_wait_completions(c, comps, 8, &count, 0) == FL_EAGAIN);
  CHECK(fl_wait_completions(c, comps, 8, &count, 20) == FL_ETIMEDOUT);
  fl_detach(c);
}

TEST_CASE("producer: a completion for a slot not in flight is corruption", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  d.pushCompletion(fl_completion_desc{2, FL_OK, 0, 0, 0});
  fl_completion comp{};
  size_t count = 0;
  CHECK(fl_poll_completions(c, &comp, 1, &count) == FL_ERR_RING_CORRUPT);
  CHECK(contains(fl_last_error(), "slot 2"));
  fl_slot s{};
  CHECK(fl_acquire(c, 0, &s) == FL_ERR_RING_CORRUPT);  // latched
  fl_detach(c);
}

TEST_CASE("producer: a blocked acquire wakes on a completion", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  fl_slot s{};
  for (uint32_t i = 0; i < 4; ++i) {
    REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
    REQUIRE(fl_submit(c, s.index, 1) == FL_OK);
  }
  std::atomic<bool> rang{false};
  std::thread daemon([&] {
    // Wait until the client announced it sleeps, then complete slot 2.
    while (__atomic_load_n(&d.completionRing()->reader_sleeping, __ATOMIC_ACQUIRE) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fl_completion_desc cd{2, FL_OK, 1, 1, 0};
    fl_ring_push(d.completionRing(), d.completionRing()->capacity, sizeof(cd), &cd);
    rang = d.ringIfAsleep();
  });
  auto t0 = std::chrono::steady_clock::now();
  int rc = fl_acquire(c, 10000, &s);
  auto waited = std::chrono::steady_clock::now() - t0;
  daemon.join();
  INFO(fl_last_error());
  REQUIRE(rc == FL_OK);
  CHECK(s.index == 2);
  CHECK(rang.load());
  CHECK(waited < std::chrono::seconds(5));
  CHECK(d.completionRing()->reader_sleeping == 0);  // cleared after the wait
  fl_detach(c);
}

TEST_CASE("producer: the daemon is woken only while it sleeps", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  fl_slot s{};
  uint64_t v = 0;
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 1) == FL_OK);
  CHECK(read(d.submitEventfd(), &v, sizeof(v)) < 0);  // awake daemon: no system call
  fl_ring_prepare_sleep(d.submitRing());
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 1) == FL_OK);
  CHECK(read(d.submitEventfd(), &v, sizeof(v)) == sizeof(v));
  CHECK(v == 1);
  fl_detach(c);
}

TEST_CASE("producer: the doorbell fd turns readable after an empty poll", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  fl_slot s{};
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 1) == FL_OK);
  fl_completion comp{};
  size_t count = 0;
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);
  REQUIRE(count == 0);
  pollfd p{fl_doorbell_fd(c), POLLIN, 0};
  CHECK(poll(&p, 1, 0) == 0);
  d.pushCompletion(fl_completion_desc{s.index, FL_OK, 0, 1, 0});
  CHECK(d.wakes() == 1);
  CHECK(poll(&p, 1, 1000) == 1);
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);
  CHECK(count == 1);
  fl_detach(c);
}

TEST_CASE("producer: a dead daemon ends blocking waits", "[client]") {
  SECTION("socket hang-up") {
    FakeDaemon d;
    fl_client* c = attach(d, d.options(FL_PRODUCER));
    fl_slot s{};
    for (int i = 0; i < 4; ++i) REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      d.hangUp();
    });
    int rc = fl_acquire(c, -1, &s);  // would block forever without the socket in the poll set
    killer.join();
    CHECK(rc == FL_ERR_DAEMON_GONE);
    CHECK(fl_check_daemon(c) == FL_ERR_DAEMON_GONE);
    CHECK(fl_submit(c, 0, 1) == FL_ERR_DAEMON_GONE);
    fl_detach(c);
  }
  SECTION("daemon_state") {
    FakeDaemon d;
    fl_client* c = attach(d, d.options(FL_PRODUCER));
    CHECK(fl_check_daemon(c) == FL_OK);
    d.setState(FL_DAEMON_DETACHED);
    CHECK(fl_check_daemon(c) == FL_ERR_DAEMON_GONE);
    fl_completion comp{};
    size_t count = 0;
    CHECK(fl_wait_completions(c, &comp, 1, &count, 1000) == FL_ERR_DAEMON_GONE);
    fl_detach(c);
  }
  SECTION("fl_check_daemon sees the hang-up") {
    FakeDaemon d;
    fl_client* c = attach(d, d.options(FL_PRODUCER));
    d.hangUp();
    CHECK(fl_check_daemon(c) == FL_ERR_DAEMON_GONE);
    fl_detach(c);
  }
}

TEST_CASE("producer: several threads share one client", "[client]") {
  // Two application threads acquire and submit; the fake daemon completes
  // every frame, sleeping on its doorbell when idle.  A lost wake-up on
  // either side would hang (the waits have a deadline), a slot handed out
  // twice shows as a submit of a slot the daemon still has in flight.
  constexpr int kPerThread = 3000;
  constexpr int kThreads = 2;
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  std::atomic<int> daemon_errors{0};
  std::atomic<int> completed{0};
  std::thread daemon([&] {
    pollfd p{d.submitEventfd(), POLLIN, 0};
    while (completed.load() < kThreads * kPerThread) {
      fl_submit_desc sd{};
      if (d.popSubmit(sd)) {
        if (sd.slot >= 4) daemon_errors++;
        fl_completion_desc cd{sd.slot, FL_OK, 0, sd.length, 0};
        if (fl_ring_push(d.completionRing(), d.completionRing()->capacity, sizeof(cd), &cd) != FL_RING_OK)
          daemon_errors++;
        d.ringIfAsleep();
        completed++;
        continue;
      }
      if (fl_ring_prepare_sleep(d.submitRing())) {
        if (poll(&p, 1, 2000) == 0 && fl_ring_readable(d.submitRing()) == 0) {
          daemon_errors++;  // nothing for 2 s: the client stopped submitting
          fl_ring_end_sleep(d.submitRing());
          break;
        }
        uint64_t v;
        (void)!read(d.submitEventfd(), &v, sizeof(v));
      }
      fl_ring_end_sleep(d.submitRing());
    }
  });
  std::atomic<int> app_errors{0};
  std::vector<std::thread> apps;
  for (int t = 0; t < kThreads; ++t) {
    apps.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        fl_slot s{};
        if (fl_acquire(c, 5000, &s) != FL_OK || fl_submit(c, s.index, 16) != FL_OK) {
          app_errors++;
          return;
        }
      }
    });
  }
  // This thread collects completions meanwhile: a third kind of waiter.
  fl_completion comps[16];
  size_t total = 0;
  int wait_rc = FL_OK;
  while (total < static_cast<size_t>(kThreads * kPerThread)) {
    size_t n = 0;
    wait_rc = fl_wait_completions(c, comps, 16, &n, 5000);
    if (wait_rc != FL_OK) break;
    total += n;
  }
  for (auto& t : apps) t.join();
  daemon.join();
  INFO(fl_last_error());
  CHECK(wait_rc == FL_OK);
  CHECK(app_errors.load() == 0);
  CHECK(daemon_errors.load() == 0);
  CHECK(completed.load() == kThreads * kPerThread);
  CHECK(total == static_cast<size_t>(kThreads * kPerThread));
  uint32_t in_flight = 1;
  REQUIRE(fl_in_flight(c, &in_flight) == FL_OK);
  CHECK(in_flight == 0);
  fl_detach(c);
}

TEST_CASE("producer: an application that reads completions never loses one", "[client]") {
  // A reader that falls behind by the whole local queue (a GC pause, a slow
  // collector thread) holds acquirers back instead of losing completions.
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  fl_completion comps[64];
  size_t count = 0;
  REQUIRE(fl_poll_completions(c, comps, 64, &count) == FL_OK);  // reads completions from now on
  REQUIRE(count == 0);
  uint64_t sequence = 0;
  fl_slot s{};
  int rc = FL_OK;
  while ((rc = fl_acquire(c, 0, &s)) == FL_OK) {
    REQUIRE(fl_submit(c, s.index, 8) == FL_OK);
    fl_submit_desc sd{};
    REQUIRE(d.popSubmit(sd));
    d.pushCompletion(fl_completion_desc{sd.slot, FL_OK, ++sequence, sd.length, 0});
    REQUIRE(sequence < 100000);  // the queue is bounded: acquiring must stop
  }
  CHECK(rc == FL_EAGAIN);
  CHECK(contains(fl_last_error(), "completions wait unread"));
  CHECK(contains(fl_last_error(), "fl_poll_completions"));
  // A blocking acquire waits for the reader, not for the daemon.
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    size_t n = 0;
    fl_completion one{};
    (void)fl_poll_completions(c, &one, 1, &n);
  });
  CHECK(fl_acquire(c, 5000, &s) == FL_OK);
  reader.join();
  CHECK(fl_abandon(c, s.index) == FL_OK);
  // Every completion comes out, in order, none dropped.
  uint64_t expect = 2;  // the reader took the first
  for (;;) {
    REQUIRE(fl_poll_completions(c, comps, 64, &count) == FL_OK);
    if (count == 0) break;
    for (size_t i = 0; i < count; ++i) {
      REQUIRE(comps[i].sequence == expect);
      ++expect;
    }
  }
  CHECK(expect == sequence + 1);
  uint32_t in_flight = 1;
  REQUIRE(fl_in_flight(c, &in_flight) == FL_OK);
  CHECK(in_flight == 0);
  fl_detach(c);
}

TEST_CASE("producer: an application that never reads completions keeps acquiring", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  constexpr uint64_t kFrames = 10000;  // more than the local queue holds
  for (uint64_t i = 1; i <= kFrames; ++i) {
    fl_slot s{};
    REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
    REQUIRE(fl_submit(c, s.index, 8) == FL_OK);
    fl_submit_desc sd{};
    REQUIRE(d.popSubmit(sd));
    d.pushCompletion(fl_completion_desc{sd.slot, FL_OK, i, sd.length, 0});
  }
  // The newest are kept: the last one read is the last one completed.
  fl_completion comps[64];
  size_t count = 0;
  uint64_t last = 0;
  size_t total = 0;
  do {
    REQUIRE(fl_poll_completions(c, comps, 64, &count) == FL_OK);
    for (size_t i = 0; i < count; ++i) {
      CHECK(comps[i].sequence > last);
      last = comps[i].sequence;
    }
    total += count;
  } while (count > 0);
  CHECK(last == kFrames);
  CHECK(total < kFrames);
  fl_detach(c);
}

// ---------------------------------------------------------------- consumer

TEST_CASE("consumer: receive, read-only data, release", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_CONSUMER));
  fl_frame f{};
  CHECK(fl_receive(c, &f, 0) == FL_EAGAIN);
  fl_slot s{};
  CHECK(fl_acquire(c, 0, &s) == FL_EINVAL);  // producer call

  fl_slot_header* h = d.slotHeader(2);
  h->frame_id = 42;
  h->wafer_id = 1;
  h->timestamp_ns = 999;
  h->length = 3000;
  h->sequence = 17;
  h->crc32c = 0xABCD;
  h->flags = FL_SLOT_HAS_CRC32C;
  h->attr_length = 4;
  std::memcpy(h->attrs, "a=b;", 4);
  std::memset(d.slotData(2), 0x5A, 3000);
  d.pushCompletion(fl_completion_desc{2, FL_OK, 17, 3000, 42});

  REQUIRE(fl_receive(c, &f, 1000) == FL_OK);
  CHECK(f.slot == 2);
  CHECK(f.frame_id == 42);
  CHECK(f.wafer_id == 1);
  CHECK(f.timestamp_ns == 999);
  CHECK(f.length == 3000);
  CHECK(f.sequence == 17);
  CHECK(f.crc32c == 0xABCD);
  CHECK(f.flags == FL_SLOT_HAS_CRC32C);
  CHECK(f.attr_length == 4);
  CHECK(std::memcmp(f.attrs, "a=b;", 4) == 0);
  CHECK(f.data[0] == 0x5A);
  CHECK(f.data[2999] == 0x5A);

  // The consumer's data mapping is read-only: a write faults.
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    const_cast<uint8_t*>(f.data)[0] = 1;
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));

  REQUIRE(fl_release(c, 2) == FL_OK);
  fl_submit_desc sd{};
  REQUIRE(d.popSubmit(sd));
  CHECK(sd.slot == 2);
  CHECK(fl_release(c, 2) == FL_ERR_DOUBLE_RELEASE);
  CHECK(contains(fl_last_error(), "slot 2"));
  CHECK(fl_release(c, 1000) == FL_ERR_DOUBLE_RELEASE);
  CHECK_FALSE(d.popSubmit(sd));

  // The daemon's error notice for a bad release.
  d.pushCompletion(fl_completion_desc{3, FL_ERR_DOUBLE_RELEASE, 0, 0, 0});
  CHECK(fl_receive(c, &f, 0) == FL_ERR_DOUBLE_RELEASE);
  CHECK(contains(fl_last_error(), "rejected"));
  CHECK(contains(fl_last_error(), "slot 3"));
  fl_detach(c);
}

TEST_CASE("consumer: a blocked receive wakes on delivery", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_CONSUMER));
  d.slotHeader(0)->length = 1;
  std::thread daemon([&] {
    while (__atomic_load_n(&d.completionRing()->reader_sleeping, __ATOMIC_ACQUIRE) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    fl_completion_desc cd{0, FL_OK, 1, 1, 0};
    fl_ring_push(d.completionRing(), d.completionRing()->capacity, sizeof(cd), &cd);
    d.ringIfAsleep();
  });
  fl_frame f{};
  int rc = fl_receive(c, &f, 10000);
  daemon.join();
  REQUIRE(rc == FL_OK);
  CHECK(f.slot == 0);
  CHECK(d.wakes() == 1);
  fl_detach(c);
}

TEST_CASE("consumer: invalid deliveries are corruption", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_CONSUMER));
  fl_frame f{};
  SECTION("length beyond the slot") {
    d.slotHeader(1)->length = 64 * 1024 + 1;
    d.pushCompletion(fl_completion_desc{1, FL_OK, 0, 0, 0});
    CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);
  }
  SECTION("attribute length") {
    d.slotHeader(1)->attr_length = FL_MAX_ATTR_BYTES + 1;
    d.pushCompletion(fl_completion_desc{1, FL_OK, 0, 0, 0});
    CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);
  }
  SECTION("slot out of range") {
    d.pushCompletion(fl_completion_desc{4, FL_OK, 0, 0, 0});
    CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);
  }
  SECTION("ring indices") {
    d.completionRing()->tail = 1000;
    CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);
  }
  CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);  // latched
  fl_detach(c);
}

// ---------------------------------------------------------------- C++ wrapper

TEST_CASE("C++ wrapper: RAII leases and frames", "[client]") {
  SECTION("errors throw with the status") {
    framelink::Options o;
    o.stream = "cam0";
    o.socket_path = "/nonexistent.sock";
    try {
      framelink::Producer p(o);
      FAIL("no exception");
    } catch (const framelink::Error& e) {
      CHECK(e.status() == FL_ERR_DAEMON_UNREACHABLE);
      CHECK(contains(e.what(), "/nonexistent.sock"));
    }
  }
  SECTION("producer") {
    FakeDaemon d;
    framelink::Options o;
    o.stream = "cam0";
    o.socket_path = d.path();
    o.slot_count = 2;
    framelink::Producer p(o);
    d.join();
    CHECK(p.info().slot_count == 2);
    {
      auto lease = p.acquire(0);
      REQUIRE(lease);
      CHECK(lease->index() == 0);
      // dropped without submit: abandoned
    }
    auto a = p.acquire(0);
    REQUIRE(a);
    CHECK(a->index() == 0);
    a->setMeta({5, 0, 1, true, "x=1"});
    std::memset(a->data(), 7, 100);
    a->submit(100);
    CHECK(p.inFlight() == 1);
    auto b = p.acquire(0);
    REQUIRE(b);
    CHECK_FALSE(p.acquire(0).has_value());
    CHECK_THROWS_AS(b->submit(b->capacity() + 1), framelink::Error);
    d.pushCompletion(fl_completion_desc{0, FL_OK, 0, 100, 5});
    auto done = p.waitCompletions(1000);
    REQUIRE(done.size() == 1);
    CHECK(done[0].frame_id == 5);
  }
  SECTION("consumer") {
    FakeDaemon d;
    framelink::Options o;
    o.stream = "cam0";
    o.socket_path = d.path();
    framelink::Consumer cons(o);
    d.join();
    CHECK_FALSE(cons.receive(0).has_value());
    d.slotHeader(1)->length = 8;
    d.pushCompletion(fl_completion_desc{1, FL_OK, 0, 8, 0});
    {
      auto f = cons.receive(1000);
      REQUIRE(f);
      CHECK(f->slot() == 1);
      CHECK(f->size() == 8);
    }  // released here
    fl_submit_desc sd{};
    REQUIRE(d.popSubmit(sd));
    CHECK(sd.slot == 1);
    framelink::Consumer moved = std::move(cons);
    CHECK(moved);
    CHECK_FALSE(cons);
  }
}
