#include "daemon.h"

#include <time.h>
#include <unistd.h>

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#ifdef FRAMELINK_HAVE_NUMA
#include <numa.h>
#endif

#include "agent/data_agent.h"
#include "attach/attach_server.h"
#include "common/thread_annotations.h"
#include "config/config_reload.h"
#include "discovery/discovery.h"
#include "framelink/framelink.h"
#include "link/peer_describe.h"
#include "link/peer_links.h"
#include "metrics/metrics.h"
#include "transport/tcp/tcp_connect.h"
#ifdef FRAMELINK_HAVE_RDMA
#include "transport/rdma/rdma_device.h"
#endif

namespace framelink {

namespace {

#ifdef FRAMELINK_HAVE_RDMA
// A consumer's slots, one registration each ([slot header, end of slot]):
// a credit's memory window is bound to its slot's registration, and some
// adapters (rxe) check a write against the range of the registration under
// the window rather than the window's own, so a registration per slot keeps
// a write inside its slot there too.  Consumers never send: no local key.
Result<SegmentRegistration> registerSlots(transport::rdma::RdmaDevice& dev, ClientSegments& segments) {
  auto regs = std::make_shared<std::vector<std::unique_ptr<transport::rdma::MemoryRegistration>>>();
  const uint64_t length = sizeof(fl_slot_header) + segments.slotSize();
  for (uint32_t i = 0; i < segments.slotCount(); ++i) {
    auto mr =
        dev.registerMemory(segments.slotHeader(i), length, transport::rdma::MemoryAccess::kCreditWindows);
    if (!mr) return std::move(mr).error();
    regs->push_back(std::move(mr).value());
  }
  const uint32_t lkey = regs->empty() ? 0 : regs->front()->lkey();
  return SegmentRegistration{std::shared_ptr<void>(std::move(regs)), lkey};
}
#endif

int numaNodeOfCpu(int cpu) {
#ifdef FRAMELINK_HAVE_NUMA
  if (numa_available() >= 0) return numa_node_of_cpu(cpu);
#endif
  (void)cpu;
  return -1;
}

uint64_t realtimeNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec);
}

Status writeReadyFile(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return makeError(FL_ERR_RESOURCES, "cannot write the ready file " + tmp);
    out << content;
    if (!out.good()) return makeError(FL_ERR_RESOURCES, "cannot write the ready file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return makeError(FL_ERR_RESOURCES, "cannot rename the ready file into " + path);
  }
  return {};
}

class DaemonImpl final : public Daemon {
 public:
  DaemonImpl(Config config, AgentHeartbeat heartbeat, std::vector<NamedFd> inherited)
      : config_(std::move(config)),
        live_(config_),
        heartbeat_(std::move(heartbeat)),
        inherited_(std::move(inherited)) {}
  ~DaemonImpl() override { stop(); }

  Status init() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    DaemonIdentity identity{static_cast<uint64_t>(::getpid()),
                            uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec)};
    agent_ = std::make_unique<DataAgent>(config_, metrics_, steadyClock(), std::move(heartbeat_));
    agent_->start();
    metrics_.setPublishRequest([agent = agent_.get()] { agent->post(CmdPublishStats{}); });
    Inherited inherited = unpackHandOver(std::move(inherited_), config_.socket_path);
    auto attach = AttachServer::create(
        config_, identity,
        [this](std::shared_ptr<ClientSession> c) { agent_->post(CmdClientAttached{std::move(c)}); },
        [this](uint64_t id) { agent_->post(CmdClientGone{id}); }, &metrics_, std::move(inherited.listener));
    if (!attach) return std::move(attach).error();
    attach_ = std::move(attach.value());
    start_ns_ = identity.start_ns;
    metrics_.setConfigInfo({configHash(config_), realtimeNs(), 0});
    attach_->setAdminSnapshot([this] { return adminSnapshot(); });
    attach_->setAdminReload([this] { return reload().json(); });
    RdmaSupport rdma = openRdma();
    takeOver(inherited);
    auto links = PeerLinks::start(config_, *agent_, metrics_, identity.start_ns, std::move(rdma));
    if (!links) return std::move(links).error();
    links_ = std::move(links.value());
    if (!config_.metrics_listen.empty()) {
      Status s = metrics_.serve(config_.metrics_listen);
      if (!s) return s;
    }
    if (config_.discoveryEnabled()) startDiscovery(identity.start_ns);
    attach_->start();
    if (!config_.ready_file.empty()) {
      std::string content =
          "pid=" + std::to_string(::getpid()) + "\ngrpc_port=" + std::to_string(grpcPort()) +
          "\ndata_port=" + std::to_string(dataPort()) + "\nrdma_port=" + std::to_string(rdmaPort()) +
          "\nmetrics_port=" + std::to_string(metricsPort()) + "\nsocket=" + config_.socket_path + "\n";
      Status s = writeReadyFile(config_.ready_file, content);
      if (!s) return s;
    }
    spdlog::info("framelinkd '{}' serving: socket {}, peers on port {}, tcp data port {}{}", config_.id,
                 config_.socket_path, grpcPort(), dataPort(),
                 metricsPort() != 0 ? ", metrics on port " + std::to_string(metricsPort()) : std::string());
    return {};
  }

  uint16_t grpcPort() const noexcept override { return links_ ? links_->grpcPort() : 0; }
  uint16_t dataPort() const noexcept override { return links_ ? links_->listenPort("tcp") : 0; }
  uint16_t rdmaPort() const noexcept { return links_ ? links_->listenPort("rdma") : 0; }
  uint16_t metricsPort() const noexcept override { return metrics_.port(); }
  std::string statusLine() const override { return metrics_.summary(); }
  const Config& config() const noexcept override { return config_; }

  void setConfigSource(std::function<Result<Config>()> source) override {
    MutexLock lock(reload_mutex_);
    source_ = std::move(source);
  }

  ReloadOutcome reload() override {
    MutexLock lock(reload_mutex_);
    ReloadOutcome out;
    const std::shared_ptr<const Config> running = live_.get();
    out.hash = configHash(*running);
    Result<Config> read = source_ ? source_()
                                  : makeError(FL_EINVAL,
                                              "this daemon was started without a configuration to "
                                              "read again");
    if (!read) {
      out.refused = true;
      out.error = read.error().message;
      spdlog::error("reload: the configuration is refused, the running one stays: {}", out.error);
      return out;
    }
    *read = withFoundPeers(std::move(read.value()), found_);  // the registry's peers stay
    out.warnings = read->routeWarnings();
    for (const auto& warning : out.warnings) spdlog::warn("reload: {}", warning);
    ReloadPlan plan = planReload(*running, read.value());
    out.applied = std::move(plan.applied);
    out.restart = std::move(plan.restart);
    if (!out.applied.empty() && !stopped_) {
      auto next = std::make_shared<const Config>(std::move(plan.next));
      spdlog::set_level(spdlog::level::from_str(next->log_level));
      live_.set(next);
      if (links_) links_->reconfigure(next);
      if (agent_) agent_->post(CmdReconfigure{next});
      out.hash = configHash(*next);
      metrics_.setConfigInfo({out.hash, realtimeNs(), metrics_.configInfo().reloads + 1});
      for (const auto& line : out.applied) spdlog::info("reload: {}", line);
    }
    if (!out.restart.empty()) {
      std::string pending;
      for (const auto& key : out.restart) pending += (pending.empty() ? "" : ", ") + key;
      spdlog::warn(
          "reload: {} changed and take effect at the next restart (systemctl restart framelinkd); until then "
          "the daemon keeps its running values",
          pending);
    }
    if (out.applied.empty() && out.restart.empty()) {
      spdlog::info("reload: nothing changed (config {})", out.hash);
    }
    return out;
  }

  size_t stopAndHandOver(const HandOverStore& store) override {
    if (stopped_.exchange(true)) return 0;
    if (discovery_) discovery_->stop(false);  // the entry lives on: the next daemon publishes it again
    if (attach_) attach_->stop(true);
    if (agent_) agent_->stopForHandOver(config_.drain_timeout_ms);
    // Handed over before the links stop (their gRPC server waits a grace for
    // its calls): the next daemon starts that much sooner, and a restart in
    // place execs here.  The agent has sent every link its Fin already.
    size_t handed = 0;
    if (attach_ && agent_) {
      const auto clients = agent_->handOverClients();
      auto packed = packHandOver(attach_->listenFd(), config_.socket_path, attach_->nextClientId(), clients);
      if (!packed) {
        spdlog::error("hot restart: nothing handed over ({}): the clients attach again to the next daemon",
                      packed.error().message);
      } else if (!store(packed.value())) {
        spdlog::error(
            "hot restart: the file descriptor store took nothing: the clients attach again to the next "
            "daemon (FileDescriptorStoreMax= in the unit?)");
      } else {
        handed = clients.size();
        spdlog::info("hot restart: the attach listener and {} client{} handed over to the next framelinkd",
                     handed, handed == 1 ? "" : "s");
      }
    }
    if (links_) links_->stop();
    attach_.reset();
    metrics_.stop();
    metrics_.setPublishRequest({});
    if (!config_.ready_file.empty()) ::unlink(config_.ready_file.c_str());
    return handed;
  }

  void stop() override {
    if (stopped_.exchange(true)) return;
    if (discovery_) discovery_->stop(true);  // the other daemons forget this one at once
    // Stop taking new clients, let what is in flight end (drain_timeout_ms at
    // most: the links still run), fail the rest, then end the links.
    if (attach_) attach_->stop();
    if (agent_) agent_->stop(config_.drain_timeout_ms);
    if (links_) links_->stop();
    attach_.reset();  // closes the client sockets: clients see the hang-up last
    metrics_.stop();
    metrics_.setPublishRequest({});
    if (!config_.ready_file.empty()) ::unlink(config_.ready_file.c_str());
  }

 private:
  // [discovery]: this daemon's entry (its address: discovery.advertise, else
  // link.listen with the port the listener took), and the others as peers.
  void startDiscovery(uint64_t instance) {
    std::string address = config_.discovery_advertise;
    if (address.empty()) {
      std::string host = config_.listen.substr(0, config_.listen.rfind(':'));
      if (host.empty() || host == "0.0.0.0" || host == "[::]") {
        char name[256] = {};
        host = ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
      }
      address = host + ":" + std::to_string(grpcPort());
    }
    discovery_ = std::make_unique<Discovery>(
        config_, RegistryEntry{config_.id, address, {}, {}, instance}, metrics_,
        [this](const std::vector<FoundDaemon>& found) { applyFound(found); },
        [this](const std::vector<SrvTarget>& targets, const Said& self) { return describe(targets, self); });
    // What a daemon that asks this one says of itself (dns_srv): as its own answer would.
    links_->onDescribed([d = discovery_.get()](const Described& asker) {
      d->heard(Said{
          RegistryEntry{
              asker.id, {}, asker.readers, asker.producers, asker.instance, asker.subscribed, asker.grouped},
          asker.as_of_ns});
    });
  }

  // dns_srv: what the daemons at `targets` say they are, saying `self`.
  std::vector<Result<Said>> describe(const std::vector<SrvTarget>& targets, const Said& self) const {
    std::vector<DescribeTarget> asked;
    asked.reserve(targets.size());
    for (const auto& t : targets) asked.push_back(DescribeTarget{t.address, t.host});
    const auto timeout = std::chrono::milliseconds(std::min<uint32_t>(config_.connect_timeout_ms, 2000));
    const Described me{self.entry.id, self.entry.instance,   self.entry.readers, self.entry.producers,
                       self.as_of_ns, self.entry.subscribed, self.entry.grouped};
    std::vector<Result<Described>> answers = describePeers(*live_.get(), asked, me, timeout);
    std::vector<Result<Said>> out;
    out.reserve(answers.size());
    for (size_t i = 0; i < answers.size(); ++i) {
      if (!answers[i]) {
        out.emplace_back(std::move(answers[i]).error());
        continue;
      }
      Described& d = answers[i].value();
      out.emplace_back(Said{
          RegistryEntry{std::move(d.id), targets[i].address, std::move(d.readers), std::move(d.producers),
                        d.instance, std::move(d.subscribed), std::move(d.grouped)},
          d.as_of_ns});
    }
    return out;
  }

  // The registry's daemons changed: they become this daemon's peers as a
  // reload's would, the written ones untouched.
  void applyFound(const std::vector<FoundDaemon>& found) {
    MutexLock lock(reload_mutex_);
    found_ = found;
    const std::shared_ptr<const Config> running = live_.get();
    auto next = std::make_shared<const Config>(withFoundPeers(*running, found_));
    const std::vector<std::string> changes = foundChanges(*running, *next);
    metrics_.counters.discovery_peers.store(
        static_cast<uint64_t>(std::count_if(next->peers.begin(), next->peers.end(),
                                            [](const PeerConfig& p) { return p.discovered; })),
        std::memory_order_relaxed);
    if (changes.empty() || stopped_) return;
    for (const auto& line : changes) spdlog::info("discovery: {}", line);
    live_.set(next);
    if (links_) links_->reconfigure(next);
    if (agent_) agent_->post(CmdReconfigure{next});
  }

  // The clients of the daemon before this one (hot restart), adopted after
  // the rdma device (if any) registers segments.
  void takeOver(Inherited& inherited) {
    if (attach_->inheritedListener()) spdlog::info("hot restart: the attach listener is the daemon before's");
    attach_->continueClientIds(inherited.next_client_id);
    size_t taken = 0;
    for (auto& client : inherited.clients) {
      const uint64_t id = client.session->id;
      const pid_t pid = client.session->pid;
      const std::string stream = client.session->stream;
      if (Status s = attach_->adopt(std::move(client.socket), std::move(client.session)); !s) {
        inherited.left.push_back("client " + std::to_string(id) + " (pid " + std::to_string(pid) +
                                 ", stream '" + stream + "'): " + s.error().message);
        continue;
      }
      ++taken;
    }
    for (const auto& why : inherited.left) {
      spdlog::warn("hot restart: not taken over, attaches again: {}", why);
    }
    if (taken != 0 || !inherited.left.empty()) {
      spdlog::info("hot restart: {} client{} taken over from the daemon before", taken,
                   taken == 1 ? "" : "s");
    }
  }

  // What `framelink stats / clients / links` get over the attach socket: who
  // this daemon is, its configured peers, and the counters and per-client /
  // per-link detail the data agent publishes (Metrics::json, as on /stats).
  std::string adminSnapshot() const {
    auto quoted = [](const std::string& s) {
      std::string out = "\"";
      for (char ch : s) {
        if (ch == '"' || ch == '\\') out += '\\';
        out += static_cast<unsigned char>(ch) < 0x20 ? ' ' : ch;
      }
      return out + '"';
    };
    std::string out =
        "{\"daemon\":{\"id\":" + quoted(config_.id) + ",\"pid\":" + std::to_string(::getpid()) +
        ",\"version\":\"" + std::to_string(FL_VERSION_MAJOR) + "." + std::to_string(FL_VERSION_MINOR) + "." +
        std::to_string(FL_VERSION_PATCH) + "\",\"start_ns\":" + std::to_string(start_ns_) +
        ",\"socket\":" + quoted(config_.socket_path) + ",\"listen\":" + quoted(config_.listen) +
        ",\"grpc_port\":" + std::to_string(grpcPort()) + ",\"data_port\":" + std::to_string(dataPort()) +
        ",\"rdma_port\":" + std::to_string(rdmaPort()) +
        ",\"metrics_port\":" + std::to_string(metricsPort()) + ",\"transports\":[";
    for (size_t i = 0; i < config_.transports.size(); ++i) {
      out += (i ? "," : "") + quoted(config_.transports[i]);
    }
    out += "]},\"peers\":[";
    const std::shared_ptr<const Config> live = live_.get();  // a reload changes the peers
    for (size_t i = 0; i < live->peers.size(); ++i) {
      out += std::string(i ? "," : "") + "{\"name\":" + quoted(live->peers[i].name) +
             ",\"address\":" + quoted(live->peers[i].address) + "}";
    }
    return out + "],\"metrics\":" + metrics_.json() + "}";
  }

  // Opens the RDMA device when rdma is among the transports, and has every
  // client segment registered with it and placed on its NUMA node.  Without
  // a usable device the daemon runs on the other transports and says why.
  RdmaSupport openRdma() {
    RdmaSupport rdma;
    if (std::find(config_.transports.begin(), config_.transports.end(), "rdma") == config_.transports.end()) {
      rdma.unavailable = "rdma is not in --transports";
      return rdma;
    }
#ifdef FRAMELINK_HAVE_RDMA
    namespace rdma_ns = transport::rdma;
    auto host_port = transport::tcp::parseHostPort(config_.listen);
    rdma_ns::RdmaDeviceOptions options{config_.rdma_device, host_port ? host_port->first : "0.0.0.0"};
    auto device = rdma_ns::RdmaDevice::open(options);
    if (!device) {
      rdma.unavailable = device.error().message;
      spdlog::warn("rdma is configured but not usable: {}; links use the next of {}", rdma.unavailable,
                   fmt::join(config_.transports, ","));
      return rdma;
    }
    rdma.device = device.value();
    int node = rdma.device->numaNode();
    spdlog::info("rdma: device {} (NUMA node {}); client segments are registered with it{}",
                 rdma.device->name(), node, node >= 0 ? " and placed on that node" : "");
    if (node >= 0 && config_.cpu >= 0 && numaNodeOfCpu(config_.cpu) != node) {
      spdlog::warn("the data agent is pinned to CPU {}, which is not on the NIC's NUMA node {}", config_.cpu,
                   node);
    }
    std::shared_ptr<rdma_ns::RdmaDevice> dev = rdma.device;
    attach_->setSegmentRegistrar(
        [dev](ClientSegments& segments, uint32_t role) -> Result<SegmentRegistration> {
          if (role == FL_ROLE_CONSUMER) return registerSlots(*dev, segments);
          auto mr = dev->registerMemory(segments.dataBase(), segments.dataSize(),
                                        rdma_ns::MemoryAccess::kLocalRead);
          if (!mr) return std::move(mr).error();
          const uint32_t lkey = mr.value()->lkey();
          return SegmentRegistration{std::shared_ptr<void>(std::move(mr.value())), lkey};
        },
        node);
#else
    rdma.unavailable = "this framelinkd was built without rdma (FRAMELINK_ENABLE_RDMA=OFF)";
    spdlog::warn("{}", rdma.unavailable);
#endif
    return rdma;
  }

  Config config_;  // as started; what a reload changes is in live_
  LiveConfig live_;
  Mutex
      reload_mutex_;  // one reload at a time (SIGHUP on the main thread, admin requests on the attach thread)
  std::function<Result<Config>()> source_ FL_GUARDED_BY(reload_mutex_);
  std::vector<FoundDaemon> found_ FL_GUARDED_BY(reload_mutex_);  // the registry's other daemons
  std::unique_ptr<Discovery> discovery_;
  AgentHeartbeat heartbeat_;
  Metrics metrics_;
  std::unique_ptr<DataAgent> agent_;
  std::unique_ptr<AttachServer> attach_;
  std::unique_ptr<PeerLinks> links_;
  std::vector<NamedFd> inherited_;  // until init() takes them
  std::atomic<bool> stopped_{false};
  uint64_t start_ns_ = 0;
};

}  // namespace

std::string Daemon::ReloadOutcome::json() const {
  nlohmann::ordered_json out;
  out["result"] = refused ? "refused" : "applied";
  if (refused) out["error"] = error;
  out["config_hash"] = hash;
  out["applied"] = applied;
  out["restart"] = restart;
  out["warnings"] = warnings;
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

Result<std::unique_ptr<Daemon>> Daemon::start(Config config, AgentHeartbeat heartbeat,
                                              std::vector<NamedFd> inherited) {
  auto daemon = std::make_unique<DaemonImpl>(std::move(config), std::move(heartbeat), std::move(inherited));
  Status s = daemon->init();
  if (!s) {
    daemon->stop();
    return std::move(s).error();
  }
  return std::unique_ptr<Daemon>(std::move(daemon));
}

}  // namespace framelink
