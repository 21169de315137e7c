// libFuzzer target: the tcp data transport's receiver fed whatever a peer
// could send after the handshake (frame headers, payloads, garbage, a cut in
// the middle).  Two credits are exposed, each a buffer exactly as large as
// its capacity, so ASan reports a write past a credit.  Invariants: no crash,
// every FrameArrived names one of the credits (or reports an error status),
// says a length within that credit, and the link ends with one LinkError when
// the peer closes -- the transport never hangs on a frame that does not come.
// Reads too: one source is exposed (4096 bytes) and two reads are posted
// (read ids 1 and 2, into buffers exactly as large as the sources they ask
// for), so read requests and responses from the peer reach both sides of
// pull.  Each read completes exactly once, by the time the link ended.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/unique_fd.h"
#include "transport/tcp/tcp_transport.h"

using namespace framelink;
using namespace framelink::transport;
using framelink::transport::tcp::TcpTransport;
using framelink::transport::tcp::TcpTransportOptions;

namespace {

// A broken invariant: say which, then crash so libFuzzer keeps the input.
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_tcp_frames: %s (errno %d: %s)\n", what, errno, std::strerror(errno));
  std::abort();
}

// A connected loopback TCP pair: {transport side, peer side}.
bool tcpPair(int out[2]) {
  static int listener = [] {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0)
      fail("loopback listener");
    return fd;
  }();
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  out[1] = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(out[1], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    // libFuzzer's once-a-second SIGALRM (for -timeout) can interrupt the
    // handshake; the connection then completes in the background.
    if (errno != EINTR) return false;
    pollfd p{out[1], POLLOUT, 0};
    int pr;
    while ((pr = ::poll(&p, 1, 5000)) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t err_len = sizeof err;
    if (pr != 1 || ::getsockopt(out[1], SOL_SOCKET, SO_ERROR, &err, &err_len) != 0 || err != 0) return false;
  }
  while ((out[0] = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)) < 0 && errno == EINTR) {
  }
  return out[0] >= 0;
}

// The peer: everything, then a close (the socket buffer holds it all for
// the sizes libFuzzer generates; -max_len keeps it that way).
void sendThenClose(int fd, const uint8_t* data, size_t size) {
  size_t off = 0;
  while (off < size) {
    const ssize_t n = ::send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the transport already closed on a protocol error
    off += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
}

// The link failed: its events came with its LinkError, in the same polls.
// Counts the reads they complete into reads_done (read ids 1 and 2).
void countReadsAfterLinkError(Transport& t, int reads_done[2]) {
  TransportEvent rest[8];
  for (size_t n; (n = t.poll(rest, 8)) > 0;) {
    for (size_t i = 0; i < n; ++i) {
      if (rest[i].kind == TransportEvent::Kind::kReadComplete &&
          (rest[i].cookie == 1 || rest[i].cookie == 2)) {
        if (++reads_done[rest[i].cookie - 1] > 1) fail("a read completed twice");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fds[2];
  if (!tcpPair(fds)) fail("loopback connection");
  TcpTransportOptions options;
  options.max_frame_bytes = 1 << 16;  // what an unknown credit may make it read and discard
  auto made = TcpTransport::create(UniqueFd(fds[0]), "fuzz", options);
  if (!made) fail("TcpTransport::create");
  std::unique_ptr<Transport> t = std::move(made).value();

  constexpr uint64_t kCapacity[2] = {4096, 100};
  std::shared_ptr<std::vector<uint8_t>> buffers[2];
  for (int i = 0; i < 2; ++i) {
    buffers[i] = std::make_shared<std::vector<uint8_t>>(kCapacity[i]);
    LocalCredit c;
    c.credit_id = uint64_t(i) + 1;
    c.buffer = buffers[i]->data();
    c.capacity = kCapacity[i];
    c.keepalive = buffers[i];
    if (!t->exposeCredit(c).ok()) fail("exposeCredit");
  }

  auto source = std::make_shared<std::vector<uint8_t>>(4096, 0x5A);
  if (!t->exposeSource(LocalSource{1, source->data(), source->size(), source}).ok()) fail("exposeSource");
  constexpr uint64_t kReadLength[2] = {4096, 100};
  std::vector<uint8_t> read_buffers[2] = {std::vector<uint8_t>(4096), std::vector<uint8_t>(100)};
  for (int i = 0; i < 2; ++i) {
    ReadRequest r;
    r.cookie = uint64_t(i) + 1;
    r.source = RemoteSource{uint64_t(i) + 1, kReadLength[i], 0, 0};
    r.buffer = read_buffers[i].data();
    r.capacity = read_buffers[i].size();
    if (t->postRead(r) != PostResult::kOk) fail("postRead");
  }
  int reads_done[2] = {0, 0};

  sendThenClose(fds[1], data, size);

  bool link_error = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!link_error) {
    TransportEvent ev[8];
    const size_t n = t->poll(ev, 8);
    for (size_t i = 0; i < n; ++i) {
      if (ev[i].kind == TransportEvent::Kind::kLinkError) {
        if (link_error) fail("a second LinkError");
        link_error = true;
      } else if (ev[i].kind == TransportEvent::Kind::kFrameArrived && ev[i].status == FL_OK) {
        const uint64_t id = ev[i].header.credit_id;
        if (id != 1 && id != 2) fail("FrameArrived names a credit that was never exposed");
        if (ev[i].header.length > kCapacity[id - 1]) fail("FrameArrived longer than its credit");
        if (ev[i].header.attr_length > FL_MAX_ATTR_BYTES) fail("FrameArrived with oversized attributes");
      } else if (ev[i].kind == TransportEvent::Kind::kReadComplete) {
        if (ev[i].cookie != 1 && ev[i].cookie != 2) fail("ReadComplete for a read that was never posted");
        if (++reads_done[ev[i].cookie - 1] > 1) fail("a read completed twice");
      }
    }
    if (n == 0) {
      if (std::chrono::steady_clock::now() > deadline) fail("no LinkError 5 s after the peer closed");
      pollfd p{t->eventFd(), POLLIN, 0};
      ::poll(&p, 1, 10);
    }
  }
  countReadsAfterLinkError(*t, reads_done);
  if (reads_done[0] != 1 || reads_done[1] != 1) fail("a read never completed");
  t->shutdown();
  ::close(fds[1]);
  return 0;
}
