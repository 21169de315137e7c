// The keeper of a hot restart's descriptors for daemons the tests start
// (harness.h, DaemonProcess::Options::fd_keeper): it speaks systemd's side of
// the notify protocol as sd_notify(3) and sd_pid_notify_with_fds(3) document
// it -- a datagram socket named by $NOTIFY_SOCKET; FDSTORE=1 with FDNAME= and
// the descriptors as SCM_RIGHTS; FDSTOREREMOVE=1 with FDNAME= -- and gives the
// stored descriptors to the next daemon as $LISTEN_FDS, $LISTEN_FDNAMES and
// $LISTEN_PID, as systemd does for a unit with FileDescriptorStoreMax=.
// (The service guest runs the same daemon under systemd itself.)
#pragma once

#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace framelink::integ {

class FdKeeper {
 public:
  FdKeeper();
  ~FdKeeper();
  FdKeeper(const FdKeeper&) = delete;
  FdKeeper& operator=(const FdKeeper&) = delete;

  // $NOTIFY_SOCKET for the daemon ("@..." : an abstract socket).
  const std::string& notifySocket() const noexcept { return address_; }
  // The stored descriptors and their names (the keeper keeps owning them).
  std::vector<std::pair<std::string, int>> entries() const;
  size_t size() const;
  // Stores received and removed so far, and messages of other kinds (READY=1, ...).
  size_t stored() const;
  size_t removed() const;
  // Waits (bounded) until no message is left unread on the socket.
  void settle() const;
  // Closes every stored descriptor: what systemd does when the unit stops.
  void discard();

 private:
  void run();
  void handle(const std::string& text, std::vector<int>& fds);

  int fd_ = -1;
  int stop_ = -1;
  std::string address_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, int>> entries_;
  size_t stored_ = 0;
  size_t removed_ = 0;
  std::thread thread_;
};

}  // namespace framelink::integ
