#include "link/grpc_engine.h"

#include <absl/functional/any_invocable.h>
#include <absl/status/status.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"

namespace framelink {

namespace {

using grpc_event_engine::experimental::EventEngine;
using Clock = std::chrono::steady_clock;
using Task = absl::AnyInvocable<void()>;

// Threads grow while every one is busy (a callback may block for a while,
// as gRPC's own pool allows), up to this many.
constexpr size_t kMaxThreads = 16;
// A timer further out than this runs then (the clock's arithmetic stays in range).
constexpr EventEngine::Duration kLongest = std::chrono::hours(24 * 365 * 100);

constexpr const char* kRefused =
    "framelinkd's gRPC engine runs timers and callbacks only, and gRPC asked it for a connection, a "
    "listener or a name (gRPC 1.51 does only under an experiment): start framelinkd with "
    "GRPC_EXPERIMENTS set (to any experiment) and it keeps gRPC's own engine";

// Said once a run: what gRPC was refused.
absl::Status refused(const char* what) {
  static std::once_flag said;
  std::call_once(said, [what] { spdlog::error("gRPC asked for {}: {}", what, kRefused); });
  return absl::UnimplementedError(kRefused);
}

// What the engine and its threads share.  A thread holds it, not the engine:
// an engine let go of by one of its own callbacks goes while that thread
// finishes the callback.
struct Core {
  Mutex mutex;
  std::condition_variable cv;  // work to run, an earlier timer, the end
  std::deque<Task> ready FL_GUARDED_BY(mutex);
  // By time, then id: the earliest first; `when` finds one by id.
  std::map<std::pair<Clock::time_point, intptr_t>, Task> timers FL_GUARDED_BY(mutex);
  std::map<intptr_t, Clock::time_point> when FL_GUARDED_BY(mutex);
  intptr_t next_id FL_GUARDED_BY(mutex) = 1;
  size_t idle FL_GUARDED_BY(mutex) = 0;
  bool stopping FL_GUARDED_BY(mutex) = false;
  std::vector<std::thread> threads FL_GUARDED_BY(mutex);
};

thread_local const Core* t_core = nullptr;

void work(const std::shared_ptr<Core>& core);

// Work waits: an idle thread takes it, else one more thread starts.
void wakeOrStartLocked(const std::shared_ptr<Core>& core) FL_REQUIRES(core->mutex) {
  if (core->idle > 0 || core->stopping || core->threads.size() >= kMaxThreads) {
    core->cv.notify_one();
    return;
  }
  try {
    core->threads.emplace_back([core] { work(core); });
  } catch (const std::system_error&) {
    // No thread to be had: the work waits for one the engine has (or the next that starts).
    core->cv.notify_one();
  }
}

// Moves every timer that is due to the work that waits.
void takeDueLocked(Core& core, Clock::time_point now) FL_REQUIRES(core.mutex) {
  while (!core.timers.empty() && core.timers.begin()->first.first <= now) {
    auto first = core.timers.begin();
    core.when.erase(first->first.second);
    core.ready.push_back(std::move(first->second));
    core.timers.erase(first);
  }
}

void work(const std::shared_ptr<Core>& core) {
  ::pthread_setname_np(::pthread_self(), "fl-grpc-engine");
  t_core = core.get();
  MutexLock lock(core->mutex);
  for (;;) {
    takeDueLocked(*core, Clock::now());
    if (!core->ready.empty()) {
      Task task = std::move(core->ready.front());
      core->ready.pop_front();
      if (!core->ready.empty()) wakeOrStartLocked(core);
      lock.unlock();
      task();
      task = nullptr;  // what it held goes outside the lock too
      lock.lock();
      continue;
    }
    if (core->stopping) return;  // what was ready ran; timers not due are dropped
    ++core->idle;
    if (core->timers.empty()) {
      lock.wait(core->cv);
    } else {
      // Asleep until the earliest timer: an idle engine does not wake.
      const Clock::time_point next = core->timers.begin()->first.first;
      lock.waitUntil(core->cv, next, [&core, next]() FL_REQUIRES(core->mutex) {
        return core->stopping || !core->ready.empty() || core->timers.empty() ||
               core->timers.begin()->first.first < next;
      });
    }
    --core->idle;
  }
}

class RefusingResolver final : public EventEngine::DNSResolver {
 public:
  explicit RefusingResolver(EventEngine& engine) : engine_(engine) {}
  LookupTaskHandle LookupHostname(LookupHostnameCallback on_resolve, absl::string_view /*name*/,
                                  absl::string_view /*default_port*/,
                                  EventEngine::Duration /*timeout*/) override {
    return refuse(std::move(on_resolve));
  }
  LookupTaskHandle LookupSRV(LookupSRVCallback on_resolve, absl::string_view /*name*/,
                             EventEngine::Duration /*timeout*/) override {
    return refuse(std::move(on_resolve));
  }
  LookupTaskHandle LookupTXT(LookupTXTCallback on_resolve, absl::string_view /*name*/,
                             EventEngine::Duration /*timeout*/) override {
    return refuse(std::move(on_resolve));
  }
  bool CancelLookup(LookupTaskHandle /*handle*/) override { return false; }

 private:
  template <typename Callback>
  LookupTaskHandle refuse(Callback on_resolve) {
    engine_.Run([cb = std::move(on_resolve)]() mutable { cb(refused("a name lookup")); });
    return {{0, 0}};
  }
  EventEngine& engine_;
};

class QuietEventEngine final : public EventEngine {
 public:
  QuietEventEngine() : core_(std::make_shared<Core>()) {}

  ~QuietEventEngine() override {
    std::vector<std::thread> threads;
    {
      MutexLock lock(core_->mutex);
      core_->stopping = true;
      threads.swap(core_->threads);
    }
    core_->cv.notify_all();
    for (auto& thread : threads) {
      // Let go of by its own callback: that thread ends once the callback returns.
      if (thread.get_id() == std::this_thread::get_id()) {
        thread.detach();
      } else {
        thread.join();
      }
    }
  }

  bool IsWorkerThread() override { return t_core == core_.get(); }

  void Run(Closure* closure) override {
    Run([closure] { closure->Run(); });
  }
  void Run(Task closure) override {
    MutexLock lock(core_->mutex);
    core_->ready.push_back(std::move(closure));
    wakeOrStartLocked(core_);
  }

  TaskHandle RunAfter(Duration when, Closure* closure) override {
    return RunAfter(when, [closure] { closure->Run(); });
  }
  TaskHandle RunAfter(Duration when, Task closure) override {
    const Clock::time_point at = Clock::now() + std::min(when, kLongest);
    MutexLock lock(core_->mutex);
    const intptr_t id = core_->next_id++;
    core_->timers.emplace(std::make_pair(at, id), std::move(closure));
    core_->when.emplace(id, at);
    if (core_->timers.begin()->first.second == id) {
      // The earliest now: the thread that sleeps for the one before wakes sooner.
      if (core_->idle > 0) {
        core_->cv.notify_all();
      } else if (core_->threads.empty()) {
        wakeOrStartLocked(core_);
      }
    }
    return {{id, reinterpret_cast<intptr_t>(core_.get())}};
  }

  // True when the task had not started: it never runs.
  bool Cancel(TaskHandle handle) override {
    if (handle.keys[1] != reinterpret_cast<intptr_t>(core_.get())) return false;
    MutexLock lock(core_->mutex);
    auto it = core_->when.find(handle.keys[0]);
    if (it == core_->when.end()) return false;
    core_->timers.erase({it->second, it->first});
    core_->when.erase(it);
    return true;
  }

  absl::StatusOr<std::unique_ptr<Listener>> CreateListener(
      Listener::AcceptCallback /*on_accept*/, absl::AnyInvocable<void(absl::Status)> /*on_shutdown*/,
      const grpc_event_engine::experimental::EndpointConfig& /*config*/,
      std::unique_ptr<grpc_event_engine::experimental::MemoryAllocatorFactory> /*factory*/) override {
    return refused("a listener");
  }
  ConnectionHandle Connect(OnConnectCallback on_connect, const ResolvedAddress& /*addr*/,
                           const grpc_event_engine::experimental::EndpointConfig& /*args*/,
                           grpc_event_engine::experimental::MemoryAllocator /*allocator*/,
                           Duration /*timeout*/) override {
    Run([cb = std::move(on_connect)]() mutable { cb(refused("a connection")); });
    return {{0, 0}};
  }
  bool CancelConnect(ConnectionHandle /*handle*/) override { return false; }
  std::unique_ptr<DNSResolver> GetDNSResolver(const DNSResolver::ResolverOptions& /*options*/) override {
    return std::make_unique<RefusingResolver>(*this);
  }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

std::unique_ptr<EventEngine> makeQuietEventEngine() { return std::make_unique<QuietEventEngine>(); }

bool grpcExperimentsSet() {
  const char* experiments = std::getenv("GRPC_EXPERIMENTS");
  return experiments != nullptr && *experiments != '\0';
}

bool installQuietEventEngine() {
  if (grpcExperimentsSet()) return false;
  grpc_event_engine::experimental::SetEventEngineFactory([] { return makeQuietEventEngine(); });
  return true;
}

}  // namespace framelink
