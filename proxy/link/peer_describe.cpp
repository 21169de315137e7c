#include "link/peer_describe.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>

#include "config/config.h"
#include "framelink/shm_layout.h"
#include "framelink/v1/link.grpc.pb.h"
#include "link/peer_grpc_options.h"
#include "link/peer_identity.h"
#include "link/peer_links_impl.h"
#include "metrics/metrics.h"
#include "transport/grpc/grpc_limits.h"

namespace framelink {

namespace {

// An answer holds an id and stream names: far less than this.
constexpr int kMaxDescribeBytes = 64 * 1024;
// Calls in flight at once, at most.
constexpr size_t kDescribeWindow = 8;

// One call under way: its channel, context and answer live until it completes.
struct Asking {
  std::shared_ptr<::grpc::Channel> channel;
  ::grpc::ClientContext ctx;
  v1::DescribeReply reply;
  ::grpc::Status status;
  std::unique_ptr<::grpc::ClientAsyncResponseReader<v1::DescribeReply>> call;
};

Described fromMessage(const v1::DaemonStreams& m) {
  return Described{m.daemon_id(),
                   m.instance(),
                   {m.readers().begin(), m.readers().end()},
                   {m.producers().begin(), m.producers().end()},
                   m.as_of_ns(),
                   {m.subscribed().begin(), m.subscribed().end()},
                   {m.grouped().begin(), m.grouped().end()}};
}

void toMessage(const Described& d, v1::DaemonStreams& m) {
  m.set_daemon_id(d.id);
  m.set_instance(d.instance);
  for (const auto& r : d.readers) m.add_readers(r);
  for (const auto& p : d.producers) m.add_producers(p);
  m.set_as_of_ns(d.as_of_ns);
  for (const auto& s : d.subscribed) m.add_subscribed(s);
  for (const auto& g : d.grouped) m.add_grouped(g);
}

Result<Described> answered(const Config& config, Asking& a) {
  if (!a.status.ok()) {
    std::string why = a.status.error_message();
    int code = FL_ERR_LINK_LOST;  // not answered: down, busy, unreachable
    if (a.status.error_code() == ::grpc::StatusCode::UNAUTHENTICATED ||
        a.status.error_code() == ::grpc::StatusCode::PERMISSION_DENIED) {
      code = FL_ERR_AUTH;  // it refused this daemon's token or certificate
    } else if (a.status.error_code() == ::grpc::StatusCode::UNIMPLEMENTED) {
      why = "it does not answer Describe (a release older than this one): give it a [[peer]]";
    } else if (a.status.error_code() == ::grpc::StatusCode::DEADLINE_EXCEEDED) {
      why = "no answer in time (its daemon down, or busy)";
    }
    why.resize(std::min<size_t>(why.size(), 256));  // the answerer's words: bounded in the log
    return makeError(code, why);
  }
  Described d = fromMessage(a.reply.answerer());
  if (config.tlsEnabled()) {
    // The host name was checked in the handshake; the id it claims must be named too.
    const auto auth = a.ctx.auth_context();
    const std::vector<std::string> names = certificateNames(auth.get());
    if (std::find(names.begin(), names.end(), d.id) == names.end()) {
      return makeError(FL_ERR_AUTH, "it says it is '" + d.id.substr(0, 64) +
                                        "', but its certificate does not name it (it names " +
                                        std::to_string(names.size()) + " other names)");
    }
  }
  return d;
}

// Starts the call to `target` on `cq`, its deadline `timeout` from now.
void startAsking(const Config& config, const DescribeTarget& target, const v1::DescribeRequest& request,
                 std::chrono::milliseconds timeout, ::grpc::CompletionQueue& cq, Asking& a) {
  ::grpc::ChannelArguments args = peerChannelArguments(config);
  args.SetMaxReceiveMessageSize(kMaxDescribeBytes);
  if (config.tlsEnabled() && config.tls_server_name.empty()) args.SetSslTargetNameOverride(target.host);
  a.channel = ::grpc::CreateCustomChannel(target.address, peerChannelCredentials(config), args);
  a.ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  a.ctx.set_wait_for_ready(true);  // a connection being made is waited for, up to the deadline
  if (!config.token.empty()) a.ctx.AddMetadata(transport::kTokenMetadataKey, config.token);
  a.call = v1::Link::NewStub(a.channel)->AsyncDescribe(&a.ctx, request, &cq);
  a.call->Finish(&a.reply, &a.status, &a);
}

}  // namespace

std::vector<Result<Described>> describePeers(const Config& config, const std::vector<DescribeTarget>& targets,
                                             const Described& self, std::chrono::milliseconds timeout) {
  ::grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Asking>> asking;
  v1::DescribeRequest request;
  toMessage(self, *request.mutable_asker());
  // A window of calls in flight, the next started as one ends: a fleet that
  // starts at once asks each daemon N-1 times, and a daemon asked by all at
  // once would answer none in time.
  size_t started = 0;
  for (size_t done = 0; done < targets.size(); ++done) {
    while (started < targets.size() && started - done < kDescribeWindow) {
      asking.push_back(std::make_unique<Asking>());
      startAsking(config, targets[started], request, timeout, cq, *asking.back());
      ++started;
    }
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
  }
  std::vector<Result<Described>> out;
  out.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    if (i < asking.size()) {
      out.push_back(answered(config, *asking[i]));
    } else {
      out.emplace_back(makeError(FL_ERR_SHUTDOWN, "not asked: gRPC is shutting down"));
    }
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return out;
}

::grpc::Status PeerLinksImpl::Describe(::grpc::ServerContext* ctx, const v1::DescribeRequest* request,
                                       v1::DescribeReply* reply) {
  const std::string from = ctx->peer();
  if (!identity_.tokenAccepted(*ctx)) {
    metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    log_auth_.warn("Describe from {} refused: wrong or missing token", from);
    return {::grpc::StatusCode::UNAUTHENTICATED, "wrong or missing token"};
  }
  const v1::DaemonStreams& asker = request->asker();
  if (static_cast<size_t>(asker.readers_size()) + static_cast<size_t>(asker.producers_size()) +
          static_cast<size_t>(asker.subscribed_size()) + static_cast<size_t>(asker.grouped_size()) >
      kMaxDescribedStreams) {
    metrics_.counters.discovery_words_dropped.fetch_add(1, std::memory_order_relaxed);
    log_protocol_.warn("Describe from {}: more than {} streams (FL_ERR_PROTOCOL)", from,
                       kMaxDescribedStreams);
    return {::grpc::StatusCode::INVALID_ARGUMENT,
            "more than " + std::to_string(kMaxDescribedStreams) + " streams"};
  }
  if (!fl_stream_name_valid(asker.daemon_id().data(), asker.daemon_id().size())) {
    return {
        ::grpc::StatusCode::INVALID_ARGUMENT,
        "daemon id must be 1-" + std::to_string(FL_STREAM_NAME_LEN_MAX) + " characters of [A-Za-z0-9._-]"};
  }
  // The asker's word is heard only when its credentials prove the id it gives, as a Hello's.
  v1::Hello claim;
  claim.set_daemon_id(asker.daemon_id());
  claim.set_token(callToken(*ctx));
  if (::grpc::Status refused = identity_.prove(*ctx, claim, from); !refused.ok()) return refused;
  Heard heard;
  {
    MutexLock lock(heard_mutex_);
    heard = heard_;
  }
  if (heard) heard(fromMessage(asker));
  // Asked every dns_refresh_s by each daemon with producers: not worth a line each.
  spdlog::debug("described this daemon to '{}' at {}", asker.daemon_id(), from);
  Metrics::StreamsHere here = metrics_.streamsHere();
  toMessage(Described{config_.id, instance_, std::move(here.readers), std::move(here.producers),
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()),
                      std::move(here.subscribed), std::move(here.grouped)},
            *reply->mutable_answerer());
  return ::grpc::Status::OK;
}

void PeerLinksImpl::onDescribed(Heard heard) {
  MutexLock lock(heard_mutex_);
  heard_ = std::move(heard);
}

}  // namespace framelink
