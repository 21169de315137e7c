// `framelink recv`: receive frames as a consumer; verify them and/or write them to a directory.
#include <sys/stat.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "cli_util.h"
#include "commands.h"
#include "consumer.h"
#include "frame_pattern.h"
#include "framelink/framelink.h"
#include "producer.h"

namespace framelink::cli {
namespace {

struct RecvOptions {
  std::string socket;
  bool reattach = defaultReattach();
  std::string stream;
  uint64_t count = 0;
  bool verify = false;
  uint64_t expect_seed = 1;
  std::string expect_random_size;
  std::string expect_size;
  bool expect_order = false;
  std::string out;
  int timeout_ms = 0;
  uint32_t slots = 0;
  std::string slot_size;
  bool subscribe = false;
  bool pull = false;
  bool quiet = false;
  bool json = false;
  std::string journal;
};

// The --expect-* checks; 0, or the exit code after saying what is wrong.
int parseChecks(const RecvOptions& o, CheckOptions& checks) {
  checks.verify = o.verify;
  checks.expect_order = o.expect_order;
  if (!o.expect_random_size.empty()) {
    auto range = parseSizeRange(o.expect_random_size);
    if (!range) {
      std::fprintf(stderr, "framelink recv: --expect-random-size '%s' is not MIN:MAX\n",
                   o.expect_random_size.c_str());
      return 2;
    }
    checks.sizes.emplace(range->first, range->second, o.expect_seed);
  } else if (!o.expect_size.empty()) {
    auto s = parseSize(o.expect_size);
    if (!s) {
      std::fprintf(stderr, "framelink recv: --expect-size '%s' is not a size\n", o.expect_size.c_str());
      return 2;
    }
    checks.sizes.emplace(*s);
  }
  return 0;
}

// --slot-size, else the largest expected frame page-rounded, else 0 (the daemon's default); 0, or
// the exit code after saying what is wrong.
int chooseSlotSize(const RecvOptions& o, const CheckOptions& checks, uint64_t& slot_size) {
  if (!o.slot_size.empty()) {
    auto s = parseSize(o.slot_size);
    if (!s || *s == 0) {
      std::fprintf(stderr, "framelink recv: --slot-size '%s' is not a size\n", o.slot_size.c_str());
      return 2;
    }
    slot_size = *s;
  } else if (checks.sizes) {
    slot_size = pageRound(checks.sizes->max());
  }
  return 0;
}

// Creates the --out directory if it does not exist; 0, or the exit code after saying why not.
int makeOutDir(const RecvOptions& o) {
  if (o.out.empty()) return 0;
  struct stat sb {};
  if (::stat(o.out.c_str(), &sb) != 0 && ::mkdir(o.out.c_str(), 0755) != 0) {
    std::fprintf(stderr, "framelink recv: cannot create --out directory %s: %s\n", o.out.c_str(),
                 std::strerror(errno));
    return 2;
  }
  return 0;
}

// Receives until --count, --timeout-ms or Ctrl-C: checks each frame (saying the first failure at
// once), journals it and writes it to --out.
ReceiveLoopStats receiveFrames(const RecvOptions& o, Consumer& consumer, FrameChecker& checker, bool checking,
                               Journal& journal) {
  ReceiveLoopOptions lo;
  lo.count = o.count;
  lo.idle_timeout_ms = o.timeout_ms;
  auto onFrame = [&](const fl_frame& f, uint64_t, std::string& e) -> bool {
    std::string why;
    if (checking) {
      why = checker.check(f);
      if (!why.empty() && checker.bad() == 1) std::fprintf(stderr, "framelink recv: %s\n", why.c_str());
    }
    // Received (B: failed a check), not yet released; the status column holds the frame's flags.
    journal.record(why.empty() ? "R" : "B", f.frame_id, static_cast<int>(f.flags));
    if (!o.out.empty() && !writeFrameFiles(o.out, f, e)) return false;
    return true;
  };
  ReceiveLoopStats st = receiveLoop(consumer, lo, onFrame);
  if (st.error.empty() && !st.interrupted && st.received > 0) {
    // Give framelinkd a moment to read the last releases from our ring before the detach: a
    // daemon that handles the detach first fails those frames as FL_ERR_NO_CONSUMER.
    usleep(200000);
  }
  return st;
}

// The summary on stdout (one JSON object, or one line unless --quiet and all went well), then
// what went wrong on stderr.
void printRecvSummary(const RecvOptions& o, const ReceiveLoopStats& st, const FrameChecker& checker,
                      bool checking, bool ok) {
  const double secs = st.seconds();
  const double gbps = secs > 0 ? st.bytes / secs / 1e9 : 0.0;
  if (o.json) {
    std::printf(
        "{\"received\":%llu,\"expected\":%llu,\"redelivered\":%llu,\"bytes\":%llu,\"seconds\":%.6f,\"gb_per_"
        "s\":%.4f,"
        "\"longest_gap_ms\":%.1f,\"bad\":%llu,\"first_error\":\"%s\",\"timed_out\":%s,\"error\":\"%s\","
        "\"ok\":%s}\n",
        (unsigned long long)st.received, (unsigned long long)o.count, (unsigned long long)st.redelivered,
        (unsigned long long)st.bytes, secs, gbps, st.longest_gap_ns / 1e6, (unsigned long long)checker.bad(),
        jsonEscape(checker.firstError()).c_str(), st.timed_out ? "true" : "false",
        jsonEscape(st.error).c_str(), ok ? "true" : "false");
  } else if (!o.quiet || !ok) {
    std::printf("received %llu frames, %s in %.3f s = %.3f GB/s", (unsigned long long)st.received,
                formatBytes(st.bytes).c_str(), secs, gbps);
    if (st.redelivered != 0) {
      std::printf(" (and %llu delivered again after a daemon restart)", (unsigned long long)st.redelivered);
    }
    if (checking) {
      if (checker.bad() == 0) {
        std::printf("; all passed the checks");
      } else {
        std::printf("; %llu FAILED the checks", (unsigned long long)checker.bad());
      }
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  if (!st.error.empty()) std::fprintf(stderr, "framelink recv: %s\n", st.error.c_str());
  if (checker.bad() != 0) {
    std::fprintf(stderr, "framelink recv: first bad frame: %s\n", checker.firstError().c_str());
  }
  if (st.timed_out) {
    std::fprintf(stderr,
                 "framelink recv: received %llu of %llu frames; no frame for %d ms (--timeout-ms) -- is the "
                 "producer running and the peer link up? see both daemons' logs\n",
                 (unsigned long long)st.received, (unsigned long long)o.count, o.timeout_ms);
  }
}

// Checks the options, attaches and receives; then the summary.
int runRecv(const RecvOptions& o) {
  installInterruptHandler();
  CheckOptions checks;
  if (const int rc = parseChecks(o, checks); rc != 0) return rc;
  uint64_t slot_size = 0;
  if (const int rc = chooseSlotSize(o, checks, slot_size); rc != 0) return rc;
  if (const int rc = makeOutDir(o); rc != 0) return rc;

  ConsumerOptions co;
  co.socket_path = o.socket;
  co.stream = o.stream;
  co.slot_count = o.slots;
  co.slot_size = slot_size;
  co.subscribe = o.subscribe;
  co.pull = o.pull;
  co.reattach = o.reattach;
  std::string err;
  auto consumer = Consumer::attach(co, err);
  if (!consumer) {
    std::fprintf(stderr, "framelink recv: %s\n", err.c_str());
    return 1;
  }

  Journal journal;
  if (!o.journal.empty() && !journal.open(o.journal)) {
    std::fprintf(stderr, "framelink recv: cannot open the journal %s: %s\n", o.journal.c_str(),
                 std::strerror(errno));
    return 2;
  }
  FrameChecker checker(std::move(checks));
  const bool checking = o.verify || o.expect_order || !o.expect_random_size.empty() || !o.expect_size.empty();
  ReceiveLoopStats st = receiveFrames(o, *consumer, checker, checking, journal);

  const bool complete = o.count == 0 ? !st.timed_out : st.received == o.count;
  const bool ok = st.error.empty() && checker.bad() == 0 && complete && !st.interrupted;
  printRecvSummary(o, st, checker, checking, ok);
  if (st.interrupted) {
    std::fprintf(stderr, "framelink recv: interrupted; received %llu of %llu frames\n",
                 (unsigned long long)st.received, (unsigned long long)o.count);
    return 130;
  }
  return ok ? 0 : 1;
}

}  // namespace

void addRecvCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RecvOptions>();
  auto* cmd = app.add_subcommand("recv", "Receive frames as a consumer; verify and/or save them");
  cmd->add_option("--socket", o->socket,
                  "framelinkd attach socket (default: $FRAMELINK_SOCKET or " FL_DEFAULT_SOCKET_PATH ")");
  cmd->add_option("--stream", o->stream, "stream name")->required();
  cmd->add_option("--count", o->count, "frames to receive before exiting (default 0 = until Ctrl-C)");
  cmd->add_flag("--verify", o->verify,
                "check each payload against the synthetic pattern, its attrs and group_id");
  cmd->add_option("--expect-seed", o->expect_seed, "seed the sender used with --random-size (default 1)");
  auto* rnd =
      cmd->add_option("--expect-random-size", o->expect_random_size, "MIN:MAX: check each frame's length");
  auto* fix = cmd->add_option("--expect-size", o->expect_size, "check that every frame has this length");
  rnd->excludes(fix);
  cmd->add_flag("--expect-order", o->expect_order,
                "frame ids must go up by one from the first, exactly once");
  cmd->add_option("--out", o->out, "write each frame to DIR/<frame_id>.bin (+ .json metadata), atomically");
  cmd->add_option("--timeout-ms", o->timeout_ms,
                  "give up when no frame arrives for this long (default 0 = never)");
  cmd->add_option("--slots", o->slots, "receive slots to ask the daemon for");
  cmd->add_flag("--subscribe", o->subscribe,
                "get every frame of the stream (a subscriber); without it this consumer shares the frames "
                "with the stream's other consumers (its queue group)");
  cmd->add_flag("--pull", o->pull,
                "have this host's daemon pull the stream's frames from other hosts while this consumer is "
                "attached (it reads each frame the sender offers: RDMA READ on rdma) instead of the sender "
                "writing them");
  cmd->add_option("--slot-size", o->slot_size,
                  "bytes per receive slot (default: --expect-* max, else the daemon's default_slot_size)");
  cmd->add_flag("--reattach,!--no-reattach", o->reattach,
                "when the daemon goes away (restart), wait for it and attach again (default; or "
                "$FRAMELINK_AUTO_REATTACH=0); --no-reattach: exit with an error");
  cmd->add_flag("--quiet,-q", o->quiet, "print nothing unless something failed");
  cmd->add_flag("--json", o->json, "print the summary as one JSON object");
  cmd->add_option("--journal", o->journal,
                  "append '<monotonic ns> R|B <frame id> 0' per frame received to FILE");
  cmd->callback([o, &exit_code] { exit_code = runRecv(*o); });
}

}  // namespace framelink::cli
