// AttachServer::adopt: the clients of the daemon before this one (hot
// restart) become this daemon's as if they had just attached.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <algorithm>

#include "attach/attach_server.h"
#include "attach/segment_quota.h"

namespace framelink {

Status AttachServer::adopt(UniqueFd socket, std::shared_ptr<ClientSession> session) {
  const int fd = socket.get();
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != session->uid) {
    return makeError(FL_ERR_BAD_REQUEST, "its attach socket's peer is not the uid the hand-over names");
  }
  ClientSegments& segments = *session->segments;
  if (registrar_) {
    auto registration = registrar_(segments, session->role);
    if (!registration) {
      return makeError(FL_ERR_RESOURCES,
                       "cannot register its segment with the RDMA device: " + registration.error().message);
    }
    segments.holdRegistration(std::move(registration.value()));
  }
  UniqueFd socket_dup(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!socket_dup.valid()) return makeError(FL_ERR_RESOURCES, "out of file descriptors");
  Connection conn;
  conn.fd = std::move(socket);
  conn.uid = session->uid;
  conn.client_id = session->id;
  auto charge = quota_.charge(conn.uid, segmentBytes(segments.geometry()));
  conn.charge = charge;
  segments.holdCharge(std::move(charge));
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
  connections_.emplace(fd, std::move(conn));
  ++attached_by_uid_[session->uid];
  next_client_id_ = std::max(next_client_id_, session->id + 1);
  session->socket = std::move(socket_dup);
  session->replied.store(true, std::memory_order_release);
  // A client asleep on its doorbell looks at its rings again (a wake-up it
  // may find nothing for, as the doorbell's contract allows).
  const int bell = session->completion_doorbell.get();
  on_attach_(std::move(session));
  ringDoorbell(bell);
  return {};
}

}  // namespace framelink
