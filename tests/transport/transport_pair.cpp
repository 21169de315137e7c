#include "transport_pair.h"

#include <chrono>
#include <future>
#include <mutex>

#include <grpcpp/grpcpp.h>

#include "framelink/v1/link.grpc.pb.h"
#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_transport.h"

namespace framelink::transport::testing {

namespace {

constexpr auto kSetupTimeout = std::chrono::seconds(10);
constexpr uint64_t kSessionId = GrpcTestServer::kSessionId;

// ---------------------------------------------------------------- tcp

class TcpPair final : public TransportPair {
 public:
  ~TcpPair() override {
    if (a) a->shutdown();
    if (b) b->shutdown();
  }
};

Result<std::unique_ptr<TransportPair>> makeTcp(const TransportPairOptions& options) {
  std::promise<UniqueFd> accepted;
  auto accepted_future = accepted.get_future();
  std::once_flag once;
  auto listener =
      tcp::TcpDataListener::listen("127.0.0.1:0", options.token, [&](uint64_t session_id, UniqueFd fd) {
        if (session_id != kSessionId) return;
        std::call_once(once, [&] { accepted.set_value(std::move(fd)); });
      });
  if (!listener) return std::move(listener).error();
  auto dialed = tcp::dialData("127.0.0.1", (*listener)->port(), kSessionId, options.token,
                              std::chrono::duration_cast<std::chrono::milliseconds>(kSetupTimeout));
  if (!dialed) return std::move(dialed).error();
  if (accepted_future.wait_for(kSetupTimeout) != std::future_status::ready) {
    return makeError(FL_ERR_TIMEOUT, "tcp pair: listener never handed over the connection");
  }
  (*listener)->stop();
  auto pair = std::make_unique<TcpPair>();
  auto a = tcp::TcpTransport::create(std::move(dialed).value(), "listener");
  if (!a) return std::move(a).error();
  auto b = tcp::TcpTransport::create(accepted_future.get(), "dialer");
  if (!b) return std::move(b).error();
  pair->a = std::move(a).value();
  pair->b = std::move(b).value();
  return std::unique_ptr<TransportPair>(std::move(pair));
}

// ---------------------------------------------------------------- grpc

class GrpcPair final : public TransportPair {
 public:
  ~GrpcPair() override {
    if (a) a->shutdown();
    if (b) b->shutdown();
    a.reset();
    b.reset();
    server.reset();
  }
  std::unique_ptr<GrpcTestServer> server;
};

Result<std::unique_ptr<TransportPair>> makeGrpc(const TransportPairOptions& options) {
  const size_t chunk = options.grpc_chunk_bytes ? options.grpc_chunk_bytes : kDefaultGrpcChunkBytes;
  auto pair = std::make_unique<GrpcPair>();
  auto server = GrpcTestServer::start(options.token, chunk);
  if (!server) return std::move(server).error();
  pair->server = std::move(server).value();
  auto& adopted = pair->server->adopted();
  auto channel = grpc::CreateCustomChannel(pair->server->address(), grpc::InsecureChannelCredentials(),
                                           channelArguments(chunk));
  auto a = GrpcTransport::connect(channel, kSessionId, options.token, chunk);
  if (!a) return std::move(a).error();
  pair->a = std::move(a).value();
  if (adopted.wait_for(kSetupTimeout) != std::future_status::ready) {
    return makeError(FL_ERR_TIMEOUT, "grpc pair: the server never adopted the Data stream");
  }
  pair->b = adopted.get();
  return std::unique_ptr<TransportPair>(std::move(pair));
}

}  // namespace

// ---------------------------------------------------------------- grpc test server

namespace {

class DataOnlyService final : public framelink::v1::Link::Service {
 public:
  DataOnlyService(std::string token, size_t chunk_bytes)
      : token_(std::move(token)), chunk_bytes_(chunk_bytes) {}

  grpc::Status Data(grpc::ServerContext* context, DataStream* stream) override {
    auto md = context->client_metadata().find(kTokenMetadataKey);
    if (md == context->client_metadata().end() ||
        std::string(md->second.data(), md->second.size()) != token_) {
      return {grpc::StatusCode::UNAUTHENTICATED, "bad token"};
    }
    framelink::v1::DataMessage first;
    if (!stream->Read(&first)) return {grpc::StatusCode::CANCELLED, "no first message"};
    if (first.session_id() != GrpcTestServer::kSessionId) {
      return {grpc::StatusCode::FAILED_PRECONDITION, "unknown session"};
    }
    auto t = GrpcTransport::adoptServerStream(context, stream, chunk_bytes_);
    if (!t) return {grpc::StatusCode::RESOURCE_EXHAUSTED, t.error().message};
    {
      std::lock_guard lock(mu_);
      if (handed_over_) return {grpc::StatusCode::ALREADY_EXISTS, "one data stream per test server"};
      handed_over_ = true;
      adopted_.set_value(*t);
    }
    return (*t)->runUntilClosed();
  }

  std::promise<std::shared_ptr<GrpcServerTransport>>& promise() { return adopted_; }

 private:
  const std::string token_;
  const size_t chunk_bytes_;
  std::mutex mu_;
  bool handed_over_ = false;
  std::promise<std::shared_ptr<GrpcServerTransport>> adopted_;
};

}  // namespace

struct GrpcTestServer::Impl {
  std::unique_ptr<DataOnlyService> service;
  std::unique_ptr<grpc::Server> server;
  std::future<std::shared_ptr<GrpcServerTransport>> adopted;
};

Result<std::unique_ptr<GrpcTestServer>> GrpcTestServer::start(const std::string& token, size_t chunk_bytes) {
  std::unique_ptr<GrpcTestServer> s(new GrpcTestServer());
  s->impl_ = std::make_unique<Impl>();
  s->impl_->service = std::make_unique<DataOnlyService>(token, chunk_bytes);
  s->impl_->adopted = s->impl_->service->promise().get_future();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->impl_->service.get());
  configureServerBuilder(builder, chunk_bytes);
  s->impl_->server = builder.BuildAndStart();
  if (!s->impl_->server || s->port_ == 0)
    return makeError(FL_ERR_RESOURCES, "grpc test server: cannot start");
  return s;
}

GrpcTestServer::~GrpcTestServer() {
  if (impl_ && impl_->server)
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

std::future<std::shared_ptr<GrpcServerTransport>>& GrpcTestServer::adopted() noexcept {
  return impl_->adopted;
}

Result<std::unique_ptr<TransportPair>> TransportPair::make(TransportKind kind,
                                                           const TransportPairOptions& options) {
  switch (kind) {
    case TransportKind::kTcp:
      return makeTcp(options);
    case TransportKind::kGrpc:
      return makeGrpc(options);
  }
  return makeError(FL_EINVAL, "unknown transport kind");
}

const char* kindName(TransportKind kind) noexcept { return kind == TransportKind::kTcp ? "tcp" : "grpc"; }

}  // namespace framelink::transport::testing
