#include "transport/tcp/tcp_connect.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include <spdlog/spdlog.h>

#include "framelink/framelink.h"
#include "transport/handshake_table.h"
#include "transport/tcp/tcp_wire.h"

namespace framelink::transport::tcp {

namespace {

using Clock = std::chrono::steady_clock;

std::string errnoText() { return std::strerror(errno); }

void applyBuffers(int fd, const TcpSocketOptions& options) {
  if (options.buffer_bytes <= 0) return;
  // Best effort: the kernel clamps to net.core.[rw]mem_max.
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &options.buffer_bytes, sizeof options.buffer_bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &options.buffer_bytes, sizeof options.buffer_bytes);
}

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

enum class Io { kOk, kTimeout, kClosed, kError, kWoken };

// Moves exactly n bytes on a non-blocking socket before `deadline`.  A
// readable `wake_fd` (if >= 0) aborts the wait.
Io transferAll(int fd, void* buf, size_t n, bool sending, Clock::time_point deadline, int wake_fd) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = sending ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0 && !sending) return Io::kClosed;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Io::kError;
    pollfd fds[2] = {{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0}, {wake_fd, POLLIN, 0}};
    int pr = ::poll(fds, wake_fd >= 0 ? 2 : 1, remainingMs(deadline));
    if (pr < 0 && errno != EINTR) return Io::kError;
    if (pr == 0) return Io::kTimeout;
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) return Io::kWoken;
  }
  return Io::kOk;
}

std::string describe(const sockaddr_storage& ss) {
  char host[NI_MAXHOST] = "?";
  char serv[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&ss), sizeof ss, host, sizeof host, serv, sizeof serv,
                NI_NUMERICHOST | NI_NUMERICSERV);
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";
  return h + ":" + serv;
}

// One non-blocking connect to `ai`, waiting until `deadline`: the connected
// socket, or an invalid one with the reason in *why (*woken: `wake_fd`
// ended the wait).
UniqueFd connectTo(const addrinfo* ai, const TcpSocketOptions& options, Clock::time_point deadline,
                   int wake_fd, std::string* why, bool* woken) {
  UniqueFd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
  if (!s.valid()) {
    *why = "socket: " + errnoText();
    return UniqueFd();
  }
  applyBuffers(s.get(), options);
  if (::connect(s.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *why = "connect: " + errnoText();
      return UniqueFd();
    }
    pollfd pfd[2] = {{s.get(), POLLOUT, 0}, {wake_fd, POLLIN, 0}};
    int pr = ::poll(pfd, wake_fd >= 0 ? 2 : 1, remainingMs(deadline));
    if (pr > 0 && wake_fd >= 0 && (pfd[1].revents & POLLIN)) {
      *woken = true;
      return UniqueFd();
    }
    if (pr <= 0) {
      *why = pr == 0 ? "connect timed out" : "poll: " + errnoText();
      return UniqueFd();
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      *why = std::string("connect: ") + std::strerror(err);
      return UniqueFd();
    }
  }
  return s;
}

// A connected socket to host:port: each address it resolves to in turn.
Result<UniqueFd> connectAny(const std::string& host, uint16_t port, const std::string& target,
                            const TcpSocketOptions& options, Clock::time_point deadline, int wake_fd) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &list); rc != 0) {
    return makeError(FL_ERR_TRANSPORT,
                     "tcp data dial " + target + ": cannot resolve host: " + gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(list, &::freeaddrinfo);

  std::string last_error = "no address";
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    bool woken = false;
    UniqueFd fd = connectTo(ai, options, deadline, wake_fd, &last_error, &woken);
    if (woken) return makeError(FL_ERR_TRANSPORT, "tcp data dial " + target + ": the daemon is stopping");
    if (fd.valid()) return fd;
  }
  return makeError(FL_ERR_TRANSPORT, "tcp data dial " + target + ": " + last_error +
                                         " (is the peer's data listener reachable?)");
}

// Sends the handshake for `session_id` (the token as its digest).
Status sendHello(int fd, uint64_t session_id, const std::string& token, Clock::time_point deadline,
                 int wake_fd, const std::string& target) {
  TcpHello hello{};
  std::memcpy(hello.magic, kTcpHelloMagic, sizeof hello.magic);
  hello.version = kTcpWireVersion;
  hello.session_id = session_id;
  tokenDigest(token, session_id, hello.token);
  if (Io io = transferAll(fd, &hello, sizeof hello, true, deadline, wake_fd); io != Io::kOk) {
    return makeError(FL_ERR_TRANSPORT,
                     "tcp data dial " + target + ": sending the handshake " +
                         (io == Io::kTimeout ? std::string("timed out")
                          : io == Io::kWoken ? std::string("stopped: the daemon is stopping")
                                             : "failed: " + errnoText()));
  }
  return {};
}

// Reads the peer's reply to the handshake: an error unless it says FL_OK.
Status readHelloReply(int fd, Clock::time_point deadline, int wake_fd, const std::string& target) {
  TcpHelloReply reply{};
  if (Io io = transferAll(fd, &reply, sizeof reply, false, deadline, wake_fd); io != Io::kOk) {
    return makeError(FL_ERR_TRANSPORT, "tcp data dial " + target + ": no handshake reply (" +
                                           (io == Io::kTimeout  ? std::string("timed out")
                                            : io == Io::kClosed ? std::string("peer closed the connection")
                                            : io == Io::kWoken  ? std::string("the daemon is stopping")
                                                                : errnoText()) +
                                           ")");
  }
  if (reply.status != FL_OK) {
    std::string why = reply.status == FL_ERR_AUTH ? "token rejected (check --token on both daemons)"
                      : reply.status == FL_ERR_PEER_VERSION
                          ? "peer speaks tcp wire version " + std::to_string(reply.version)
                          : "handshake rejected";
    int code = (reply.status == FL_ERR_AUTH || reply.status == FL_ERR_PEER_VERSION)
                   ? static_cast<int>(reply.status)
                   : FL_ERR_PROTOCOL;
    return makeError(
        code, "tcp data dial " + target + ": " + why + " (status " + std::to_string(reply.status) + ")");
  }
  return {};
}

}  // namespace

Result<std::pair<std::string, uint16_t>> parseHostPort(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return makeError(FL_EINVAL, "'" + host_port + "' is not HOST:PORT (e.g. 0.0.0.0:0 or [::]:7701)");
  }
  std::string host = host_port.substr(0, colon);
  std::string port_text = host_port.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  errno = 0;
  unsigned long port = std::strtoul(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || errno != 0 || port > 65535) {
    return makeError(FL_EINVAL, "'" + host_port + "': port must be a number 0..65535");
  }
  return std::make_pair(host, static_cast<uint16_t>(port));
}

// ---------------------------------------------------------------- dialer

Result<UniqueFd> dialData(const std::string& host, uint16_t port, uint64_t session_id,
                          const std::string& token, std::chrono::milliseconds timeout,
                          TcpSocketOptions options, int wake_fd) {
  const auto deadline = Clock::now() + timeout;
  const std::string target = host + ":" + std::to_string(port);
  auto fd = connectAny(host, port, target, options, deadline, wake_fd);
  if (!fd) return fd;
  if (Status s = sendHello(fd->get(), session_id, token, deadline, wake_fd, target); !s) {
    return std::move(s).error();
  }
  if (Status s = readHelloReply(fd->get(), deadline, wake_fd, target); !s) return std::move(s).error();
  if (!setNonBlocking(fd->get(), false)) {
    return makeError(FL_ERR_TRANSPORT, "tcp data dial " + target + ": fcntl: " + errnoText());
  }
  return fd;
}

// ---------------------------------------------------------------- listener

Result<std::unique_ptr<TcpDataListener>> TcpDataListener::listen(
    const std::string& host_port, std::string token, OnConnection on_connection,
    std::chrono::milliseconds handshake_timeout, TcpSocketOptions options, TcpListenerCounters counters) {
  return listen(
      host_port, [token = std::move(token)](uint64_t) { return token; }, std::move(on_connection),
      handshake_timeout, options, counters);
}

Result<std::unique_ptr<TcpDataListener>> TcpDataListener::listen(
    const std::string& host_port, TokenFor token_for, OnConnection on_connection,
    std::chrono::milliseconds handshake_timeout, TcpSocketOptions options, TcpListenerCounters counters) {
  auto hp = parseHostPort(host_port);
  if (!hp) return std::move(hp).error().context("tcp data listener");
  const std::string& host = hp->first;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* list = nullptr;
  std::string port_text = std::to_string(hp->second);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &list);
      rc != 0) {
    return makeError(FL_EINVAL, "tcp data listener " + host_port + ": cannot resolve: " + gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(list, &::freeaddrinfo);

  UniqueFd fd(::socket(list->ai_family, list->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, list->ai_protocol));
  if (!fd.valid()) return makeError(FL_ERR_RESOURCES, "tcp data listener: socket: " + errnoText());
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  applyBuffers(fd.get(), options);  // inherited by accepted sockets
  if (::bind(fd.get(), list->ai_addr, list->ai_addrlen) != 0) {
    return makeError(FL_ERR_RESOURCES, "tcp data listener: bind " + host_port + ": " + errnoText() +
                                           " (address in use? choose another --data-listen)");
  }
  if (::listen(fd.get(), 64) != 0) {
    return makeError(FL_ERR_RESOURCES, "tcp data listener: listen: " + errnoText());
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  uint16_t port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return makeError(FL_ERR_RESOURCES, "tcp data listener: eventfd: " + errnoText());

  std::unique_ptr<TcpDataListener> l(new TcpDataListener(std::move(fd), std::move(wake), port,
                                                         std::move(token_for), std::move(on_connection),
                                                         handshake_timeout, counters));
  try {
    l->thread_ = std::thread([p = l.get()] { p->acceptLoop(); });
  } catch (const std::system_error& e) {
    return makeError(FL_ERR_RESOURCES, std::string("tcp data listener: cannot start thread: ") + e.what());
  }
  spdlog::info("tcp data listener on {} (port {})", host_port, port);
  return l;
}

TcpDataListener::TcpDataListener(UniqueFd listen_fd, UniqueFd wake_fd, uint16_t port, TokenFor token_for,
                                 OnConnection cb, std::chrono::milliseconds handshake_timeout,
                                 TcpListenerCounters counters)
    : listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      port_(port),
      token_for_(std::move(token_for)),
      on_connection_(std::move(cb)),
      handshake_timeout_(handshake_timeout),
      counters_(counters) {}

TcpDataListener::~TcpDataListener() { stop(); }

void TcpDataListener::stop() noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

struct TcpDataListener::Pending {
  UniqueFd fd;
  std::string peer;  // address:port
  std::string host;  // address
  TcpHello hello{};
  size_t got = 0;
  Clock::time_point deadline{};
};

void TcpDataListener::acceptLoop() noexcept {
  HandshakeTable<Pending> table;
  Clock::time_point accept_resume{};  // accept paused until then (out of descriptors)
  for (;;) {
    const auto now = Clock::now();
    // Deadlines first: a handshake that stalls half-way is dropped here.
    table.expire(now, [this](const Pending& p) {
      if (counters_.timed_out != nullptr) counters_.timed_out->fetch_add(1, std::memory_order_relaxed);
      log_drop_.warn(
          "tcp data listener: connection from {} dropped: no handshake within {} ms ({} of {} bytes)", p.peer,
          handshake_timeout_.count(), p.got, sizeof(TcpHello));
    });
    const bool accepting = now >= accept_resume && table.size() < kMaxPendingHandshakes;
    auto until =
        accepting ? Clock::time_point::max() : std::max(accept_resume, now + std::chrono::milliseconds(10));
    auto waited = table.wait(wake_fd_.get(), accepting ? listen_fd_.get() : -1, until,
                             [](const Pending& p) { return p.fd.get(); });
    if (waited == HandshakeWait::kFailed) {
      spdlog::error("tcp data listener: poll: {}", errnoText());
      return;
    }
    if (waited == HandshakeWait::kWoken) return;
    table.advanceReady([this](Pending& p) { return advance(p); });
    if (accepting && table.listenReady() && !acceptSome(table.pending())) {
      accept_resume = Clock::now() + std::chrono::milliseconds(100);  // no spinning on a readable listener
    }
  }
}

bool TcpDataListener::acceptSome(std::vector<Pending>& pending) noexcept {
  while (pending.size() < kMaxPendingHandshakes) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    UniqueFd conn(
        ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) {
      const int err = errno;
      if (outOfDescriptors(err)) {
        log_accept_.warn("tcp data listener: accept: {}; not accepting for 100 ms", std::strerror(err));
        return false;
      }
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR && err != ECONNABORTED) {
        log_accept_.warn("tcp data listener: accept: {}", std::strerror(err));
      }
      return true;
    }
    Pending p;
    p.peer = describe(peer);
    p.host = p.peer.substr(0, p.peer.rfind(':'));
    size_t same = 0;
    for (const auto& other : pending) same += other.host == p.host ? 1 : 0;
    if (same >= kMaxPendingPerHost) {
      // One host cannot take every slot: its extra connections are closed.
      if (counters_.refused != nullptr) counters_.refused->fetch_add(1, std::memory_order_relaxed);
      log_drop_.warn(
          "tcp data listener: connection from {} refused: {} handshakes from {} in progress already", p.peer,
          kMaxPendingPerHost, p.host);
      continue;
    }
    p.fd = std::move(conn);
    p.deadline = Clock::now() + handshake_timeout_;
    pending.push_back(std::move(p));
  }
  return true;  // full: further connections wait in the backlog until a slot frees
}

bool TcpDataListener::advance(Pending& p) noexcept {
  auto* buf = reinterpret_cast<uint8_t*>(&p.hello);
  while (p.got < sizeof p.hello) {
    ssize_t r = ::recv(p.fd.get(), buf + p.got, sizeof p.hello - p.got, MSG_DONTWAIT);
    if (r > 0) {
      p.got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    log_drop_.warn("tcp data listener: connection from {} dropped: no handshake ({})", p.peer,
                   r == 0 ? std::string("closed early") : errnoText());
    return true;
  }
  finish(p);
  return true;
}

void TcpDataListener::finish(Pending& p) noexcept {
  const TcpHello& hello = p.hello;
  TcpHelloReply reply{FL_OK, kTcpWireVersion};
  std::string why;
  if (std::memcmp(hello.magic, kTcpHelloMagic, sizeof hello.magic) != 0) {
    reply.status = FL_ERR_PROTOCOL;
    why = "bad magic (not a framelink tcp data connection)";
  } else if (hello.version != kTcpWireVersion) {
    reply.status = FL_ERR_PEER_VERSION;
    why = "tcp wire version " + std::to_string(hello.version) + ", this daemon speaks " +
          std::to_string(kTcpWireVersion);
  } else {
    uint8_t expected[kTokenDigestBytes];
    bool known = true;
    try {
      tokenDigest(token_for_(hello.session_id), hello.session_id, expected);
    } catch (...) {
      known = false;  // no token to prove: refused like a wrong one
    }
    if (!known || !digestEqual(expected, hello.token)) {
      reply.status = FL_ERR_AUTH;
      why = "wrong token (check --token on both daemons)";
      if (counters_.auth_failures != nullptr) {
        counters_.auth_failures->fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  // The reply fits an empty send buffer: one non-blocking send, no waiting
  // for a peer that does not read.
  ssize_t sent = ::send(p.fd.get(), &reply, sizeof reply, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (reply.status != FL_OK) {
    log_drop_.warn("tcp data listener: rejected connection from {} for session {:#x}: {}", p.peer,
                   hello.session_id, why);
    return;
  }
  if (sent != static_cast<ssize_t>(sizeof reply) || !setNonBlocking(p.fd.get(), false)) {
    log_drop_.warn("tcp data listener: connection from {} lost during the handshake", p.peer);
    return;
  }
  try {
    on_connection_(hello.session_id, std::move(p.fd));
  } catch (const std::exception& e) {
    spdlog::error("tcp data listener: connection handler threw: {}", e.what());
  } catch (...) {
    spdlog::error("tcp data listener: connection handler threw");
  }
}

}  // namespace framelink::transport::tcp
