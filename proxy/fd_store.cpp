#include "fd_store.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#ifdef FRAMELINK_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

namespace framelink {

#ifdef FRAMELINK_HAVE_SYSTEMD

namespace {

constexpr const char* kInheritedFdsEnv = "FRAMELINK_INHERITED_FDS";  // FD=NAME:FD=NAME...
constexpr const char* kInheritedPidEnv = "FRAMELINK_INHERITED_PID";

// What reexecWithFds left this image: the descriptors at the numbers named.
std::vector<NamedFd> takeReexecFds() {
  std::vector<NamedFd> out;
  const char* list = std::getenv(kInheritedFdsEnv);
  const char* pid = std::getenv(kInheritedPidEnv);
  const bool ours = list != nullptr && pid != nullptr && std::to_string(::getpid()) == pid;
  const std::string text = ours ? list : "";
  ::unsetenv(kInheritedFdsEnv);
  ::unsetenv(kInheritedPidEnv);
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find(':', start), text.size());
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    int fd = -1;
    if (eq == std::string::npos || std::from_chars(item.data(), item.data() + eq, fd).ec != std::errc{} ||
        fd < 3 || ::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
      spdlog::warn("hot restart: '{}' in {} is not a descriptor of this process: left out", item,
                   kInheritedFdsEnv);
      continue;
    }
    out.push_back(NamedFd{item.substr(eq + 1), UniqueFd(fd)});
  }
  return out;
}

}  // namespace

std::vector<NamedFd> takeStoredFds() {
  if (std::getenv(kInheritedFdsEnv) != nullptr) return takeReexecFds();
  std::vector<NamedFd> out;
  char** names = nullptr;
  const int n = ::sd_listen_fds_with_names(1, &names);
  if (n <= 0) return out;
  std::vector<std::string> foreign;
  for (int i = 0; i < n; ++i) {
    const std::string name = names != nullptr && names[i] != nullptr ? names[i] : "";
    UniqueFd fd(SD_LISTEN_FDS_START + i);
    ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC);
    if (name.rfind("framelink.", 0) != 0) {
      foreign.push_back(name);
      continue;
    }
    out.push_back(NamedFd{name, std::move(fd)});
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(static_cast<void*>(names));
  }
  if (!foreign.empty()) {
    spdlog::warn("hot restart: {} descriptor{} in the store not framelinkd's: closed and removed",
                 foreign.size(), foreign.size() == 1 ? "" : "s");
    forgetStoredFds(foreign);
  }
  return out;
}

void forgetStoredFds(const std::vector<std::string>& names) {
  std::vector<std::string> unique(names);
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  for (const auto& name : unique) {
    const std::string message = "FDSTOREREMOVE=1\nFDNAME=" + name;
    ::sd_notify(0, message.c_str());
  }
}

bool fdStoreAvailable() { return std::getenv("NOTIFY_SOCKET") != nullptr; }

bool storeFds(std::vector<NamedFd>& fds) {
  for (auto& named : fds) {
    const std::string message = "FDSTORE=1\nFDPOLL=0\nFDNAME=" + named.name;
    const int fd = named.fd.get();
    if (::sd_pid_notify_with_fds(0, 0, message.c_str(), &fd, 1) <= 0) {
      spdlog::error("hot restart: storing {} failed", named.name);
      return false;
    }
  }
  return true;
}

namespace {
std::string g_executable;  // rememberExecutable
}

void rememberExecutable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) g_executable.assign(path, static_cast<size_t>(n));
}

bool reexecAvailable() { return !g_executable.empty(); }

bool reexecWithFds(std::vector<NamedFd>& fds, char** argv) {
  // Nothing else crosses: a listener or device a library opened without
  // O_CLOEXEC would keep its port or device from the next image.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  // Each at a number of its own, which no other thread of this process knows
  // (F_DUPFD: without FD_CLOEXEC, so it alone crosses the exec).  Not moved
  // to 3, 4, ... as systemd would pass them: dup2 onto a number another
  // thread still uses (gRPC's until the exec) would close its descriptor
  // under it, and its next write would land in ours -- the state's memfd.
  std::string list;
  for (auto& named : fds) {
    const int fd = ::fcntl(named.fd.get(), F_DUPFD, 3);
    if (fd < 0) {
      spdlog::error("restart in place: out of descriptors");
      return false;
    }
    list += (list.empty() ? "" : ":") + std::to_string(fd) + "=" + named.name;
  }
  ::setenv(kInheritedFdsEnv, list.c_str(), 1);
  ::setenv(kInheritedPidEnv, std::to_string(::getpid()).c_str(), 1);
  spdlog::info("restart in place: {} descriptors to the next image of {}", fds.size(), g_executable);
  spdlog::default_logger()->flush();
  ::execv(g_executable.c_str(), argv);
  spdlog::error("restart in place: exec of {} failed: {}", g_executable, std::strerror(errno));
  return false;
}

#else

void rememberExecutable() {}
bool reexecAvailable() { return false; }
bool reexecWithFds(std::vector<NamedFd>&, char**) { return false; }

std::vector<NamedFd> takeStoredFds() { return {}; }
void forgetStoredFds(const std::vector<std::string>&) {}
bool fdStoreAvailable() { return false; }
bool storeFds(std::vector<NamedFd>&) { return false; }

#endif

}  // namespace framelink
