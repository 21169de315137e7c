// AttachServer::create: the attach listener -- the one the daemon before
// this one handed over (hot restart), or a new one bound to the socket path
// -- with its group, its mode and who may send admin requests.
#include <fcntl.h>
#include <grp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "attach/attach_server.h"

namespace framelink {

namespace {

std::string listenErrnoText() { return std::strerror(errno); }

sockaddr_un socketAddress(const std::string& path) {
  sockaddr_un addr{.sun_family = AF_UNIX, .sun_path = {}};
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return addr;
}

// A listener the daemon before this one handed over (hot restart): used when
// it is a listening SOCK_SEQPACKET socket bound to `path` and that file is
// still there; invalid (closed) otherwise.
UniqueFd takeInheritedListener(UniqueFd fd, const std::string& path) {
  if (!fd.valid()) return fd;
  int type = 0;
  int listening = 0;
  socklen_t len = sizeof(type);
  sockaddr_un bound{};
  socklen_t bound_len = sizeof(bound);
  struct stat st {};
  const bool usable =
      ::getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET &&
      (len = sizeof(listening), ::getsockopt(fd.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0) &&
      listening != 0 && ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len) == 0 &&
      bound.sun_family == AF_UNIX && path == bound.sun_path && ::lstat(path.c_str(), &st) == 0 &&
      S_ISSOCK(st.st_mode);
  if (!usable) {
    spdlog::warn("attach: the listener handed over is not one on {}: binding it anew", path);
    return UniqueFd();
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC);
  return fd;
}

// A new listener on `path`, replacing a stale socket file nobody answers on.
Result<UniqueFd> bindListener(const std::string& path) {
  sockaddr_un addr = socketAddress(path);
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return makeError(FL_ERR_RESOURCES, "socket(AF_UNIX) failed: " + listenErrnoText());
  // A stale socket file from a crashed daemon: remove it if nobody answers.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      return makeError(FL_EBUSY,
                       "another framelinkd already serves " + path + "; stop it or choose another --socket");
    }
    ::unlink(path.c_str());
  }
  mode_t old_umask = ::umask(0177);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::umask(old_umask);
  if (rc != 0) {
    return makeError(FL_ERR_RESOURCES, "cannot bind " + path + ": " + listenErrnoText() +
                                           " (does the directory exist and is it writable?)");
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<AttachServer>> AttachServer::create(const Config& config, DaemonIdentity identity,
                                                           OnAttach on_attach, OnDetach on_detach,
                                                           Metrics* metrics, UniqueFd inherited_listener) {
  std::unique_ptr<AttachServer> server(
      new AttachServer(config, identity, std::move(on_attach), std::move(on_detach)));
  server->metrics_ = metrics;
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) server->fd_limit_ = nofile.rlim_cur;
  if (config.socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return makeError(FL_EINVAL, "socket path '" + config.socket_path + "' is longer than " +
                                    std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                                    " bytes; choose a shorter one");
  }
  UniqueFd fd = takeInheritedListener(std::move(inherited_listener), config.socket_path);
  server->inherited_listener_ = fd.valid();
  if (!fd.valid()) {
    auto bound = bindListener(config.socket_path);
    if (!bound) return std::move(bound).error();
    fd = std::move(bound.value());
  }
  if (!config.socket_group.empty()) {
    group* g = ::getgrnam(config.socket_group.c_str());
    if (g == nullptr) {
      return makeError(FL_EINVAL, "socket group '" + config.socket_group +
                                      "' does not exist; create it or change socket_group");
    }
    if (::chown(config.socket_path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
      return makeError(FL_ERR_RESOURCES, "chown of " + config.socket_path + " to group " +
                                             config.socket_group + " failed: " + listenErrnoText());
    }
  }
  if (Status admin = server->resolveAdminGroup(); !admin) return admin.error();
  if (::chmod(config.socket_path.c_str(), config.socket_mode) != 0) {
    return makeError(FL_ERR_RESOURCES, "chmod of " + config.socket_path + " failed: " + listenErrnoText());
  }
  if (::listen(fd.get(), 64) != 0) return makeError(FL_ERR_RESOURCES, "listen failed: " + listenErrnoText());

  server->listen_fd_ = std::move(fd);
  server->epoll_fd_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  server->stop_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_event ev{.events = EPOLLIN, .data = {}};
  ev.data.fd = server->listen_fd_.get();
  ::epoll_ctl(server->epoll_fd_.get(), EPOLL_CTL_ADD, server->listen_fd_.get(), &ev);
  ev.data.fd = server->stop_fd_.get();
  ::epoll_ctl(server->epoll_fd_.get(), EPOLL_CTL_ADD, server->stop_fd_.get(), &ev);
  return server;
}

Status AttachServer::resolveAdminGroup() {
  own_uid_ = ::geteuid();
  own_gid_ = ::getegid();
  if (!config_.admin_group.empty()) {
    group* g = ::getgrnam(config_.admin_group.c_str());
    if (g == nullptr) {
      return makeError(FL_EINVAL, "admin group '" + config_.admin_group +
                                      "' does not exist; create it or change admin_group (--admin-group)");
    }
    admin_gid_ = g->gr_gid;
    admin_group_ = config_.admin_group;
  } else {
    struct stat sock_st {};
    if (::stat(config_.socket_path.c_str(), &sock_st) != 0) {
      return makeError(FL_ERR_RESOURCES, "stat of " + config_.socket_path + " failed: " + listenErrnoText());
    }
    admin_gid_ = sock_st.st_gid;
    group* g = ::getgrgid(sock_st.st_gid);
    admin_group_ = g != nullptr ? g->gr_name : std::to_string(sock_st.st_gid);
  }
  return {};
}

}  // namespace framelink
