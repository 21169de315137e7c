// Forked helper processes for `demo` and `bench`: the producer and the consumer run as separate
// processes, as real applications would, and report through a shared anonymous mapping.
#ifndef FRAMELINK_CLI_CHILD_PROCESS_H
#define FRAMELINK_CLI_CHILD_PROCESS_H

#include <sys/mman.h>
#include <sys/types.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <new>
#include <string>

namespace framelink::cli {

// Runs `body` in a child process and _exit()s with its result, so no destructor of the parent's
// objects (daemons, temp dirs) runs in the child.  Returns the pid, or -1 with errno set.
pid_t forkChild(const std::function<int()>& body);

// Waits up to timeout_ms for `pid`; returns its exit code (128+signal when killed), or -1 if it is
// still running.  timeout_ms < 0 waits forever.
int waitChild(pid_t pid, int timeout_ms);
// SIGTERM, then SIGKILL after grace_ms; reaps it.
void stopChild(pid_t pid, int grace_ms);

// A MAP_SHARED|MAP_ANONYMOUS region visible to the children forked after it was made.
template <typename T>
class SharedRegion {
 public:
  explicit SharedRegion(size_t extra_bytes = 0) : size_(sizeof(T) + extra_bytes) {
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    obj_ = new (p) T();
  }
  ~SharedRegion() {
    obj_->~T();
    munmap(obj_, size_);
  }
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  T* operator->() const { return obj_; }
  T& operator*() const { return *obj_; }
  // The bytes after T.
  void* extra() const { return reinterpret_cast<char*>(obj_) + sizeof(T); }

 private:
  size_t size_;
  T* obj_;
};

// Fixed-size message slot in shared memory (first writer wins).
template <size_t N>
struct SharedText {
  char text[N] = {};
  void set(const std::string& s) {
    if (text[0] != '\0') return;
    std::strncpy(text, s.c_str(), N - 1);
  }
  std::string get() const { return std::string(text, strnlen(text, N)); }
};

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_CHILD_PROCESS_H
