// SIGHUP (systemctl reload) and `framelink reload` read the configuration
// again: log_level, the peers (added, moved, removed), their routes and
// tokens take effect at once, every other change is named with the restart it
// needs, and a file that does not parse is refused with the message a start
// would give while the daemon keeps serving with its running configuration.
#include <signal.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "framelink/framelink.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

void writeConfig(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

}  // namespace

TEST_CASE(
    "reload: SIGHUP applies log_level, names the changes that need a restart, and refuses a bad file "
    "while the daemon keeps serving",
    "[integration][admin]") {
  TempDir dir("fl-reload");
  const std::string file = dir.file("framelinkd.toml");
  writeConfig(file, "[daemon]\nlog_level = \"info\"\n[limits]\nmax_slots = 64\n");
  DaemonProcess::Options o;
  o.id = "reloaded";
  o.log_level.clear();  // the file's
  o.extra_args = {"--config", file};
  DaemonProcess d(o);
  Client before = attachProducer(d, "kept", 2, 4096);

  // A changed level applies at once; a changed limit is named, not applied.
  writeConfig(file, "[daemon]\nlog_level = \"debug\"\n[limits]\nmax_slots = 32\n");
  REQUIRE(::kill(d.pid(), SIGHUP) == 0);
  CHECK(d.waitForLog("reload: [daemon] log_level info -> debug", Millis(5000)));
  CHECK(d.waitForLog("reload: [limits] max_slots changed and take effect at the next restart", Millis(5000)));
  AttachResult r = tryAttach(d.socketPath(), FL_CONSUMER, "kept", 48, 4096);
  INFO(statusName(r.status) << ": " << r.message);
  CHECK(r.status == FL_OK);  // the running limit (64) still holds

  // A file that does not parse: refused as at start, the running configuration stays.
  writeConfig(file, "[daemon]\nlog_level = \"loud\"\n");
  REQUIRE(::kill(d.pid(), SIGHUP) == 0);
  CHECK(d.waitForLog("reload: the configuration is refused, the running one stays", Millis(5000)));
  CHECK(d.waitForLog("loud", Millis(5000)));
  REQUIRE(d.alive());
  CHECK(fl_check_daemon(before.get()) == FL_OK);
  Client after = attachProducer(d, "after-reload", 2, 4096);
  CHECK(fl_check_daemon(after.get()) == FL_OK);
}

namespace {

std::string peerTable(const std::string& name, const DaemonProcess& d, const std::string& stream) {
  return "[[peer]]\nname = \"" + name + "\"\naddress = \"" + d.grpcAddress() + "\"\nstreams = [\"" + stream +
         "\"]\n";
}

using SteadyClock = std::chrono::steady_clock;

// One frame at a time from `producer` to `consumer` on its own thread (no
// Catch macro there), each round -- submit, receive, release, completion --
// timed, until stopped.
class Steady {
 public:
  struct Round {
    SteadyClock::time_point start;
    SteadyClock::duration took;
  };
  Steady(fl_client* producer, fl_client* consumer, uint64_t first_id)
      : producer_(producer), consumer_(consumer), next_id_(first_id), thread_([this] { run(); }) {}
  ~Steady() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t nextId() const { return next_id_; }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }
  // The rounds that ran, whole or in part, between `from` and `to`.
  std::vector<Round> during(SteadyClock::time_point from, SteadyClock::time_point to) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Round> out;
    for (const Round& r : rounds_) {
      if (r.start <= to && r.start + r.took >= from) out.push_back(r);
    }
    return out;
  }

 private:
  void run() {
    while (!stop_) {
      const auto start = SteadyClock::now();
      const uint64_t id = next_id_;
      std::string why = trySubmitFrame(producer_, id, 4096);
      fl_frame f{};
      if (why.empty() && fl_receive(consumer_, &f, 10000) != FL_OK) why = "no frame " + std::to_string(id);
      if (why.empty() && f.frame_id != id)
        why = "frame " + std::to_string(f.frame_id) + " for " + std::to_string(id);
      if (why.empty()) fl_release(consumer_, f.slot);
      fl_completion c{};
      size_t n = 0;
      if (why.empty() &&
          (fl_wait_completions(producer_, &c, 1, &n, 10000) != FL_OK || n != 1 || c.status != FL_OK)) {
        why = "frame " + std::to_string(id) + " did not complete FL_OK";
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (!why.empty()) {
        error_ = why;
        return;
      }
      rounds_.push_back({start, SteadyClock::now() - start});
      next_id_ = id + 1;
    }
  }

  fl_client* producer_;
  fl_client* consumer_;
  std::atomic<uint64_t> next_id_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::vector<Round> rounds_;
  std::string error_;
  std::thread thread_;
};

double ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// `framelink reload` against `d`: its exit code, its output in `out`.
int reloadWithCli(const DaemonProcess& d, std::string& out) {
  ChildProcess cli("reload", {"reload", "--socket", d.socketPath()});
  const int code = cli.wait(Millis(10000));
  out = cli.output();
  return code;
}

}  // namespace

TEST_CASE("reload: framelink reload adds and removes a peer while frames flow on a link it does not touch",
          "[integration][admin]") {
  const std::string token = "[link]\ntoken = \"reload-secret\"\n";
  DaemonProcess::Options ob;
  ob.token = "reload-secret";
  ob.id = "b";
  DaemonProcess b(ob);
  DaemonProcess::Options oc = ob;
  oc.id = "c";
  DaemonProcess c(oc);
  TempDir dir("fl-reload-peers");
  const std::string file = dir.file("framelinkd.toml");
  writeConfig(file, token + peerTable("b", b, "kept"));
  DaemonProcess::Options oa;
  oa.id = "a";
  oa.extra_args = {"--config", file, "--metrics", "127.0.0.1:0"};
  DaemonProcess a(oa);

  Client kept_consumer = attachConsumer(b, "kept", 4, 64 * 1024);
  Client kept = attachProducer(a, "kept", 4, 64 * 1024);
  auto sendKept = [&](uint64_t first, uint64_t count) {
    for (uint64_t id = first; id < first + count; ++id) {
      submitFrame(kept.get(), id, 4096);
      fl_frame f = receiveFrame(kept_consumer.get(), Millis(10000));
      checkSyntheticFrame(f, id, 4096);
      fl_release(kept_consumer.get(), f.slot);
      auto done = collectCompletions(kept.get(), 1, Millis(10000));
      REQUIRE(done.size() == 1);
      CHECK(done[0].status == FL_OK);
    }
  };
  sendKept(1, 5);
  REQUIRE(waitUntil([&] { return a.metric("framelink_links_up") == 1; }, Millis(15000), Millis(50)));

  // A producer of a stream no peer takes yet is refused.
  {
    Client early = attachProducer(a, "added", 2, 64 * 1024);
    submitFrame(early.get(), 1, 4096);
    auto done = collectCompletions(early.get(), 1, Millis(10000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_ERR_NO_ROUTE);
  }

  // c is added: the file gains its table, and the CLI reloads.
  writeConfig(file, token + peerTable("b", b, "kept") + peerTable("c", c, "added"));
  // Frames keep moving on the link to b, one at a time, while the reload runs.
  Steady steady(kept.get(), kept_consumer.get(), 6);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto reload_from = SteadyClock::now();
  std::string out;
  const int reloaded = reloadWithCli(a, out);
  // What the daemon does after it answered (the agent's part, the new dialer) counts too.
  const auto reload_to = SteadyClock::now() + std::chrono::milliseconds(500);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  steady.stop();
  REQUIRE(reloaded == 0);
  INFO(out);
  CHECK(steady.error().empty());
  const auto before = steady.during(reload_from - std::chrono::milliseconds(500), reload_from);
  const auto during = steady.during(reload_from, reload_to);
  auto slowest = [](const std::vector<Steady::Round>& rounds) {
    SteadyClock::duration m{};
    for (const auto& r : rounds) m = std::max(m, r.took);
    return m;
  };
  const auto slow = std::count_if(during.begin(), during.end(), [](const Steady::Round& r) {
    return r.took > std::chrono::milliseconds(100);
  });
  std::printf(
      "reload: %zu frames on the untouched link while the reload ran (%.0f ms), the slowest %.2f ms, %ld "
      "past 100 ms; before it: %zu frames, the slowest %.2f ms\n",
      during.size(), ms(reload_to - reload_from), ms(slowest(during)), static_cast<long>(slow), before.size(),
      ms(slowest(before)));
  CHECK(during.size() > 0);
  CHECK(slow == 0);
  CHECK(out.find("applied: [[peer]] c added (dials " + c.grpcAddress() + ")") != std::string::npos);
  CHECK(out.find("configuration ") != std::string::npos);
  Client added_consumer = attachConsumer(c, "added", 4, 64 * 1024);
  Client added = attachProducer(a, "added", 4, 64 * 1024);
  submitFrame(added.get(), 1, 4096);
  fl_frame f = receiveFrame(added_consumer.get(), Millis(15000));
  checkSyntheticFrame(f, 1, 4096);
  fl_release(added_consumer.get(), f.slot);
  // The link to b was not touched: the same producer goes on, and only c's link came up.
  sendKept(steady.nextId(), 5);
  CHECK(waitUntil([&] { return a.metric("framelink_links_up") == 2; }, Millis(15000), Millis(50)));
  CHECK(a.metric("framelink_link_failures_total") == 0);
  CHECK(a.httpGet("/stats").find("\"reloads\":1") != std::string::npos);

  // b is removed: its link ends, and the stream it took goes nowhere (named in the log).  The
  // producer of it, attached all along, follows: its next frame fails FL_ERR_NO_ROUTE.
  writeConfig(file, token + peerTable("c", c, "added"));
  REQUIRE(reloadWithCli(a, out) == 0);
  CHECK(out.find("applied: [[peer]] b removed") != std::string::npos);
  CHECK(a.waitForLog("peer b at " + b.grpcAddress() + ": no longer dialed", Millis(10000)));
  CHECK(a.waitForLog("reload: stream 'kept' is now routed to nowhere (was b)", Millis(5000)));
  CHECK(waitUntil([&] { return a.metric("framelink_links_up") == 1; }, Millis(15000), Millis(50)));
  const uint64_t next = steady.nextId() + 5;
  submitFrame(kept.get(), next, 4096);
  auto refused = collectCompletions(kept.get(), 1, Millis(10000));
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].status == FL_ERR_NO_ROUTE);

  // c takes the stream too: the same producer, never reattached, sends there from its next frame.
  const std::string c_both =
      "[[peer]]\nname = \"c\"\naddress = \"" + c.grpcAddress() + "\"\nstreams = [\"added\", \"kept\"]\n";
  writeConfig(file, token + c_both);
  Client kept_on_c = attachConsumer(c, "kept", 4, 64 * 1024);
  REQUIRE(reloadWithCli(a, out) == 0);
  CHECK(out.find("applied: [[peer]] c streams added -> added,kept") != std::string::npos);
  CHECK(a.waitForLog("reload: stream 'kept' is now routed to c (was nowhere)", Millis(5000)));
  submitFrame(kept.get(), next + 1, 4096);
  f = receiveFrame(kept_on_c.get(), Millis(15000));
  checkSyntheticFrame(f, next + 1, 4096);
  fl_release(kept_on_c.get(), f.slot);
  auto delivered = collectCompletions(kept.get(), 1, Millis(10000));
  REQUIRE(delivered.size() == 1);
  CHECK(delivered[0].status == FL_OK);

  // A file that does not parse: refused by the CLI with the reason, exit 1; the running one stays.
  writeConfig(file, "[daemon]\nlog_level = \"loud\"\n" + token + c_both);
  CHECK(reloadWithCli(a, out) == 1);
  CHECK(out.find("refused, the running configuration stays") != std::string::npos);
  CHECK(out.find("loud") != std::string::npos);
  submitFrame(added.get(), 2, 4096);
  f = receiveFrame(added_consumer.get(), Millis(15000));
  checkSyntheticFrame(f, 2, 4096);
  fl_release(added_consumer.get(), f.slot);
}

TEST_CASE("reload: a removed peer with a token of its own is cut and refused; one holding link.token is left",
          "[integration][admin]") {
  TempDir dir("fl-reload-revoke");
  const std::string file = dir.file("framelinkd.toml");
  const std::string shared = "[link]\ntoken = \"shared-secret\"\n";
  const std::string b_table = "[[peer]]\nname = \"b\"\ntoken = \"b-own-secret\"\n";
  writeConfig(file, shared + b_table);
  DaemonProcess::Options oa;
  oa.id = "a";
  oa.extra_args = {"--config", file, "--metrics", "127.0.0.1:0"};
  DaemonProcess a(oa);
  // b proves its id with a token of its own, c with link.token; both dial a.
  DaemonProcess::Options ob;
  ob.id = "b";
  ob.token = "b-own-secret";
  ob.peers = {"a=" + a.grpcAddress()};
  ob.extra_args = {"--metrics", "127.0.0.1:0"};
  DaemonProcess b(ob);
  DaemonProcess::Options oc = ob;
  oc.id = "c";
  oc.token = "shared-secret";
  DaemonProcess c(oc);
  REQUIRE(waitUntil([&] { return a.metric("framelink_links_up") >= 2; }, Millis(15000), Millis(50)));
  // a dials c too, once c is a [[peer]] of its own.
  writeConfig(file, shared + b_table + "[[peer]]\nname = \"c\"\naddress = \"" + c.grpcAddress() + "\"\n");
  std::string out;
  REQUIRE(reloadWithCli(a, out) == 0);
  REQUIRE(a.metric("framelink_auth_failures_total") == 0);

  // Both removed: b's link ends and its token is refused from then on.  a no
  // longer dials c, but c holds the token any peer may use: cutting the link
  // c dialed would only make it dial again, so it is left.
  writeConfig(file, shared);
  REQUIRE(reloadWithCli(a, out) == 0);
  INFO(out);
  CHECK(out.find("[[peer]] b removed (its links end and its token is refused)") != std::string::npos);
  CHECK(out.find("[[peer]] c removed (no longer dialed; it may still dial in") != std::string::npos);
  CHECK(a.waitForLog("peer c at " + c.grpcAddress() + ": no longer dialed", Millis(10000)));
  // b keeps dialing and is refused each time; the link c dialed is the one left.
  CHECK(
      waitUntil([&] { return a.metric("framelink_auth_failures_total") >= 2; }, Millis(20000), Millis(100)));
  CHECK(waitUntil([&] { return a.metric("framelink_links_up") == 1; }, Millis(15000), Millis(50)));
  CHECK(b.metric("framelink_links_up") == 0);
  CHECK(c.metric("framelink_links_up") == 1);
}
