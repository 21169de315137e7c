// Local security rules, checked with a second local user: a forked child
// that drops to nobody/nogroup (65534) and tries what another user on the
// host could try, among it every way to write a producer's segment lent to
// it (hostile_reader.h), and a subscriber that keeps every frame it is given.
// (The tests run as root, as CI does; without root they fail and say so.)
// And the peer token is the daemon's secret: a token file other users can
// read is named at start.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "client_util.h"
#include "frame_pattern.h"
#include "framelink/framelink.h"
#include "harness.h"
#include "hostile_reader.h"
#include "hostile_util.h"

using namespace framelink::integ;

namespace {

constexpr uid_t kThirdUser = 65533;  // a user that is neither the daemon's nor nobody

// fl_attach as the calling user; the status as an exit code (statuses fit in 0..255).
int attachStatus(const std::string& socket) {
  fl_client_options opt;
  fl_client_options_init(&opt);
  opt.socket_path = socket.c_str();
  opt.role = FL_PRODUCER;
  opt.stream = "sec";
  opt.slot_count = 2;
  opt.slot_size = 64 * 1024;
  fl_client* c = nullptr;
  const int rc = fl_attach(&opt, &c);
  if (rc == FL_OK) fl_detach(c);
  if (rc != FL_OK && std::strlen(fl_last_error()) == 0) return 251;  // a refusal must say why
  return rc;
}

// The next frame id the hostile reader says it is done with (0: it
// attached); nothing when it said nothing within `timeout` or is gone.
std::optional<uint64_t> readProgress(int fd, Millis timeout) {
  pollfd pfd{fd, POLLIN, 0};
  uint64_t id = 0;
  if (::poll(&pfd, 1, static_cast<int>(timeout.count())) != 1) return std::nullopt;
  if (::read(fd, &id, sizeof id) != sizeof id) return std::nullopt;
  return id;
}

std::string outcomeText(int32_t outcome) {
  if (outcome == kAttackWrote) return "IT WROTE THE SEGMENT";
  if (outcome == kAttackNotTried) return "not tried";
  return std::strerror(outcome);
}

}  // namespace

TEST_CASE("security: the uid/gid allow-list decides who may attach", "[security]") {
  DaemonPair::Options po;
  // World-connectable socket, so that only SO_PEERCRED stands between
  // nobody and the daemon: A allows root only, B also allows the group nogroup.
  po.extra_args_a = {"--socket-mode", "0666", "--allow-uid", "0"};
  po.extra_args_b = {"--socket-mode", "0666", "--allow-uid", "0", "--allow-gid", std::to_string(kNogroup)};
  DaemonPair pair(po);
  for (auto* d : {&pair.a(), &pair.b()}) REQUIRE(::chmod(dirOf(d->socketPath()).c_str(), 0711) == 0);

  const std::string sock_a = pair.a().socketPath(), sock_b = pair.b().socketPath();
  CHECK(runAsNobody([&] { return attachStatus(sock_a); }) == FL_ERR_ATTACH_REFUSED);
  CHECK(pair.a().waitForLog("is not allowed to attach", Millis(5000)));
  CHECK(runAsNobody([&] { return attachStatus(sock_b); }) == FL_OK);
  CHECK(attachStatus(sock_a) == FL_OK);  // root is on A's list
  requireServing(pair.a(), pair.b(), "after-refusal");
}

TEST_CASE("security: the socket mode keeps other users out before any policy", "[security]") {
  DaemonPair::Options po;
  po.extra_args_a = {"--socket-mode", "0600"};
  DaemonPair pair(po);
  REQUIRE(::chmod(dirOf(pair.a().socketPath()).c_str(), 0711) == 0);
  struct stat st {};
  REQUIRE(::stat(pair.a().socketPath().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(runAsNobody([&] { return attachStatus(pair.a().socketPath()); }) == FL_ERR_DAEMON_UNREACHABLE);
}

TEST_CASE("security: another user cannot reach a client's segments", "[security]") {
  DaemonPair pair("tcp");
  Client producer = attachProducer(pair.a(), "private", 2, 64 * 1024);
  Client consumer = attachConsumer(pair.b(), "private", 2, 64 * 1024);
  submitFrame(producer.get(), 1, 1000, true);
  fl_frame f = receiveFrame(consumer.get(), Millis(15000));
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);

  // The segments are memfds handed over the socket: no name in /dev/shm, and
  // the daemon's descriptors under /proc are closed to other users.
  for (pid_t pid : {pair.a().pid(), pair.b().pid(), ::getpid()}) {
    INFO("pid " << pid);
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    const int code = runAsNobody([&] {
      DIR* d = ::opendir(fd_dir.c_str());
      if (d != nullptr) return 10;  // could list them
      if (errno != EACCES) return 11;
      for (int fd = 0; fd < 64; ++fd) {
        const std::string p = fd_dir + "/" + std::to_string(fd);
        const int o = ::open(p.c_str(), O_RDONLY);
        if (o >= 0) return 12;  // could open one
      }
      const std::string maps = "/proc/" + std::to_string(pid) + "/map_files";
      if (::opendir(maps.c_str()) != nullptr) return 13;
      return 0;
    });
    CHECK(code == 0);
  }
  DIR* shm = ::opendir("/dev/shm");
  REQUIRE(shm != nullptr);
  while (dirent* e = ::readdir(shm)) {
    INFO("/dev/shm/" << e->d_name);
    CHECK(std::string(e->d_name).find("framelink") == std::string::npos);
  }
  ::closedir(shm);
}

TEST_CASE("security: the daemon warns at start when its token file is open to other users", "[security]") {
  TempDir dir("fl-tokfile");
  const std::string file = dir.file("peer.token");
  { std::ofstream(file) << "a-secret\n"; }
  for (const mode_t mode : {0640, 0600}) {
    INFO("token file mode " << std::oct << mode);
    REQUIRE(::chmod(file.c_str(), mode) == 0);
    DaemonProcess::Options o;
    o.id = "tokfile";
    o.extra_args = {"--token-file", file};
    DaemonProcess d(o);
    const bool warned = d.log().find("chmod 0600 " + file) != std::string::npos;
    CHECK(warned == (mode != 0600));
  }
}

TEST_CASE("security: the daemon warns at start when its peer token would cross the network in clear",
          "[security]") {
  struct Case {
    const char* listen;
    std::vector<std::string> peers;
    const char* expect;  // in the warning; "": no warning
  };
  const Case k = GENERATE(values<Case>({
      {"0.0.0.0:0", {}, "(link.listen 0.0.0.0:0)"},
      {"127.0.0.1:0", {"far=192.0.2.7:7700"}, "(peer far at 192.0.2.7:7700)"},
      {"127.0.0.1:0", {"near=127.0.0.1:9"}, ""},
  }));
  INFO("listen " << k.listen << (k.peers.empty() ? "" : ", peer " + k.peers[0]));
  DaemonProcess::Options o;
  o.id = "clear";
  o.token = "a-secret";
  o.listen = k.listen;
  o.peers = k.peers;
  DaemonProcess d(o);
  const std::string log = d.log();
  const size_t warning = log.find("the peer token crosses the network in clear");
  if (*k.expect == '\0') {
    CHECK(warning == std::string::npos);
  } else {
    REQUIRE(warning != std::string::npos);
    CHECK(log.find(k.expect, warning) != std::string::npos);
    CHECK(log.find("Turn on mutual TLS", warning) != std::string::npos);
  }
}

// A producer's segment is lent to every local reader of its stream (design.md
// section 4a).  A reader of another user gets a read-only fd of it; nothing
// the kernel offers turns that into a way to write the producer's memory,
// and while it tries them all on every frame, the honest reader of the same
// stream sees every frame intact and the producer gets DELIVERED for each.
TEST_CASE("security: a reader of another user cannot write, punch, seal or re-open a lent segment",
          "[security]") {
  const uid_t producer_uid = GENERATE(kThirdUser, kNobody);
  const bool same_uid = producer_uid == kNobody;
  INFO("producer uid " << producer_uid << ", hostile reader uid " << kNobody
                       << ", daemon and honest reader root");
  constexpr uint32_t kFrames = 300;
  constexpr uint64_t kLength = 64 * 1024;
  DaemonProcess::Options o;
  o.id = "lend";
  // Anyone may open the socket; SO_PEERCRED admits the daemon's own uid and
  // these two (every client that may attach may read any stream).
  o.extra_args = {"--metrics", "127.0.0.1:0", "--socket-mode", "0666"};
  for (const uid_t uid : {kThirdUser, kNobody}) {
    o.extra_args.insert(o.extra_args.end(), {"--allow-uid", std::to_string(uid)});
  }
  DaemonProcess d(o);
  REQUIRE(::chmod(dirOf(d.socketPath()).c_str(), 0711) == 0);

  LendTrialPtr trial = makeLendTrial();
  int progress[2];
  REQUIRE(::pipe2(progress, O_CLOEXEC) == 0);
  HostileReaderOptions ro;
  ro.socket = d.socketPath();
  ro.stream = "lend";
  ro.frames = kFrames;
  ro.slot_size = kLength;
  ro.spare_producer_process = same_uid;
  ro.progress_fd = progress[1];
  ro.trial = trial.get();
  ChildAsUser reader(kNobody, kNogroup, [&] { return runHostileReader(ro); });
  ::close(progress[1]);
  struct CloseOnExit {
    int fd;
    ~CloseOnExit() { ::close(fd); }
  } progress_read{progress[0]};
  {
    const std::optional<uint64_t> attached = readProgress(progress[0], Millis(15000));
    INFO("hostile reader: " << trial->reader_failure);
    REQUIRE(attached == uint64_t{0});
  }

  Client honest = attachWith(d, FL_CONSUMER, "lend", true, 4, kLength);
  const gid_t producer_gid = same_uid ? kNogroup : kThirdUser;
  ChildAsUser producer(producer_uid, producer_gid, [&] {
    return runLendProducer(d.socketPath(), "lend", kFrames, kLength, trial.get());
  });
  uint32_t intact = 0;
  std::string first_bad;
  for (uint64_t id = 1; id <= kFrames; ++id) {
    fl_frame f = receiveFrame(honest.get(), Millis(20000));
    // The hostile reader has tried everything on this frame before it is checked.
    const std::optional<uint64_t> attacked = readProgress(progress[0], Millis(20000));
    INFO("hostile reader: " << trial->reader_failure);
    REQUIRE(attacked == id);
    const size_t bad = framelink::pattern::verifyPattern(id, f.data, f.length);
    if (f.frame_id == id && f.length == kLength && bad == framelink::pattern::kNpos) {
      ++intact;
    } else if (first_bad.empty()) {
      first_bad = "frame " + std::to_string(id) + " (got id " + std::to_string(f.frame_id) + ", " +
                  std::to_string(f.length) + " bytes): first wrong byte at " + std::to_string(bad);
    }
    REQUIRE(fl_release(honest.get(), f.slot) == FL_OK);
  }
  INFO("first corrupt frame: " << first_bad);
  CHECK(intact == kFrames);
  const int producer_exit = producer.wait(Millis(20000));
  INFO("producer: " << trial->producer_failure);
  CHECK(producer_exit == 0);
  CHECK(trial->delivered == kFrames);
  const int reader_exit = reader.wait(Millis(20000));
  INFO("hostile reader: " << trial->reader_failure);
  CHECK(reader_exit == 0);
  CHECK(trial->lent_frames == kFrames);
  CHECK(waitForMetric(d, "framelink_local_frames_lent_total", 2 * kFrames) == 2 * kFrames);

  // What the reader holds: a read-only fd of a file that only the daemon's
  // uid owns, and may open only for reading.
  CHECK(trial->lent_access_mode == O_RDONLY);
  CHECK(trial->lent_file_mode == 0400);
  CHECK(trial->lent_file_uid == 0);  // the daemon's (root here)
  for (uint32_t i = 0; i < kLendAttacks; ++i) {
    const auto attack = static_cast<LendAttack>(i);
    INFO(lendAttackName(attack) << ": " << outcomeText(trial->outcome[i]));
    if (same_uid && throughProducerProcess(attack)) {
      CHECK(trial->outcome[i] == kAttackNotTried);  // ptrace rights over the producer: its own uid has them
    } else {
      CHECK(trial->outcome[i] > 0);  // tried on every frame, refused every time
    }
  }
}

TEST_CASE(
    "security: a subscriber of another user that keeps every frame holds the producer's slots no longer "
    "than ack_timeout_ms",
    "[security]") {
  constexpr uint64_t kFrames = 40;
  constexpr uint32_t kSlots = 8;
  constexpr uint64_t kLength = 64 * 1024;
  DaemonProcess::Options o;
  o.id = "hoard";
  o.extra_args = {"--metrics",     "127.0.0.1:0", "--socket-mode",    "0666", "--allow-uid",         "65534",
                  "--drop-stream", "cam",         "--ack-timeout-ms", "300",  "--credit-timeout-ms", "1000"};
  DaemonProcess d(o);
  REQUIRE(::chmod(dirOf(d.socketPath()).c_str(), 0711) == 0);
  int progress[2];
  REQUIRE(::pipe2(progress, O_CLOEXEC) == 0);
  // nobody subscribes, takes every frame it is given and releases none; it
  // says how many it holds after each.
  ChildAsUser hoarder(kNobody, kNogroup, [&] {
    fl_client_options opt;
    fl_client_options_init(&opt);
    opt.socket_path = d.socketPath().c_str();
    opt.role = FL_CONSUMER;
    opt.stream = "cam";
    opt.subscribe = 1;
    opt.slot_count = kSlots;
    opt.slot_size = kLength;
    fl_client* c = nullptr;
    if (fl_attach(&opt, &c) != FL_OK) return 10;
    for (uint64_t held = 0;; ++held) {
      if (::write(progress[1], &held, sizeof held) != sizeof held) return 11;
      fl_frame f{};
      while (fl_receive(c, &f, 1000) != FL_OK) {
      }
    }
  });
  ::close(progress[1]);
  struct CloseOnExit {
    int fd;
    ~CloseOnExit() { ::close(fd); }
  } progress_read{progress[0]};
  REQUIRE(readProgress(progress[0], Millis(15000)) == uint64_t{0});

  Client honest = attachWith(d, FL_CONSUMER, "cam", true, kSlots, kLength);
  Client producer = attachProducer(d, "cam", kSlots, kLength);
  uint64_t received = 0;
  for (uint64_t id = 1; id <= kFrames; ++id) {
    // Each acquire waits at most 10 s: with the eight slots held for good,
    // the ninth would never come.
    submitFrame(producer.get(), id, 1000 + id);
    fl_frame f = receiveFrame(honest.get(), Millis(10000));
    received += f.frame_id == id ? 1 : 0;
    REQUIRE(fl_release(honest.get(), f.slot) == FL_OK);
  }
  CHECK(received == kFrames);
  auto done = collectCompletions(producer.get(), kFrames, Millis(20000));
  REQUIRE(done.size() == kFrames);
  for (const fl_completion& c : done) {
    INFO("frame " << c.frame_id << ": " << statusName(c.status));
    // The hoarder's eight end for it at ack_timeout_ms; it is skipped for the rest (no free slot).
    CHECK(c.status == (c.frame_id <= kSlots ? FL_ERR_TIMEOUT : FL_OK));
  }
  // It took the eight and holds them; they are taken back all the same.
  std::optional<uint64_t> held;
  while (std::optional<uint64_t> more = readProgress(progress[0], Millis(200))) held = more;
  CHECK(held == uint64_t{kSlots});
  CHECK(waitForMetric(d, "framelink_local_frames_taken_back_total", kSlots) == kSlots);
}
