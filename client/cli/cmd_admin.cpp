// `framelink stats`, `framelink clients`, `framelink links`: what the daemon
// is doing, from an admin request over the attach socket; `framelink reload`.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <framelink/attach_proto.h>
#include <framelink/framelink.h>

#include "admin.h"
#include "cli_util.h"
#include "commands.h"

namespace framelink::cli {

namespace {

struct AdminOptions {
  std::string socket;
  bool json = false;
  bool once = false;
  double interval = 1.0;
  int timeout_ms = 5000;
};

void addCommon(CLI::App* cmd, AdminOptions& o) {
  cmd->add_option("--socket", o.socket,
                  "framelinkd attach socket (default: $FRAMELINK_SOCKET or " FL_DEFAULT_SOCKET_PATH ")");
  cmd->add_flag("--json", o.json, "print JSON instead of a table");
  cmd->add_option("--timeout-ms", o.timeout_ms, "how long to wait for the daemon (default 5000)")
      ->check(CLI::Range(1, 600000));
}

std::optional<Json> fetch(const AdminOptions& o, const char* command) {
  AdminReply r = fetchSnapshot(resolveSocket(o.socket), o.timeout_ms);
  if (r.status != 0) {
    std::fprintf(stderr, "framelink %s: %s\n", command, r.message().c_str());
    return std::nullopt;
  }
  return std::move(r.snapshot);
}

int runStats(const AdminOptions& o) {
  installInterruptHandler();
  std::optional<Json> before;
  uint64_t before_ns = 0;
  const bool tty = ::isatty(STDOUT_FILENO) != 0 && !o.json;
  const auto interval_ns = static_cast<uint64_t>(o.interval * 1e9);
  for (bool printed = false;;) {
    std::optional<Json> now = fetch(o, "stats");
    const uint64_t now_ns = monotonicNs();
    if (!now) return 1;
    const double seconds = before ? static_cast<double>(now_ns - before_ns) / 1e9 : 0;
    // --once: the rates need a second sample, one interval later.
    if (!o.once || before) {
      const Json* prev = before ? &*before : nullptr;
      if (o.json) {
        std::printf("%s\n", statsJson(*now, prev, seconds).dump().c_str());
      } else {
        if (tty) std::printf("\033[H\033[2J");  // redraw in place
        if (printed && !tty) std::printf("\n");
        std::fputs(formatStats(*now, prev, seconds).c_str(), stdout);
      }
      std::fflush(stdout);
      printed = true;
      if (o.once) return 0;
    }
    before = std::move(now);
    before_ns = now_ns;
    for (uint64_t slept = 0; slept < interval_ns && !g_interrupted; slept += 50'000'000) {
      sleepNs(std::min<uint64_t>(50'000'000, interval_ns - slept));
    }
    if (g_interrupted) return 0;
  }
}

// `framelink reload`: the daemon reads its configuration again (as on
// SIGHUP) and says what it applied, what waits for a restart, or why it
// refused the file.  Exit status 1 when refused.
int runReload(const AdminOptions& o) {
  AdminReply r = fetchSnapshot(resolveSocket(o.socket), o.timeout_ms, FL_ADMIN_RELOAD);
  if (r.status != 0) {
    std::fprintf(stderr, "framelink reload: %s\n", r.message().c_str());
    return 1;
  }
  const Json& out = r.snapshot;
  const bool refused = out.value("result", "") == "refused";
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return refused ? 1 : 0;
  }
  if (refused) {
    std::fprintf(stderr, "framelink reload: refused, the running configuration stays: %s\n",
                 out.value("error", "").c_str());
    return 1;
  }
  auto lines = [&out](const char* key) { return out.contains(key) ? out[key] : Json::array(); };
  for (const auto& line : lines("applied")) std::printf("applied: %s\n", line.get<std::string>().c_str());
  for (const auto& key : lines("restart")) {
    std::printf("at the next restart: %s (systemctl restart framelinkd)\n", key.get<std::string>().c_str());
  }
  for (const auto& w : lines("warnings")) std::printf("warning: %s\n", w.get<std::string>().c_str());
  if (lines("applied").empty() && lines("restart").empty()) std::printf("nothing changed\n");
  std::printf("configuration %s running\n", out.value("config_hash", "?").c_str());
  return 0;
}

}  // namespace

void addAdminCommands(CLI::App& app, int& exit_code) {
  auto so = std::make_shared<AdminOptions>();
  auto* stats =
      app.add_subcommand("stats", "Counters and rates of the local framelinkd, refreshed every second");
  addCommon(stats, *so);
  stats->add_flag("--once", so->once, "print once (rates over one interval) and exit");
  stats->add_option("--interval", so->interval, "seconds between refreshes (default 1)")
      ->check(CLI::Range(0.1, 3600.0));
  stats->callback([so, &exit_code] { exit_code = runStats(*so); });

  auto co = std::make_shared<AdminOptions>();
  auto* clients = app.add_subcommand("clients", "Applications attached to the local framelinkd");
  addCommon(clients, *co);
  clients->callback([co, &exit_code] {
    auto snap = fetch(*co, "clients");
    if (!snap) {
      exit_code = 1;
      return;
    }
    const Json& detail = (*snap)["metrics"]["detail"];
    if (co->json) {
      std::printf("%s\n", (detail.contains("clients") ? detail["clients"] : Json::array()).dump(2).c_str());
    } else {
      std::fputs(formatClients(*snap).c_str(), stdout);
    }
    exit_code = 0;
  });

  auto ro = std::make_shared<AdminOptions>();
  auto* reload = app.add_subcommand(
      "reload", "Have the local framelinkd read its configuration again and apply it (as systemctl reload)");
  addCommon(reload, *ro);
  reload->callback([ro, &exit_code] { exit_code = runReload(*ro); });

  auto lo = std::make_shared<AdminOptions>();
  auto* links =
      app.add_subcommand("links", "Peer links of the local framelinkd: state, transport and why, RTT");
  addCommon(links, *lo);
  links->callback([lo, &exit_code] {
    auto snap = fetch(*lo, "links");
    if (!snap) {
      exit_code = 1;
      return;
    }
    if (lo->json) {
      std::printf("%s\n", linkRows(*snap).dump(2).c_str());
    } else {
      std::fputs(formatLinks(*snap).c_str(), stdout);
    }
    exit_code = 0;
  });
}

}  // namespace framelink::cli
