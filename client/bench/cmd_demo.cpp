// `framelink-bench demo`: two framelinkd on this machine, a consumer app attached to hostB, a
// producer app attached to hostA, and a viewer on hostA beside the producer that subscribes to
// the same stream (separate processes): N verified frames to each reader, a throughput and
// latency summary.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench_commands.h"
#include "child_process.h"
#include "cli_util.h"
#include "consumer.h"
#include "daemon_pair.h"
#include "frame_pattern.h"
#include "pattern_clients.h"
#include "producer.h"

namespace framelink::cli {
namespace {

struct DemoOptions {
  uint64_t frames = 2000;
  std::string size = "1M";
  std::string transport = "tcp";
  std::string framelinkd;
  uint32_t slots = 8;
  bool keep = false;
  bool no_viewer = false;  // no subscriber beside the producer
};

// What one reader process reports.
struct DemoReader {
  std::atomic<int> state{0};  // 0 starting, 1 attached, 2 failed to attach
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> received_bytes{0};
  std::atomic<uint64_t> bad{0};
  SharedText<1024> error;
  SharedText<512> first_bad;
};

struct DemoShared {
  std::atomic<bool> abort{false};
  std::atomic<bool> producer_done{false};
  std::atomic<uint64_t> submitted{0};
  std::atomic<uint64_t> delivered{0};
  std::atomic<uint64_t> failed{0};
  std::atomic<uint64_t> first_submit_ns{0};
  std::atomic<uint64_t> last_completion_ns{0};
  std::atomic<uint64_t> latency_samples{0};
  std::atomic<uint64_t> readers_min{UINT64_MAX};  // the fewest readers a completion named
  std::atomic<int> failure_status{0};             // first failure status seen by the producer
  DemoReader consumer;                            // on hostB
  DemoReader viewer;                              // on hostA, beside the producer
  SharedText<1024> producer_error;
  // followed by `frames` uint64_t latency samples (ns)
};

constexpr const char* kStream = "demo";

// A reader process: checks every frame, and (`lat` non-null) records its submit -> receive
// time there.  The viewer subscribes: it gets every frame, lent from the producer's slot.
int readerMain(DemoShared& sh, DemoReader& me, uint64_t* lat, const std::string& socket, bool subscribe,
               uint64_t frames, uint64_t size, uint32_t slots) {
  std::string err;
  auto consumer = attachPatternConsumer(socket, kStream, slots, size, err, subscribe);
  if (!consumer) {
    me.error.set(err);
    me.state.store(2);
    return 1;
  }
  me.state.store(1);
  FrameChecker checker(patternChecks(size));
  ReceiveLoopOptions lo;
  lo.count = frames;
  lo.idle_timeout_ms = 90000;  // longer than the daemons' 30 s ack/credit timeouts
  lo.stop = &sh.abort;
  auto onFrame = [&](const fl_frame& f, uint64_t rx_real, std::string&) -> bool {
    const std::string why = checker.check(f);
    if (!why.empty()) {
      me.bad.fetch_add(1);
      me.first_bad.set(why);
    }
    const uint64_t n = sh.latency_samples.load(std::memory_order_relaxed);
    if (lat != nullptr && n < frames) {
      lat[n] = rx_real > f.timestamp_ns ? rx_real - f.timestamp_ns : 0;
      sh.latency_samples.store(n + 1, std::memory_order_release);
    }
    me.received_bytes.fetch_add(f.length, std::memory_order_relaxed);
    me.received.fetch_add(1, std::memory_order_release);
    return true;
  };
  ReceiveLoopStats st = receiveLoop(*consumer, lo, onFrame);
  // Stay attached until the producer has its completions: framelinkd may act on a detach before
  // it has read the releases still queued in our ring, which would fail the last frames.
  const uint64_t linger_deadline = monotonicNs() + 60'000'000'000ull;
  while (!sh.producer_done.load() && !sh.abort.load() && monotonicNs() < linger_deadline) usleep(5000);
  if (!st.error.empty()) me.error.set(st.error);
  if (st.timed_out) {
    me.error.set("received " + std::to_string(st.received) + " of " + std::to_string(frames) +
                 " frames; nothing arrived for 90 s");
  }
  return st.error.empty() && !st.timed_out && !st.interrupted && checker.bad() == 0 ? 0 : 1;
}

// The producer process: `frames` pattern frames, counting what becomes of each.
int producerMain(DemoShared& sh, const std::string& socket, uint64_t frames, uint64_t size, uint32_t slots) {
  std::string err;
  auto producer = Producer::attach(patternProducerOptions(socket, kStream, slots, size), err);
  if (!producer) {
    sh.producer_error.set(err);
    return 1;
  }
  auto prepare = [&](uint64_t index, fl_slot& slot, FrameSpec& spec, std::string&) -> bool {
    describePatternFrame(index, size, spec);
    pattern::fillPattern(index, slot.data, size);
    if (index == 0) sh.first_submit_ns.store(monotonicNs());
    sh.submitted.fetch_add(1, std::memory_order_relaxed);
    return true;
  };
  auto onCompletion = [&](const fl_completion& c) {
    uint64_t fewest = sh.readers_min.load(std::memory_order_relaxed);
    while (c.readers < fewest && !sh.readers_min.compare_exchange_weak(fewest, c.readers)) {
    }
    if (c.status == FL_OK) {
      sh.delivered.fetch_add(1, std::memory_order_relaxed);
    } else {
      int expected = 0;
      sh.failure_status.compare_exchange_strong(expected, c.status);
      sh.failed.fetch_add(1, std::memory_order_relaxed);
    }
    sh.last_completion_ns.store(monotonicNs(), std::memory_order_relaxed);
  };
  ProducerStats st = producer->run([&](uint64_t i) { return i < frames; }, prepare, onCompletion, &sh.abort);
  if (!st.error.empty()) sh.producer_error.set(st.error);
  return st.allDelivered() ? 0 : 1;
}

void drawProgress(bool tty, uint64_t done, uint64_t total, double gbps, double elapsed) {
  if (tty) {
    constexpr int kWidth = 30;
    const int fill = total ? static_cast<int>(static_cast<double>(done) / total * kWidth) : 0;
    std::string bar(static_cast<size_t>(fill), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r[%s] %llu/%llu frames  %.2f GB/s  %.1f s ", bar.c_str(), (unsigned long long)done,
                 (unsigned long long)total, gbps, elapsed);
  } else {
    std::fprintf(stderr, "progress: %llu/%llu frames delivered, %.2f GB/s, %.1f s\n",
                 (unsigned long long)done, (unsigned long long)total, gbps, elapsed);
  }
}

// 0 when the options make sense (`size` parsed), else the exit code after saying what is wrong.
int checkDemoOptions(const DemoOptions& o, uint64_t& size) {
  const auto parsed = parseSize(o.size);
  if (!parsed || *parsed == 0) {
    std::fprintf(stderr, "framelink-bench demo: --size '%s' is not a size (e.g. 64K, 1M, 4M)\n",
                 o.size.c_str());
    return 2;
  }
  if (o.transport != "tcp" && o.transport != "grpc") {
    std::fprintf(stderr, "framelink-bench demo: --transport must be tcp or grpc, not '%s'\n",
                 o.transport.c_str());
    return 2;
  }
  if (o.frames == 0) {
    std::fprintf(stderr, "framelink-bench demo: --frames must be at least 1\n");
    return 2;
  }
  size = *parsed;
  return 0;
}

// Finds framelinkd and starts hostA and hostB; nullptr after saying why not.
std::unique_ptr<DaemonPair> startDaemons(const DemoOptions& o) {
  std::string err;
  DaemonPair::Options dopt;
  dopt.framelinkd = findFramelinkd(o.framelinkd, err);
  if (dopt.framelinkd.empty()) {
    std::fprintf(stderr, "framelink-bench demo: %s\n", err.c_str());
    return nullptr;
  }
  dopt.transport = o.transport;
  dopt.temp_prefix = "framelink-demo";
  // Routed to hostB by name: the viewer beside the producer reads it too.
  dopt.extra_args_a = {"--route", std::string(kStream) + "=hostB"};
  std::fprintf(stderr, "starting two framelinkd (%s) over %s ...\n", dopt.framelinkd.c_str(),
               o.transport.c_str());
  auto pair = DaemonPair::start(dopt, err);
  if (!pair) {
    std::fprintf(stderr, "framelink-bench demo: %s\n", err.c_str());
    return nullptr;
  }
  if (o.keep) pair->keepDir();
  std::fprintf(stderr, "hostA pid %d (socket %s) -> hostB pid %d (socket %s, gRPC port %u)\n", pair->a().pid,
               pair->a().socket.c_str(), pair->b().pid, pair->b().socket.c_str(), pair->b().grpc_port);
  return pair;
}

// One demo transfer: the mapping the two processes report through (DemoShared, then one latency
// sample per frame), their pids and exit codes, and what went wrong with a daemon.
struct DemoRun {
  DemoRun(const DemoOptions& options, DaemonPair& daemons, uint64_t size)
      : o(options),
        pair(daemons),
        sh(options.frames * sizeof(uint64_t)),
        lat(static_cast<uint64_t*>(sh.extra())),
        frames(options.frames),
        bytes(size),
        sock_a(daemons.a().socket),
        sock_b(daemons.b().socket) {}

  const DemoOptions& o;
  DaemonPair& pair;
  SharedRegion<DemoShared> sh;
  uint64_t* lat;
  const uint64_t frames;
  const uint64_t bytes;
  const std::string sock_a;
  const std::string sock_b;
  pid_t consumer = -1;
  pid_t viewer = -1;
  pid_t producer = -1;
  int consumer_rc = -1;  // -1 while it runs
  int viewer_rc = -1;    // stays 0 without a viewer
  int producer_rc = -1;
  std::string daemon_problem;
};

// Forks a reader and waits until it has attached, so that the producer's first frames find it;
// false after saying why not.
bool startReader(DemoRun& run, DemoReader& me, pid_t& pid, bool viewer) {
  const std::string& sock = viewer ? run.sock_a : run.sock_b;
  uint64_t* lat = viewer ? nullptr : run.lat;
  pid = forkChild([&run, &me, &sock, lat, viewer] {
    return readerMain(*run.sh, me, lat, sock, viewer, run.frames, run.bytes, run.o.slots);
  });
  if (pid < 0) {
    std::fprintf(stderr, "framelink-bench demo: fork failed: %s\n", std::strerror(errno));
    return false;
  }
  if (waitForAttach(me.state, monotonicNs() + 10'000'000'000ull)) return true;
  std::fprintf(stderr, "framelink-bench demo: the %s could not attach to %s: %s\n",
               viewer ? "viewer" : "consumer", viewer ? "hostA" : "hostB",
               me.error.get().empty() ? "it did not attach within 10 s" : me.error.get().c_str());
  run.sh->abort.store(true);
  stopChild(pid, 2000);
  run.pair.keepDir();
  std::fprintf(stderr, "daemon logs kept in %s\n", run.pair.dir().c_str());
  return false;
}

bool startReaders(DemoRun& run) {
  if (!startReader(run, run.sh->consumer, run.consumer, false)) return false;
  if (run.o.no_viewer) {
    run.viewer_rc = 0;
    return true;
  }
  if (startReader(run, run.sh->viewer, run.viewer, true)) return true;
  run.sh->abort.store(true);
  stopChild(run.consumer, 2000);
  return false;
}

// Reaps whichever process exited (the consumer lingers until the producer is done), and aborts
// both on Ctrl-C or when a daemon died.
void checkProcesses(DemoRun& run) {
  if (run.producer_rc < 0) {
    run.producer_rc = waitChild(run.producer, 0);
    if (run.producer_rc >= 0) run.sh->producer_done.store(true);
  }
  if (run.consumer_rc < 0) run.consumer_rc = waitChild(run.consumer, 0);
  if (run.viewer_rc < 0) run.viewer_rc = waitChild(run.viewer, 0);
  if (g_interrupted.load()) run.sh->abort.store(true);
  if (run.daemon_problem.empty()) {
    run.daemon_problem = run.pair.checkAlive();
    if (!run.daemon_problem.empty()) run.sh->abort.store(true);
  }
}

// Waits for both processes, with a progress bar on a terminal (a line every 2 s otherwise).
void watchTransfer(DemoRun& run) {
  const bool tty = isatty(STDERR_FILENO) != 0;
  const uint64_t t0 = monotonicNs();
  uint64_t last_draw = 0;
  while (run.producer_rc < 0 || run.consumer_rc < 0 || run.viewer_rc < 0) {
    checkProcesses(run);
    const uint64_t now = monotonicNs();
    if (now - last_draw >= (tty ? 100'000'000ull : 2'000'000'000ull)) {
      last_draw = now;
      const double elapsed = (now - t0) / 1e9;
      const uint64_t done = run.sh->delivered.load();
      const uint64_t first = run.sh->first_submit_ns.load();
      const double gbps =
          first && now > first ? done * static_cast<double>(run.bytes) / ((now - first) / 1e9) / 1e9 : 0;
      drawProgress(tty, done, run.frames, gbps, elapsed);
    }
    usleep(20000);
  }
  if (tty) {
    drawProgress(true, run.sh->delivered.load(), run.frames, 0, (monotonicNs() - t0) / 1e9);
    std::fprintf(stderr, "\n");
  }
}

// Prints the summary on stdout; true when every frame arrived, verified, and nothing failed.
bool printSummary(const DemoRun& run) {
  const DemoShared& sh = *run.sh;
  const uint64_t frames = run.frames;
  const uint64_t delivered = sh.delivered.load();
  const uint64_t received = sh.consumer.received.load();
  const uint64_t bad = sh.consumer.bad.load();
  const uint64_t viewed = sh.viewer.received.load();
  const uint64_t viewed_bad = sh.viewer.bad.load();
  const uint64_t readers = !run.o.no_viewer ? 2 : 1;
  const uint64_t failed = sh.failed.load();
  const uint64_t first = sh.first_submit_ns.load();
  const uint64_t last = sh.last_completion_ns.load();
  const double secs = last > first ? (last - first) / 1e9 : 0;
  const double total_bytes = static_cast<double>(delivered) * static_cast<double>(run.bytes);
  std::vector<double> lats;
  const uint64_t nlat = std::min<uint64_t>(sh.latency_samples.load(std::memory_order_acquire), frames);
  lats.reserve(nlat);
  for (uint64_t i = 0; i < nlat; ++i) lats.push_back(run.lat[i] / 1e3);
  const double p50 = percentile(lats, 50);
  const double p99 = percentile(lats, 99);
  const bool viewer_ok = run.o.no_viewer || (run.viewer_rc == 0 && viewed == frames && viewed_bad == 0);
  const bool ok = run.producer_rc == 0 && run.consumer_rc == 0 && delivered == frames && received == frames &&
                  bad == 0 && failed == 0 && viewer_ok && sh.readers_min.load() == readers &&
                  run.daemon_problem.empty() && !g_interrupted.load();

  std::printf(
      "framelink-bench demo: %llu frames x %s over %s (hostA -> hostB, two framelinkd on this machine)\n",
      (unsigned long long)frames, formatBytes(run.bytes).c_str(), run.o.transport.c_str());
  std::printf("  delivered  %llu / %llu   failed %llu   received %llu   verified %llu (bad %llu)\n",
              (unsigned long long)delivered, (unsigned long long)frames, (unsigned long long)failed,
              (unsigned long long)received, (unsigned long long)(received - bad), (unsigned long long)bad);
  if (!run.o.no_viewer) {
    std::printf(
        "  viewer     %llu received on hostA beside the producer, verified %llu (the producer's slots, lent: "
        "no copy)\n",
        (unsigned long long)viewed, (unsigned long long)(viewed - viewed_bad));
    std::printf("  readers    each completion: %llu of %llu readers released the frame\n",
                (unsigned long long)(sh.readers_min.load() == UINT64_MAX ? 0 : sh.readers_min.load()),
                (unsigned long long)readers);
  }
  std::printf("  moved      %s in %.3f s\n", formatBytes(static_cast<uint64_t>(total_bytes)).c_str(), secs);
  std::printf("  throughput %.3f GB/s   %.0f frames/s\n", secs > 0 ? total_bytes / secs / 1e9 : 0.0,
              secs > 0 ? delivered / secs : 0.0);
  std::printf("  latency    submit -> receive  p50 %.1f us   p99 %.1f us   (%llu samples, CLOCK_REALTIME)\n",
              p50, p99, (unsigned long long)nlat);
  std::printf("  result     %s\n",
              ok ? "OK: every frame delivered, in order, exactly once, every byte verified" : "FAILED");
  std::fflush(stdout);
  return ok;
}

// After a failed run: what each side said, and (unless interrupted) the daemons' log tails, with
// their directory kept.
void explainFailure(DemoRun& run) {
  const DemoShared& sh = *run.sh;
  if (g_interrupted.load()) std::fprintf(stderr, "framelink-bench demo: interrupted\n");
  if (!sh.producer_error.get().empty()) {
    std::fprintf(stderr, "  producer: %s\n", sh.producer_error.get().c_str());
  }
  if (const int s = sh.failure_status.load(); s != 0) {
    std::fprintf(stderr, "  first failure: %s\n", fl_status_str(s));
  }
  for (const auto& [label, r] : {std::pair<const char*, const DemoReader*>{"consumer", &sh.consumer},
                                 std::pair<const char*, const DemoReader*>{"viewer", &sh.viewer}}) {
    if (!r->error.get().empty()) std::fprintf(stderr, "  %s: %s\n", label, r->error.get().c_str());
    if (!r->first_bad.get().empty()) {
      std::fprintf(stderr, "  %s's first bad frame: %s\n", label, r->first_bad.get().c_str());
    }
  }
  if (!run.daemon_problem.empty()) std::fprintf(stderr, "  %s", run.daemon_problem.c_str());
  if (!g_interrupted.load()) {
    DaemonPair& pair = run.pair;
    pair.keepDir();
    std::fprintf(stderr, "  daemon logs kept in %s\n  hostA log tail:\n%s  hostB log tail:\n%s",
                 pair.dir().c_str(), pair.logTail(pair.a()).c_str(), pair.logTail(pair.b()).c_str());
  }
}

// Options, daemons, consumer, producer; then the summary, and on failure what each side said.
int runDemo(const DemoOptions& o) {
  installInterruptHandler();
  uint64_t size = 0;
  if (const int rc = checkDemoOptions(o, size); rc != 0) return rc;
  auto pair = startDaemons(o);
  if (!pair) return 1;
  DemoRun run(o, *pair, size);
  if (!startReaders(run)) return 1;
  run.producer =
      forkChild([&run] { return producerMain(*run.sh, run.sock_a, run.frames, run.bytes, run.o.slots); });
  watchTransfer(run);
  const bool ok = printSummary(run);
  if (!ok) explainFailure(run);
  pair->stop();
  if (g_interrupted.load()) return 130;
  return ok ? 0 : 1;
}

}  // namespace

void addDemoCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<DemoOptions>();
  auto* cmd = app.add_subcommand(
      "demo", "Two framelinkd on this machine, a producer and a consumer: N verified frames");
  cmd->add_option("--frames", o->frames, "frames to send (default 2000)");
  cmd->add_option("--size", o->size, "bytes per frame, suffixes K/M/G (default 1M)");
  cmd->add_option("--transport", o->transport, "tcp or grpc (default tcp)");
  cmd->add_option("--framelinkd", o->framelinkd,
                  "path of framelinkd (default: the build tree's, then $PATH)");
  cmd->add_option("--slots", o->slots, "slots per producer and consumer (default 8)");
  cmd->add_flag("--keep-temp", o->keep, "keep the daemons' temporary directory (logs) after the run");
  cmd->add_flag("--no-viewer", o->no_viewer,
                "no subscriber on hostA beside the producer (by default one reads every frame there too)");
  cmd->callback([o, &exit_code] { exit_code = runDemo(*o); });
}

}  // namespace framelink::cli
