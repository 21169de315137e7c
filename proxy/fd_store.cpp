#include "fd_store.h"

#include <fcntl.h>
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

#else

std::vector<NamedFd> takeStoredFds() { return {}; }
void forgetStoredFds(const std::vector<std::string>&) {}
bool fdStoreAvailable() { return false; }
bool storeFds(std::vector<NamedFd>&) { return false; }

#endif

}  // namespace framelink
