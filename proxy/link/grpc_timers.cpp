#include "link/grpc_timers.h"

#include <dlfcn.h>
#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <unordered_map>

#include "common/thread_annotations.h"
#include "link/grpc_engine.h"

namespace framelink {

namespace {

// gRPC 1.51's iomgr timer table (src/core/lib/iomgr/timer.h).  A
// grpc_core::Timestamp is one int64_t of milliseconds after gRPC's process
// epoch, passed and returned as an int64_t is; a grpc_timer is never looked
// into here, only told apart by its address.
struct GrpcTimer;
struct GrpcClosure;
enum CheckResult : int { kNotChecked, kCheckedAndEmpty, kFired };
struct TimerTable {
  void (*init)(GrpcTimer* timer, int64_t deadline, GrpcClosure* closure);
  void (*cancel)(GrpcTimer* timer);
  CheckResult (*check)(int64_t* next);
  void (*list_init)();
  void (*list_shutdown)();
  void (*consume_kick)();
};
constexpr int64_t kInfFuture = std::numeric_limits<int64_t>::max();
constexpr int64_t kInfPast = std::numeric_limits<int64_t>::min();
// A timer due this long ago has run: every check runs all that is due (its
// shards look ahead at least 10 ms, at most a second).
constexpr int64_t kRanAfterMs = 1000;

struct Quiet {
  TimerTable grpc{};  // gRPC's own list, which keeps and runs every timer
  TimerTable ours{};
  void (*kick)() = nullptr;                      // grpc_kick_poller: the timer thread looks again
  int64_t (*timestamp)(gpr_timespec) = nullptr;  // grpc_core::Timestamp::FromTimespecRoundDown
  Mutex mutex;
  // Every timer armed, by deadline; a timer that ran stays until kRanAfterMs past it.
  std::multimap<int64_t, const GrpcTimer*> due FL_GUARDED_BY(mutex);
  std::unordered_map<const GrpcTimer*, std::multimap<int64_t, const GrpcTimer*>::iterator> armed
      FL_GUARDED_BY(mutex);
  // Until when the timer thread last said it would sleep.
  int64_t promised FL_GUARDED_BY(mutex) = std::numeric_limits<int64_t>::min();

  int64_t now() const { return timestamp(gpr_now(GPR_CLOCK_MONOTONIC)); }
  void forgetLocked(const GrpcTimer* timer) FL_REQUIRES(mutex) {
    auto it = armed.find(timer);
    if (it == armed.end()) return;
    due.erase(it->second);
    armed.erase(it);
  }
  void clearLocked() FL_REQUIRES(mutex) {
    due.clear();
    armed.clear();
  }
};

// Never destroyed: gRPC's timer thread may still ask after main returns.
Quiet& quiet() {
  static Quiet* const kQuiet = new Quiet;
  return *kQuiet;
}

void timerInit(GrpcTimer* timer, int64_t deadline, GrpcClosure* closure) {
  Quiet& q = quiet();
  // Due before any clock: gRPC runs it at once, and nothing waits (a grpc
  // transport's wake, a grpc::Alarm set to gpr_inf_past, thousands a second).
  if (deadline == kInfPast) {
    {
      MutexLock lock(q.mutex);
      q.forgetLocked(timer);
    }
    q.grpc.init(timer, deadline, closure);
    return;
  }
  bool kick = false;
  {
    MutexLock lock(q.mutex);
    q.forgetLocked(timer);  // armed again
    // Even one already due: gRPC may judge it by a clock it read earlier, and keep it.
    if (deadline != kInfFuture) {
      q.armed.emplace(timer, q.due.emplace(deadline, timer));
      // Earlier than the thread sleeps: it looks again (and one kick serves every later timer).
      if (deadline < q.promised) {
        kick = true;
        q.promised = deadline;
      }
    }
  }
  q.grpc.init(timer, deadline, closure);
  if (kick) q.kick();
}

void timerCancel(GrpcTimer* timer) {
  Quiet& q = quiet();
  {
    MutexLock lock(q.mutex);
    q.forgetLocked(timer);
  }
  q.grpc.cancel(timer);
}

// gRPC runs what is due and says when its shards want looking at again (within
// a second); the thread sleeps until the later of that and the earliest timer.
CheckResult timerCheck(int64_t* next) {
  Quiet& q = quiet();
  if (next == nullptr) return q.grpc.check(nullptr);
  int64_t shards_next = *next;
  const CheckResult result = q.grpc.check(&shards_next);
  if (result == kNotChecked) {  // another thread is checking: this one sleeps until kicked
    *next = shards_next;
    return result;
  }
  MutexLock lock(q.mutex);
  const int64_t now = q.now();
  while (!q.due.empty() && q.due.begin()->first < now - kRanAfterMs) {
    q.armed.erase(q.due.begin()->second);
    q.due.erase(q.due.begin());
  }
  const int64_t earliest = q.due.empty() ? kInfFuture : q.due.begin()->first;
  *next = std::min(*next, std::max(shards_next, earliest));
  if (result == kCheckedAndEmpty) q.promised = *next;
  return result;
}

void timerListInit() {
  Quiet& q = quiet();
  {
    MutexLock lock(q.mutex);
    q.clearLocked();
  }
  q.grpc.list_init();
}

void timerListShutdown() {
  Quiet& q = quiet();
  q.grpc.list_shutdown();  // runs every timer left, cancelled
  MutexLock lock(q.mutex);
  q.clearLocked();
}

void timerConsumeKick() { quiet().grpc.consume_kick(); }

template <typename T>
T symbol(const char* name, std::string& missing) {
  void* found = ::dlsym(RTLD_DEFAULT, name);
  if (found == nullptr && missing.empty()) missing = name;
  return reinterpret_cast<T>(found);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast): dlsym
}

}  // namespace

std::string installQuietGrpcTimers() {
  if (grpcExperimentsSet()) return "GRPC_EXPERIMENTS is set";
  const std::string version = grpc::Version();
  if (version.rfind("1.51.", 0) != 0) {
    return "gRPC is " + version + ", and its timer table is known here for 1.51 only";
  }
  std::string missing;
  auto* table = symbol<TimerTable**>("grpc_timer_impl", missing);
  auto set_table = symbol<void (*)(TimerTable*)>("_Z19grpc_set_timer_implP17grpc_timer_vtable", missing);
  auto set_default = symbol<void (*)()>("_Z31grpc_set_default_iomgr_platformv", missing);
  auto determined = symbol<bool (*)()>("_Z35grpc_have_determined_iomgr_platformv", missing);
  auto kick = symbol<void (*)()>("_Z16grpc_kick_pollerv", missing);
  auto timestamp = symbol<int64_t (*)(gpr_timespec)>(
      "_ZN9grpc_core9Timestamp21FromTimespecRoundDownE12gpr_timespec", missing);
  if (!missing.empty()) return "gRPC " + version + " has no " + missing;
  if (determined()) return "gRPC had started already";
  // What grpc_init would do first; it then finds the platform chosen and keeps this table.
  set_default();
  Quiet& q = quiet();
  q.grpc = **table;
  q.kick = kick;
  q.timestamp = timestamp;
  q.ours = {timerInit, timerCancel, timerCheck, timerListInit, timerListShutdown, timerConsumeKick};
  set_table(&q.ours);
  return {};
}

}  // namespace framelink
