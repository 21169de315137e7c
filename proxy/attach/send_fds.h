// Datagrams with descriptors on a client's attach socket: the attach reply's
// segments and doorbells, and the segments lent to a local consumer.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>

#include "framelink/attach_proto.h"

namespace framelink {

// The most descriptors one datagram passes: the attach reply's.
inline constexpr size_t kMaxPassedFds = FL_ATTACH_FD_COUNT;

// Sends `size` bytes at `data` as one datagram, with `fds` passed along by
// SCM_RIGHTS (no control message when there are none).  -1 with errno set:
// EINVAL for more than kMaxPassedFds, else sendmsg's.
ssize_t sendWithFds(int socket, const void* data, size_t size, std::span<const int> fds, int flags);

}  // namespace framelink
