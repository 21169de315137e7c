// `framelink send`: synthetic frames (see frame_pattern.h) or files, as a producer.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include "cli_util.h"
#include "commands.h"
#include "frame_pattern.h"
#include "framelink/framelink.h"
#include "framelink/status_name.hpp"
#include "pattern_clients.h"
#include "producer.h"

namespace framelink::cli {

namespace {

// What a user can do about a failed frame, by status.
const char* failureHint(int status) {
  switch (status) {
    case FL_ERR_TOO_LARGE:
      return "the receiving consumer's slots are smaller than the frame: give `framelink recv` a larger "
             "--slot-size";
    case FL_ERR_NO_CONSUMER:
      return "no consumer released the frame in time: start `framelink recv --stream <same name>` on the "
             "peer's daemon";
    case FL_ERR_NO_ROUTE:
      return "this daemon routes the stream nowhere: configure --peer (and --route) on framelinkd";
    case FL_ERR_TIMEOUT:
    case FL_ERR_LINK_LOST:
      return "the peer link is slow or broke: check both daemons' logs and the network between them";
    case FL_ERR_CRC_MISMATCH:
      return "the payload changed between submit and send: do not write a slot after fl_submit";
    case FL_ERR_SHUTDOWN:
      return "a daemon is shutting down: retry once it is back";
    case FL_ERR_NO_LINK:
      return "the peer never linked: `framelink links` shows its last error, `framelink doctor` checks the "
             "set-up";
    default:
      return nullptr;
  }
}

struct SendOptions {
  std::string socket;
  std::string stream;
  uint64_t count = 0;
  bool count_set = false;
  std::string size = "1M";
  std::string random_size;
  uint64_t seed = 1;
  double rate = 0;
  uint32_t slots = 0;
  std::string slot_size;
  bool crc = false;
  uint64_t first_id = 0;
  std::vector<std::string> files;
  bool quiet = false;
  bool json = false;
  std::string journal;
  bool reattach = defaultReattach();
};

// A slot holds at least a page, even when every frame is empty.
uint64_t roundUpPage(uint64_t v) { return v == 0 ? 4096 : pageRound(v); }

// What is sent: FILES (their sizes), else synthetic frames of one size or of random sizes.
struct FramePlan {
  std::optional<pattern::SizeSequence> sizes;  // synthetic frames
  std::vector<uint64_t> file_sizes;            // FILES, one frame each
  uint64_t largest = 0;
};

// The sizes of FILES, which must be regular files; 0, or the exit code after saying why not.
int planFiles(const SendOptions& o, FramePlan& plan) {
  if (!o.random_size.empty()) {
    std::fprintf(stderr,
                 "framelink send: --random-size makes no sense with FILES (each file is one frame)\n");
    return 2;
  }
  for (const auto& f : o.files) {
    struct stat sb {};
    if (::stat(f.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) {
      std::fprintf(stderr, "framelink send: cannot read %s: %s -- pass regular files\n", f.c_str(),
                   errno != 0 ? std::strerror(errno) : "not a regular file");
      return 2;
    }
    plan.file_sizes.push_back(static_cast<uint64_t>(sb.st_size));
    plan.largest = std::max<uint64_t>(plan.largest, static_cast<uint64_t>(sb.st_size));
  }
  return 0;
}

// The frames to send, from FILES, --random-size or --size; 0, or the exit code after saying why not.
int planFrames(const SendOptions& o, FramePlan& plan) {
  if (!o.files.empty()) return planFiles(o, plan);
  if (!o.random_size.empty()) {
    auto range = parseSizeRange(o.random_size);
    if (!range) {
      std::fprintf(stderr, "framelink send: --random-size '%s' is not MIN:MAX (e.g. 1:8M)\n",
                   o.random_size.c_str());
      return 2;
    }
    plan.sizes.emplace(range->first, range->second, o.seed);
    plan.largest = range->second;
    return 0;
  }
  auto s = parseSize(o.size);
  if (!s) {
    std::fprintf(stderr, "framelink send: --size '%s' is not a size (e.g. 4096, 64K, 1M)\n", o.size.c_str());
    return 2;
  }
  plan.sizes.emplace(*s);
  plan.largest = *s;
  return 0;
}

// --slot-size, which must hold the largest frame, else the largest frame page-rounded; 0, or the
// exit code after saying what is wrong.
int chooseSlotSize(const SendOptions& o, uint64_t largest, uint64_t& slot_size) {
  slot_size = roundUpPage(largest);
  if (o.slot_size.empty()) return 0;
  auto s = parseSize(o.slot_size);
  if (!s || *s == 0) {
    std::fprintf(stderr, "framelink send: --slot-size '%s' is not a size\n", o.slot_size.c_str());
    return 2;
  }
  if (*s < largest) {
    std::fprintf(stderr, "framelink send: --slot-size %s is smaller than the largest frame (%s); raise it\n",
                 formatBytes(*s).c_str(), formatBytes(largest).c_str());
    return 2;
  }
  slot_size = *s;
  return 0;
}

// Attaches with slots of `slot_size` and checks that the daemon's slots hold the largest frame;
// nullptr after saying why not.
std::unique_ptr<Producer> attachProducer(const SendOptions& o, uint64_t slot_size, uint64_t largest) {
  ProducerOptions po;
  po.socket_path = o.socket;
  po.stream = o.stream;
  po.slot_count = o.slots;
  po.slot_size = slot_size;
  po.crc = o.crc;
  po.rate_hz = o.rate;
  po.reattach = o.reattach;
  std::string err;
  auto producer = Producer::attach(po, err);
  if (!producer) {
    std::fprintf(stderr, "framelink send: %s\n", err.c_str());
    return nullptr;
  }
  if (producer->info().slot_size < largest) {
    std::fprintf(stderr,
                 "framelink send: the daemon granted %s slots, smaller than the largest frame (%s); "
                 "raise the daemon's --max-slot-size\n",
                 formatBytes(producer->info().slot_size).c_str(), formatBytes(largest).c_str());
    return nullptr;
  }
  return producer;
}

// FILE number `index` as a frame: its bytes in the slot, frame_id = index, attrs = its name.
bool prepareFile(const std::string& path, uint64_t size, uint64_t index, fl_slot& slot, FrameSpec& spec,
                 std::string& e) {
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(slot.data), static_cast<std::streamsize>(size));
  if (!in || static_cast<uint64_t>(in.gcount()) != size) {
    e = "cannot read " + path + " (" + std::to_string(size) + " bytes): " + std::strerror(errno);
    return false;
  }
  spec.frame_id = index;
  spec.group_id = 0;
  spec.length = size;
  const size_t slash = path.rfind('/');
  spec.attrs = "name=" + (slash == std::string::npos ? path : path.substr(slash + 1));
  if (spec.attrs.size() > 192) spec.attrs.resize(192);
  return true;
}

// The summary on stdout: one JSON object, or a line plus one per failure reason with what to do.
void printSendSummary(const SendOptions& o, const ProducerStats& st) {
  const double secs = st.seconds();
  const double gbps = secs > 0 ? st.bytes_delivered / secs / 1e9 : 0.0;
  const double fps = secs > 0 ? st.delivered / secs : 0.0;
  if (o.json) {
    std::string failures;
    for (const auto& [status, n] : st.failures) {
      if (!failures.empty()) failures += ",";
      failures += "\"" + jsonEscape(statusName(status)) + "\":" + std::to_string(n);
    }
    std::printf(
        "{\"submitted\":%llu,\"delivered\":%llu,\"failed\":%llu,\"failures\":{%s},\"bytes_delivered\":%llu,"
        "\"seconds\":%.6f,\"gb_per_s\":%.4f,\"frames_per_s\":%.1f,\"readers_min\":%u,\"readers_max\":%u,"
        "\"skipped\":%llu,\"reattaches\":%u,\"interrupted\":%s,\"error\":\"%s\"}\n",
        (unsigned long long)st.submitted, (unsigned long long)st.delivered, (unsigned long long)st.failed,
        failures.c_str(), (unsigned long long)st.bytes_delivered, secs, gbps, fps, st.readers_min,
        st.readers_max, (unsigned long long)st.skipped, st.reattaches, st.interrupted ? "true" : "false",
        jsonEscape(st.error).c_str());
  } else if (!o.quiet || !st.allDelivered()) {
    std::printf("sent %llu frames: %llu delivered, %llu failed; %s in %.3f s = %.3f GB/s, %.0f frames/s\n",
                (unsigned long long)st.submitted, (unsigned long long)st.delivered,
                (unsigned long long)st.failed, formatBytes(st.bytes_delivered).c_str(), secs, gbps, fps);
    // Readers on every host, as the completions said (a stream routed to several hosts, subscribers).
    if (st.delivered > 0 && st.readers_max > 1) {
      std::printf("  each delivered frame was read by %s readers\n",
                  st.readers_min == st.readers_max
                      ? std::to_string(st.readers_max).c_str()
                      : (std::to_string(st.readers_min) + " to " + std::to_string(st.readers_max)).c_str());
    }
    if (st.skipped > 0) {
      std::printf("  slow subscribers of the drop stream were skipped %llu times (each is told the gap)\n",
                  (unsigned long long)st.skipped);
    }
    for (const auto& [status, n] : st.failures) {
      std::printf("  failed %llu x %s\n", (unsigned long long)n, fl_status_str(status));
      if (const char* hint = failureHint(status)) std::printf("    -> %s\n", hint);
    }
  }
}

// Plans the frames, attaches, sends them all and waits for their completions; then the summary.
int runSend(const SendOptions& o) {
  installInterruptHandler();
  FramePlan plan;
  if (const int rc = planFrames(o, plan); rc != 0) return rc;
  uint64_t slot_size = 0;
  if (const int rc = chooseSlotSize(o, plan.largest, slot_size); rc != 0) return rc;
  const uint64_t count = !o.files.empty() ? o.files.size() : (o.count_set ? o.count : 100);
  auto producer = attachProducer(o, slot_size, plan.largest);
  if (!producer) return 1;

  Journal journal;
  if (!o.journal.empty() && !journal.open(o.journal)) {
    std::fprintf(stderr, "framelink send: cannot open the journal %s: %s\n", o.journal.c_str(),
                 std::strerror(errno));
    return 2;
  }
  auto prepare = [&](uint64_t index, fl_slot& slot, FrameSpec& spec, std::string& e) -> bool {
    if (!o.files.empty()) return prepareFile(o.files[index], plan.file_sizes[index], index, slot, spec, e);
    const uint64_t id = o.first_id + index;
    describePatternFrame(id, plan.sizes->sizeOf(id), spec);
    pattern::fillPattern(id, slot.data, spec.length);
    journal.record("S", id);  // about to be submitted
    return true;
  };
  auto more = [&](uint64_t index) { return count == 0 || index < count; };
  auto completed = [&](const fl_completion& c) { journal.record("C", c.frame_id, c.status); };
  ProducerStats st = producer->run(more, prepare, completed, nullptr);

  printSendSummary(o, st);
  if (!st.error.empty()) std::fprintf(stderr, "framelink send: %s\n", st.error.c_str());
  if (st.interrupted) {
    std::fprintf(stderr, "framelink send: interrupted after %llu frames\n", (unsigned long long)st.submitted);
  }
  std::fflush(stdout);
  if (st.interrupted) return 130;
  return st.allDelivered() ? 0 : 1;
}

}  // namespace

void addSendCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<SendOptions>();
  auto* cmd = app.add_subcommand("send", "Send synthetic frames or files as a producer");
  cmd->add_option("--socket", o->socket,
                  "framelinkd attach socket (default: $FRAMELINK_SOCKET or " FL_DEFAULT_SOCKET_PATH ")");
  cmd->add_option("--stream", o->stream, "stream name")->required();
  cmd->add_option("--count", o->count, "number of synthetic frames (default 100; 0 = until Ctrl-C)")
      ->each([o](const std::string&) { o->count_set = true; });
  auto* size = cmd->add_option("--size", o->size, "bytes per frame, suffixes K/M/G (default 1M)");
  auto* rnd = cmd->add_option("--random-size", o->random_size, "MIN:MAX: random sizes (see --seed)");
  size->excludes(rnd);
  cmd->add_option("--seed", o->seed, "seed of --random-size (default 1)");
  cmd->add_option("--rate", o->rate, "frames per second (default: as fast as possible)");
  cmd->add_option("--slots", o->slots,
                  "slots to ask the daemon for (default: its [limits] default_slot_count)");
  cmd->add_option("--slot-size", o->slot_size, "bytes per slot (default: the largest frame, page-rounded)");
  cmd->add_flag("--crc", o->crc, "send a CRC32C with each frame; the receiving daemon checks it");
  cmd->add_option("--first-id", o->first_id, "frame_id of the first synthetic frame (default 0)");
  cmd->add_flag("--quiet,-q", o->quiet, "print nothing unless something failed");
  cmd->add_flag("--json", o->json, "print the summary as one JSON object");
  cmd->add_option("--journal", o->journal,
                  "append '<monotonic ns> S|C <frame id> <status>' per frame submitted / completed to FILE");
  cmd->add_flag("--reattach,!--no-reattach", o->reattach,
                "when the daemon goes away (restart), attach again once it is back and go on (default, "
                "unless $FRAMELINK_AUTO_REATTACH=0); frames in flight then fail FL_ERR_DAEMON_GONE "
                "(outcome unknown); --no-reattach: stop with an error");
  cmd->add_option("files", o->files,
                  "send each FILE as one frame (frame_id = index, attrs = name=<basename>)");
  cmd->callback([o, &exit_code] { exit_code = runSend(*o); });
}

}  // namespace framelink::cli
