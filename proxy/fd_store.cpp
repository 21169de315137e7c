#include "fd_store.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#ifdef FRAMELINK_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace framelink {

#ifdef FRAMELINK_HAVE_SYSTEMD

std::vector<NamedFd> takeStoredFds() {
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
  // Out of the way first (above every number they go to), then in place:
  // dup2 leaves the copies without FD_CLOEXEC, so they alone cross the exec.
  std::vector<int> high;
  for (auto& named : fds) {
    const int fd = ::fcntl(named.fd.get(), F_DUPFD_CLOEXEC, 3 + static_cast<int>(fds.size()));
    if (fd < 0) {
      spdlog::error("restart in place: out of descriptors");
      for (int h : high) ::close(h);
      return false;
    }
    high.push_back(fd);
  }
  std::string names;
  for (size_t i = 0; i < high.size(); ++i) {
    ::dup2(high[i], SD_LISTEN_FDS_START + static_cast<int>(i));
    ::close(high[i]);
    names += (i != 0 ? ":" : "") + fds[i].name;
  }
  // Nothing else crosses: a listener or device a library opened without
  // O_CLOEXEC would keep its port or device from the next image.
  ::close_range(SD_LISTEN_FDS_START + static_cast<unsigned>(fds.size()), ~0U, CLOSE_RANGE_CLOEXEC);
  ::setenv("LISTEN_FDS", std::to_string(fds.size()).c_str(), 1);
  ::setenv("LISTEN_FDNAMES", names.c_str(), 1);
  ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
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
