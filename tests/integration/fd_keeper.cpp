#include "fd_keeper.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace framelink::integ {

namespace {
std::atomic<int> g_keepers{0};
}

FdKeeper::FdKeeper() {
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error("FdKeeper: socket failed");
  const std::string name =
      "framelink-fdkeeper-" + std::to_string(::getpid()) + "-" + std::to_string(g_keepers++);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: a leading NUL
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0)
    throw std::runtime_error("FdKeeper: bind failed");
  // A big receive queue: a daemon stores six descriptors a client, one message each.
  const int size = 4 << 20;
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  address_ = "@" + name;
  stop_ = ::eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { run(); });
}

FdKeeper::~FdKeeper() {
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(stop_, &one, sizeof(one));
  thread_.join();
  discard();
  ::close(fd_);
  ::close(stop_);
}

void FdKeeper::run() {
  for (;;) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if (fds[1].revents != 0) return;
    char text[4096];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
    iovec iov{text, sizeof(text) - 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) continue;
    std::vector<int> received;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* data = reinterpret_cast<const int*>(CMSG_DATA(c));
      received.insert(received.end(), data, data + count);
    }
    handle(std::string(text, static_cast<size_t>(n)), received);
    for (int fd : received) ::close(fd);  // those not stored
  }
}

void FdKeeper::handle(const std::string& text, std::vector<int>& fds) {
  bool store = false;
  bool remove = false;
  std::string name = "stored";  // systemd's default name
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line == "FDSTORE=1") store = true;
    if (line == "FDSTOREREMOVE=1") remove = true;
    if (line.rfind("FDNAME=", 0) == 0) name = line.substr(7);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (remove) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->first == name) {
        ::close(it->second);
        it = entries_.erase(it);
        ++removed_;
      } else {
        ++it;
      }
    }
  }
  if (store) {
    for (int fd : fds) entries_.emplace_back(name, fd);
    stored_ += fds.size();
    fds.clear();
  }
}

std::vector<std::pair<std::string, int>> FdKeeper::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

size_t FdKeeper::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t FdKeeper::stored() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_;
}

size_t FdKeeper::removed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return removed_;
}

void FdKeeper::settle() const {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    int queued = 0;
    if (::ioctl(fd_, FIONREAD, &queued) == 0 && queued == 0) {
      // The reader may still be handling the last one it took.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (::ioctl(fd_, FIONREAD, &queued) == 0 && queued == 0) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void FdKeeper::discard() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, fd] : entries_) ::close(fd);
  entries_.clear();
}

}  // namespace framelink::integ
