// framelinkd entry point: configuration, logging, signals, systemd readiness and watchdog.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#ifdef FRAMELINK_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "agent/agent_heartbeat.h"
#include "common/journal_sink.h"
#include "common/journal_stream.h"
#include "config/config.h"
#include "daemon.h"
#include "fd_store.h"
#include "link/grpc_engine.h"
#include "link/grpc_timers.h"

// Keep freed heap memory instead of handing it back to the kernel at once.
// gRPC allocates a receive buffer per message and frees it after; with
// glibc's defaults those pages went back to the kernel and were faulted in
// again for the next message, which cost a daemon receiving 1 MiB frames
// on `grpc` half of its CPU.  What is kept is bounded by what the daemon
// had in use at its peak.  (`framelink-bench run` runs its plain TCP and gRPC
// baselines with the same setting.)
static void keepFreedMemory() {
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

// Started by systemd with stderr connected to the journal.
static bool stderrIsJournal() {
  return framelink::isJournalStream(std::getenv("JOURNAL_STREAM"), STDERR_FILENO);
}

// A line for stderr when there is no logger (before it exists, or when it
// failed).  The journal reads a leading "<3>" as priority err, so that
// `journalctl -p err` shows why the daemon did not start.
static void printError(const std::string& what) {
  std::fprintf(stderr, "%sframelinkd: %s\n", stderrIsJournal() ? "<3>" : "", what.c_str());
}

// The journal takes every line of a service's stderr at one priority and
// stamps its own time: under systemd the daemon writes to the journal
// directly instead, each line with its level as PRIORITY, SYSLOG_IDENTIFIER
// framelinkd, no time of its own and the client, peer, stream and sequence it
// is about as FL_* fields (common/journal_sink.h).  Anywhere else (a terminal, a test, a
// container without systemd) plain lines to stderr, with time, level and id.
static std::shared_ptr<spdlog::logger> makeLogger(const framelink::Config& config) {
#ifdef FRAMELINK_HAVE_SYSTEMD
  if (stderrIsJournal()) {
    return std::make_shared<spdlog::logger>(
        "framelinkd", std::make_shared<framelink::JournalSink>("framelinkd", sd_journal_sendv));
  }
#endif
  auto logger = spdlog::stderr_color_mt("framelinkd");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [" + config.id + "] %v");
  return logger;
}

// The watchdog systemd keeps for this process (WatchdogSec=), none without
// one.  The data agent beats it at a quarter of the timeout, twice as often
// as sd_watchdog_enabled(3) asks: a beat that comes late (the agent looks at
// the time every 50 ms at most) or is lost does not get a working daemon
// killed.
static framelink::AgentHeartbeat systemdWatchdog() {
#ifdef FRAMELINK_HAVE_SYSTEMD
  uint64_t timeout_us = 0;
  if (sd_watchdog_enabled(0, &timeout_us) > 0 && timeout_us > 0) {
    return {timeout_us * 1000 / 4, [] { sd_notify(0, "WATCHDOG=1"); }};
  }
#endif
  return {};
}

// Warnings about what the configuration leaves open or unencrypted: token
// files others can read, unauthenticated or clear-text links, a CA file with
// no peer in it, transports TLS does not encrypt.
static void warnAboutSecurity(const framelink::Config& config) {
  for (const auto& exposed : framelink::exposedTokenFiles(config)) spdlog::warn("{}", exposed);
  if (config.unauthenticatedFromNetwork()) {
    spdlog::warn(
        "peers are not authenticated (no token, no TLS) and link.listen {} / data_listen {} are reachable "
        "from the network: any host that reaches them can link and push frames to local consumers "
        "(allowed by allow_unauthenticated)",
        config.listen, config.data_listen);
  }
  if (const std::string at = config.tokenInClearAt(); !at.empty()) {
    spdlog::warn(
        "the peer token crosses the network in clear ({}): TLS is off, and the token travels as it is in "
        "each link's call metadata and Hello, so whoever can capture traffic between the hosts can pass for "
        "a peer.  Turn on mutual TLS (link.tls_cert_file, tls_key_file, tls_ca_file, tls_client_auth: the "
        "packaged configuration does), or keep the links on a network only the daemons' hosts reach",
        at);
  }
  if (config.tls_no_peer_certs && ::access(config.tls_ca_file.c_str(), F_OK) != 0) {
    spdlog::warn(
        "link.tls_ca_file {} does not exist: no peer can link with this daemon, which serves local clients "
        "only.  Create it with the certificates of the peers to trust (their /etc/framelink/tls/host.crt) "
        "and restart the daemon; from then on it is read again every {} s",
        config.tls_ca_file, framelink::kTlsFilesRefreshSeconds);
  } else if (config.tls_no_peer_certs) {
    spdlog::warn(
        "link.tls_ca_file {} holds no peer certificate yet: no peer can link with this daemon, which serves "
        "local clients only.  To link with another host, append its certificate (its "
        "/etc/framelink/tls/host.crt) to {} and give it this host's certificate ({}) the same way: both "
        "daemons read the file again within {} s, no restart needed",
        config.tls_ca_file, config.tls_ca_file, config.tls_cert_file, framelink::kTlsFilesRefreshSeconds);
  }
  if (config.tlsEnabled()) {
    for (const auto& t : config.transports) {
      if (t == "tcp" || t == "rdma") {
        spdlog::warn(
            "TLS protects the gRPC link and the grpc data transport; frames sent over '{}' are "
            "authenticated but not encrypted (list only grpc in transports to encrypt them)",
            t);
      }
    }
  }
}

// Takes the signals until one stops the daemon (returned): SIGHUP reloads
// the configuration; under systemd (NOTIFY_SOCKET), every 5 s without a
// signal, `systemctl status` gets what is served now -- elsewhere it sleeps
// until a signal comes.
static int serveUntilStopped(framelink::Daemon& daemon, const sigset_t& signals) {
  std::string status = "serving";
  const bool notify = std::getenv("NOTIFY_SOCKET") != nullptr;
  for (;;) {
    const timespec every{5, 0};
    const int sig = sigtimedwait(&signals, nullptr, notify ? &every : nullptr);
    if (sig < 0) {
#ifdef FRAMELINK_HAVE_SYSTEMD
      if (std::string now = daemon.statusLine(); now != status) {
        status = std::move(now);
        sd_notify(0, ("STATUS=" + status).c_str());
      }
#endif
      continue;
    }
    if (sig != SIGHUP) return sig;
#ifdef FRAMELINK_HAVE_SYSTEMD
    sd_notify(0, "RELOADING=1\nSTATUS=reloading the configuration");
#endif
    daemon.reload();
#ifdef FRAMELINK_HAVE_SYSTEMD
    sd_notify(0, ("READY=1\nSTATUS=" + status).c_str());
#endif
  }
}

// Stops the daemon for the signal that ended serveUntilStopped: SIGUSR2
// restarts it in place; under systemd SIGTERM hands the clients to the next
// daemon; anything else stops it.  Returns the exit status.
static int stopOnSignal(framelink::Daemon& daemon, int sig, char** argv) {
  if (sig == SIGUSR2 && framelink::reexecAvailable()) {
    // A restart in place (nginx's binary upgrade): the same process runs the
    // executable again -- the new binary after an upgrade -- and takes its
    // clients over, under any supervisor or none.
    spdlog::info("signal {}: restarting in place; the clients are handed to the next image", sig);
#ifdef FRAMELINK_HAVE_SYSTEMD
    sd_notify(0, "STATUS=restarting in place: draining the frames in progress");
#endif
    daemon.stopAndHandOver(
        [argv](std::vector<framelink::NamedFd>& fds) { return framelink::reexecWithFds(fds, argv); });
    spdlog::error("restart in place failed: stopped (the clients attach again to the next daemon)");
    return 1;
  }
  spdlog::info("signal {}: shutting down", sig);
#ifdef FRAMELINK_HAVE_SYSTEMD
  sd_notify(0, "STOPPING=1\nSTATUS=stopping: draining the frames in progress");
#endif
  // Under systemd the clients wait in the file descriptor store for the next
  // daemon (systemctl restart, a package upgrade); a stop discards the store,
  // which tells them this daemon is gone.
  if (sig == SIGTERM && framelink::fdStoreAvailable()) {
    daemon.stopAndHandOver(framelink::storeFds);
  } else {
    daemon.stop();
  }
  return 0;
}

// An exception that gets here (a logger that cannot be created, out of
// memory while starting) ends the daemon with its message, not with a bare
// std::terminate.
int main(int argc, char** argv) try {
  keepFreedMemory();
  auto config = framelink::parseConfig(argc, argv);
  if (!config) {
    printError(config.error().message);
    return 2;
  }
  if (config->exit_now) {
    std::fputs(config->exit_message.c_str(), stdout);
    return 0;
  }
  spdlog::set_default_logger(makeLogger(config.value()));
  spdlog::set_level(spdlog::level::from_str(config->log_level));
  spdlog::info("starting: {}", framelink::describe(config.value()));
  warnAboutSecurity(config.value());
  for (const auto& warning : config->routeWarnings()) spdlog::warn("{}", warning);

  // Signals are taken synchronously by this thread; every other thread
  // inherits the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // gRPC's timer thread asleep until a timer is due (link/grpc_timers.h), and
  // its engine's timers on one that sleeps while none is (link/grpc_engine.h).
  if (const std::string why = framelink::installQuietGrpcTimers(); !why.empty()) {
    spdlog::info("gRPC keeps its own timer thread, which wakes every second: {}", why);
  }
  if (!framelink::installQuietEventEngine()) {
    spdlog::info(
        "GRPC_EXPERIMENTS is set: gRPC keeps its own event engine (a timer thread that wakes every second)");
  }

  framelink::AgentHeartbeat watchdog = systemdWatchdog();
  if (watchdog.enabled()) {
    spdlog::info("systemd watchdog on: the data agent reports every {} ms", watchdog.period_ns / 1'000'000);
  }
  // A hot restart: what the daemon before handed over waits in systemd's
  // file descriptor store; the store lets go of it once this daemon holds it.
  framelink::rememberExecutable();
  std::vector<framelink::NamedFd> inherited = framelink::takeStoredFds();
  std::vector<std::string> inherited_names;
  inherited_names.reserve(inherited.size());
  for (const auto& named : inherited) inherited_names.push_back(named.name);
  auto daemon =
      framelink::Daemon::start(std::move(config.value()), std::move(watchdog), std::move(inherited));
  if (!daemon) {
    spdlog::critical("cannot start: {}", daemon.error().message);
    return 1;
  }
  framelink::forgetStoredFds(inherited_names);
  // SIGHUP (systemctl reload) and `framelink reload`: the command line, and
  // the file it names, read again as at start.
  daemon.value()->setConfigSource([argc, argv] { return framelink::parseConfig(argc, argv); });
#ifdef FRAMELINK_HAVE_SYSTEMD
  sd_notify(0, "READY=1\nSTATUS=serving");
#endif
  const int sig = serveUntilStopped(*daemon.value(), signals);
  const int status = stopOnSignal(*daemon.value(), sig, argv);
  if (status == 0) spdlog::info("stopped");
  return status;
} catch (const std::exception& e) {
  printError(e.what());
  return 1;
} catch (...) {
  printError("unknown exception");
  return 1;
}
