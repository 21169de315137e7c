#include "daemon.h"

#include <time.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>

#include "attach_server.h"
#include "data_agent.h"
#include "metrics.h"
#include "peer_link.h"

namespace framelink {

namespace {

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
  explicit DaemonImpl(Config config) : config_(std::move(config)) {}
  ~DaemonImpl() override { stop(); }

  Status init() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    DaemonIdentity identity{static_cast<uint64_t>(::getpid()),
                            uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec)};
    agent_ = std::make_unique<DataAgent>(config_, metrics_);
    agent_->start();
    auto attach = AttachServer::create(
        config_, identity,
        [this](std::shared_ptr<ClientSession> c) { agent_->post(CmdClientAttached{std::move(c)}); },
        [this](uint64_t id) { agent_->post(CmdClientGone{id}); });
    if (!attach) return std::move(attach).error();
    attach_ = std::move(attach.value());
    auto links = PeerLinks::start(config_, *agent_, metrics_, identity.start_ns);
    if (!links) return std::move(links).error();
    links_ = std::move(links.value());
    if (!config_.metrics_listen.empty()) {
      Status s = metrics_.serve(config_.metrics_listen);
      if (!s) return s;
    }
    attach_->start();
    if (!config_.ready_file.empty()) {
      std::string content =
          "pid=" + std::to_string(::getpid()) + "\ngrpc_port=" + std::to_string(grpcPort()) +
          "\ndata_port=" + std::to_string(dataPort()) + "\nmetrics_port=" + std::to_string(metricsPort()) +
          "\nsocket=" + config_.socket_path + "\n";
      Status s = writeReadyFile(config_.ready_file, content);
      if (!s) return s;
    }
    spdlog::info("framelinkd '{}' serving: socket {}, peers on port {}, tcp data port {}{}", config_.id,
                 config_.socket_path, grpcPort(), dataPort(),
                 metricsPort() != 0 ? ", metrics on port " + std::to_string(metricsPort()) : std::string());
    return {};
  }

  uint16_t grpcPort() const noexcept override { return links_ ? links_->grpcPort() : 0; }
  uint16_t dataPort() const noexcept override { return links_ ? links_->dataPort() : 0; }
  uint16_t metricsPort() const noexcept override { return metrics_.port(); }
  const Config& config() const noexcept override { return config_; }

  void stop() override {
    if (stopped_) return;
    stopped_ = true;
    // Stop taking new clients, fail what is in flight, then end the links.
    if (attach_) attach_->stop();
    if (agent_) agent_->stop();
    if (links_) links_->stop();
    attach_.reset();  // closes the client sockets: clients see the hang-up last
    metrics_.stop();
    if (!config_.ready_file.empty()) ::unlink(config_.ready_file.c_str());
  }

 private:
  Config config_;
  Metrics metrics_;
  std::unique_ptr<DataAgent> agent_;
  std::unique_ptr<AttachServer> attach_;
  std::unique_ptr<PeerLinks> links_;
  bool stopped_ = false;
};

}  // namespace

Result<std::unique_ptr<Daemon>> Daemon::start(Config config) {
  auto daemon = std::make_unique<DaemonImpl>(std::move(config));
  Status s = daemon->init();
  if (!s) {
    daemon->stop();
    return std::move(s).error();
  }
  return std::unique_ptr<Daemon>(std::move(daemon));
}

}  // namespace framelink
