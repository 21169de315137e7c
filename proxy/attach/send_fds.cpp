#include "attach/send_fds.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace framelink {

ssize_t sendWithFds(int socket, const void* data, size_t size, std::span<const int> fds, int flags) {
  if (fds.size() > kMaxPassedFds) {
    errno = EINVAL;
    return -1;
  }
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size_bytes());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(fds.size_bytes());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), fds.size_bytes());
  }
  return ::sendmsg(socket, &msg, flags);
}

}  // namespace framelink
