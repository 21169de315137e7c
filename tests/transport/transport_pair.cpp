#include "transport_pair.h"

#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "framelink/v1/link.grpc.pb.h"
#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/loopback/loopback_transport.h"
#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_transport.h"

#ifdef FRAMELINK_HAVE_RDMA
#include <cstdlib>

#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#endif

namespace framelink::transport::testing {

namespace {

constexpr auto kSetupTimeout = std::chrono::seconds(10);
constexpr uint64_t kSessionId = GrpcTestServer::kSessionId;

// ---------------------------------------------------------------- loopback

class LoopbackPair final : public TransportPair {
 public:
  ~LoopbackPair() override {
    if (a) a->shutdown();
    if (b) b->shutdown();
  }
};

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
  tcp::TcpTransportOptions tcp_options;
  if (options.tcp_read_budget_bytes > 0) tcp_options.read_budget_bytes = options.tcp_read_budget_bytes;
  auto a = tcp::TcpTransport::create(std::move(dialed).value(), "listener", tcp_options);
  if (!a) return std::move(a).error();
  auto b = tcp::TcpTransport::create(accepted_future.get(), "dialer", tcp_options);
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
  GrpcTransportOptions grpc_options;
  grpc_options.chunk_bytes = chunk;
  auto a = GrpcTransport::connect(channel, pair->server->queue(), kSessionId, options.token, grpc_options);
  if (!a) return std::move(a).error();
  pair->a = std::move(a).value();
  if (adopted.wait_for(kSetupTimeout) != std::future_status::ready) {
    return makeError(FL_ERR_TIMEOUT, "grpc pair: the server never adopted the Data stream");
  }
  pair->b = adopted.get();
  if (options.grpc_frame_batches) {
    pair->a->enableFrameBatches();
    pair->b->enableFrameBatches();
  }
  return std::unique_ptr<TransportPair>(std::move(pair));
}

// ---------------------------------------------------------------- rdma

#ifdef FRAMELINK_HAVE_RDMA
class RdmaPair final : public TransportPair {
 public:
  ~RdmaPair() override {
    if (a) a->shutdown();
    if (b) b->shutdown();
    a.reset();
    b.reset();
    listener.reset();
  }
  Result<std::shared_ptr<void>> registerMemory(void* addr, size_t length, bool receive) override {
    const auto access = receive ? rdma::MemoryAccess::kCreditWindows : rdma::MemoryAccess::kLocalRead;
    auto both = std::make_shared<std::vector<std::unique_ptr<rdma::MemoryRegistration>>>();
    for (auto& device : {device_a, device_b}) {
      auto r = device->registerMemory(addr, length, access);
      if (!r) return std::move(r).error();
      both->push_back(std::move(r).value());
    }
    return std::shared_ptr<void>(both);
  }
  std::optional<uint32_t> localKey(const Transport& sender, const void* addr, size_t length) const override {
    const auto& device = &sender == a.get() ? device_a : device_b;
    uint32_t lkey = 0;
    if (!device->lookupLocal(addr, length, &lkey)) return std::nullopt;
    return lkey;
  }
  std::shared_ptr<rdma::RdmaDevice> device_a, device_b;
  std::unique_ptr<rdma::RdmaListener> listener;
};

Result<std::unique_ptr<TransportPair>> makeRdma() {
  const char* a_ip = std::getenv("FRAMELINK_RDMA_A_IP");
  const char* b_ip = std::getenv("FRAMELINK_RDMA_B_IP");
  if (a_ip == nullptr || b_ip == nullptr || *a_ip == '\0' || *b_ip == '\0') {
    return makeError(
        FL_ERR_TRANSPORT,
        "the rdma conformance suite needs two RDMA devices: set FRAMELINK_RDMA_A_IP and "
        "FRAMELINK_RDMA_B_IP to their IPs (the Soft-RoCE lane does: /work/shared/softroce/"
        "softroce-vm.sh --pair -e FRAMELINK_RDMA_A_IP=10.77.1.1 -e FRAMELINK_RDMA_B_IP=10.77.1.2)");
  }
  auto pair = std::make_unique<RdmaPair>();
  auto da = rdma::RdmaDevice::open({"", a_ip});
  if (!da) return std::move(da).error().context("rdma pair, device A");
  auto db = rdma::RdmaDevice::open({"", b_ip});
  if (!db) return std::move(db).error().context("rdma pair, device B");
  pair->device_a = da.value();
  pair->device_b = db.value();
  // The listener outlives this function: its callback holds what it uses.
  auto accepted = std::make_shared<std::promise<std::unique_ptr<Transport>>>();
  auto accepted_future = accepted->get_future();
  auto once = std::make_shared<std::once_flag>();
  auto listener = rdma::RdmaListener::listen(
      pair->device_b, b_ip, 0, [](uint64_t session_id) { return session_id == kSessionId; },
      [accepted, once](uint64_t, std::unique_ptr<Transport> t) {
        std::call_once(*once, [&] { accepted->set_value(std::move(t)); });
      });
  if (!listener) return std::move(listener).error().context("rdma pair");
  pair->listener = std::move(listener).value();
  // From A to B's IP, never to A's own (see the Soft-RoCE notes, pitfall 6).
  auto dialed = rdma::dialRdma(pair->device_a, b_ip, pair->listener->port(), kSessionId,
                               std::chrono::duration_cast<std::chrono::milliseconds>(kSetupTimeout));
  if (!dialed) return std::move(dialed).error().context("rdma pair");
  if (accepted_future.wait_for(kSetupTimeout) != std::future_status::ready) {
    return makeError(FL_ERR_TIMEOUT, "rdma pair: the listener never handed over the connection");
  }
  pair->a = std::move(dialed).value();
  pair->b = accepted_future.get();
  return std::unique_ptr<TransportPair>(std::move(pair));
}
#endif

}  // namespace

// ---------------------------------------------------------------- grpc test server

struct GrpcTestServer::Impl {
  std::string token;
  std::mutex mu;
  bool handed_over = false;
  std::promise<std::shared_ptr<GrpcTransport>> promise;
  std::future<std::shared_ptr<GrpcTransport>> adopted = promise.get_future();
  RawDataService service;
  DataCalls calls;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::unique_ptr<grpc::Server> server;
  std::thread thread;

  std::shared_ptr<const DataCallHooks> hooks(size_t chunk_bytes, std::chrono::milliseconds first_timeout) {
    auto h = std::make_shared<DataCallHooks>();
    h->first = [this](grpc::ServerContext& ctx) -> grpc::Status {
      auto md = ctx.client_metadata().find(kTokenMetadataKey);
      if (md == ctx.client_metadata().end() || std::string(md->second.data(), md->second.size()) != token) {
        return {grpc::StatusCode::UNAUTHENTICATED, "bad token"};
      }
      return grpc::Status::OK;
    };
    h->admit = [this](grpc::ServerContext&, uint64_t session_id) -> grpc::Status {
      if (session_id != GrpcTestServer::kSessionId)
        return {grpc::StatusCode::FAILED_PRECONDITION, "unknown session"};
      std::lock_guard lock(mu);
      if (handed_over) return {grpc::StatusCode::ALREADY_EXISTS, "one data stream per test server"};
      return grpc::Status::OK;
    };
    h->accepted = [this](uint64_t, std::shared_ptr<GrpcTransport> t) {
      std::lock_guard lock(mu);
      if (handed_over) return t->shutdown();
      handed_over = true;
      promise.set_value(std::move(t));
    };
    h->options.chunk_bytes = chunk_bytes;
    h->first_message_timeout = first_timeout;
    return h;
  }
};

Result<std::unique_ptr<GrpcTestServer>> GrpcTestServer::start(
    const std::string& token, size_t chunk_bytes, std::chrono::milliseconds first_message_timeout) {
  std::unique_ptr<GrpcTestServer> s(new GrpcTestServer());
  s->impl_ = std::make_unique<Impl>();
  Impl& impl = *s->impl_;
  impl.token = token;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(&impl.service);
  configureServerBuilder(builder, chunk_bytes);
  impl.cq = builder.AddCompletionQueue();
  impl.server = builder.BuildAndStart();
  if (!impl.server || s->port_ == 0) return makeError(FL_ERR_RESOURCES, "grpc test server: cannot start");
  impl.thread = std::thread([&impl] {
    ::pthread_setname_np(::pthread_self(), kQueueThreadName);
    const QueueThreadScope queue_thread;
    void* tag = nullptr;
    bool ok = false;
    while (impl.cq->Next(&tag, &ok)) static_cast<QueueTag*>(tag)->complete(ok);
  });
  if (Status st = GrpcTransport::awaitDataCall(impl.service, impl.cq.get(), &impl.calls,
                                               impl.hooks(chunk_bytes, first_message_timeout));
      !st) {
    return std::move(st).error();
  }
  return s;
}

GrpcTestServer::~GrpcTestServer() {
  if (!impl_) return;
  if (impl_->server) impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  impl_->calls.endAll();
  if (impl_->cq) impl_->cq->Shutdown();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::future<std::shared_ptr<GrpcTransport>>& GrpcTestServer::adopted() noexcept { return impl_->adopted; }

GrpcCallQueue GrpcTestServer::queue() const noexcept { return {impl_->cq.get(), &impl_->calls}; }

Result<std::unique_ptr<TransportPair>> TransportPair::make(TransportKind kind,
                                                           const TransportPairOptions& options) {
  switch (kind) {
    case TransportKind::kTcp:
      return makeTcp(options);
    case TransportKind::kGrpc:
      return makeGrpc(options);
    case TransportKind::kRdma:
#ifdef FRAMELINK_HAVE_RDMA
      return makeRdma();
#else
      return makeError(FL_ERR_TRANSPORT, "this build has no rdma transport (FRAMELINK_ENABLE_RDMA=OFF)");
#endif
    case TransportKind::kLoopback: {
      auto made = loopback::makePair();
      if (!made) return std::move(made).error();
      auto pair = std::make_unique<LoopbackPair>();
      pair->a = std::move(made->a);
      pair->b = std::move(made->b);
      return std::unique_ptr<TransportPair>(std::move(pair));
    }
  }
  return makeError(FL_EINVAL, "unknown transport kind");
}

const char* kindName(TransportKind kind) noexcept {
  switch (kind) {
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kGrpc:
      return "grpc";
    case TransportKind::kRdma:
      return "rdma";
    case TransportKind::kLoopback:
      return "loopback";
  }
  return "?";
}

}  // namespace framelink::transport::testing
