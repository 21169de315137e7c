// RdmaTransport's construction: create() checks the options, setUp() makes
// the verbs resources, fds and buffers in the order tearDown() undoes them.
// The data path is in rdma_transport.cpp, completions and events in
// rdma_completions.cpp.
#include "transport/rdma/rdma_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace framelink::transport::rdma {

Result<std::unique_ptr<RdmaTransport>> RdmaTransport::create(std::shared_ptr<RdmaDevice> device, CmId id,
                                                             RdmaTransportOptions options) {
  if (!device || id.id() == nullptr || id.channel() == nullptr) {
    return makeError(FL_EINVAL, "rdma transport: needs a device and an rdma_cm id with its own channel");
  }
  if (options.send_queue_depth == 0 || options.recv_queue_depth == 0 || options.signal_interval == 0 ||
      options.max_batch == 0 || options.control_send_chunks == 0) {
    return makeError(FL_EINVAL,
                     "rdma transport: queue depths, signal interval, batch and control chunks must be >= 1");
  }
  if (options.control_chunk_bytes < 64 || options.control_chunk_bytes > kMaxControlBytes) {
    return makeError(FL_EINVAL, "rdma transport: control_chunk_bytes " +
                                    std::to_string(options.control_chunk_bytes) + " is outside [64, " +
                                    std::to_string(kMaxControlBytes) + "]");
  }
  if (id.id()->verbs != device->context()) {
    const char* other = id.id()->verbs ? device->api().deviceName(id.id()->verbs) : "no device";
    return makeError(FL_ERR_TRANSPORT, std::string("rdma transport: the connection runs over ") +
                                           (other ? other : "?") + ", but this daemon uses " +
                                           device->name() +
                                           " (the route to the peer leaves through another interface)");
  }
  // A signalled WR at least every send_queue_depth WRs, or the send queue
  // could fill with WRs that never complete.
  options.signal_interval = std::min(options.signal_interval, options.send_queue_depth);
  options.max_batch = std::min(options.max_batch, options.send_queue_depth);
  std::unique_ptr<RdmaTransport> t(new RdmaTransport(std::move(device), std::move(id), options));
  Status s = t->setUp();
  if (!s) return std::move(s).error().context("rdma transport");
  return t;
}

RdmaTransport::RdmaTransport(std::shared_ptr<RdmaDevice> device, CmId id, RdmaTransportOptions options)
    : device_(std::move(device)),
      api_(device_->api()),
      options_(options),
      cm_(std::move(id)),
      windows_(api_, device_->pd()),
      source_windows_(api_, device_->pd(), IBV_ACCESS_REMOTE_READ),
      book_(0, CreditTableOptions{uint64_t{UINT32_MAX}, options.max_retracted_credits}) {}

Status RdmaTransport::setUp() {
  if (Status s = checkQueueDepths(); !s) return s;
  read_depth_ = deviceReadDepth(device_->attributes());
  if (Status s = openEventFds(); !s) return s;
  if (Status s = createCq(); !s) return s;
  if (Status s = createQp(); !s) return s;
  if (Status s = registerHeaderRing(); !s) return s;
  if (Status s = registerControlChunks(); !s) return s;
  sizeWorkRequests();
  if (Status s = watchChannels(); !s) return s;
  return startReceiving();
}

uint8_t RdmaTransport::deviceReadDepth(const ibv_device_attr& attr) noexcept {
  return static_cast<uint8_t>(std::clamp(std::min(attr.max_qp_rd_atom, attr.max_qp_init_rd_atom), 0, 16));
}

Status RdmaTransport::checkQueueDepths() const {
  const uint32_t sq = options_.send_queue_depth + options_.window_queue_depth;
  const uint32_t rq = options_.recv_queue_depth;
  const auto& attr = device_->attributes();
  if (attr.max_qp_wr > 0 &&
      (sq > static_cast<uint32_t>(attr.max_qp_wr) || rq > static_cast<uint32_t>(attr.max_qp_wr))) {
    return makeError(FL_EINVAL, "queue depth " + std::to_string(std::max(sq, rq)) +
                                    " exceeds the device's max_qp_wr " + std::to_string(attr.max_qp_wr));
  }
  return {};
}

Status RdmaTransport::openEventFds() {
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  int lfd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  int pfd = ::epoll_create1(EPOLL_CLOEXEC);
  event_fd_.reset(efd);
  link_fd_.reset(lfd);
  epoll_fd_.reset(pfd);
  if (efd < 0 || lfd < 0 || pfd < 0) {
    return makeError(FL_ERR_RESOURCES, std::string("eventfd/epoll: ") + std::strerror(errno));
  }
  return {};
}

Status RdmaTransport::createCq() {
  comp_channel_ = api_.createCompChannel(device_->context());
  if (comp_channel_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, std::string("ibv_create_comp_channel: ") + std::strerror(errno));
  }
  const auto& attr = device_->attributes();
  int cqe =
      static_cast<int>(options_.send_queue_depth + options_.window_queue_depth + options_.recv_queue_depth);
  if (attr.max_cqe > 0) cqe = std::min(cqe, attr.max_cqe);
  cq_ = api_.createCq(device_->context(), cqe, this, comp_channel_, 0);
  if (cq_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, "ibv_create_cq(" + std::to_string(cqe) + "): " + std::strerror(errno));
  }
  return {};
}

Status RdmaTransport::createQp() {
  const uint32_t sq = options_.send_queue_depth;
  const uint32_t rq = options_.recv_queue_depth;
  ibv_qp_init_attr qa{};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;  // selective signalling
  qa.cap.max_send_wr = sq + options_.window_queue_depth;
  qa.cap.max_recv_wr = rq;
  qa.cap.max_send_sge = 2;  // header + payload
  qa.cap.max_recv_sge = 1;  // receives carry no SGE; some providers want at least 1 here
  qa.cap.max_inline_data = options_.control_inline_bytes;
  int qp_rc = api_.createQp(cm_.id(), device_->pd(), &qa);
  if (qp_rc != 0 && options_.control_inline_bytes > 0) {
    // A device with less inline room than asked: control goes from the
    // registered chunks only.
    qa.cap.max_inline_data = 0;
    qp_rc = api_.createQp(cm_.id(), device_->pd(), &qa);
  }
  if (qp_rc != 0) {
    return makeError(FL_ERR_RESOURCES, "rdma_create_qp (send " + std::to_string(sq) + ", recv " +
                                           std::to_string(rq) + " WRs): " + std::strerror(errno));
  }
  qp_ = cm_.id()->qp;
  // What the device granted (it may round up), never more than asked.
  max_inline_ = std::min(qa.cap.max_inline_data, options_.control_inline_bytes);
  return {};
}

Status RdmaTransport::registerHeaderRing() {
  const uint32_t sq = options_.send_queue_depth;
  headers_.reset(new (std::nothrow) RdmaWireHeader[sq]);
  if (!headers_) return makeError(FL_ERR_RESOURCES, "out of memory for the header ring");
  std::memset(headers_.get(), 0, sizeof(RdmaWireHeader) * sq);
  // Only the adapter reads the headers (SGE 0 of sends): no access flags.
  headers_mr_ = api_.regMr(device_->pd(), headers_.get(), sizeof(RdmaWireHeader) * sq, 0);
  if (headers_mr_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, std::string("ibv_reg_mr of the header ring: ") + std::strerror(errno));
  }
  return {};
}

// Control fragments: sent from chunks only the adapter reads, received into
// chunks it writes (every receive WR carries one).
Status RdmaTransport::registerControlChunks() {
  const size_t chunk = options_.control_chunk_bytes;
  const size_t send_bytes = chunk * options_.control_send_chunks;
  const size_t recv_bytes = chunk * options_.recv_queue_depth;
  ctl_send_buf_.reset(new (std::nothrow) uint8_t[send_bytes]);
  recv_buf_.reset(new (std::nothrow) uint8_t[recv_bytes]);
  if (!ctl_send_buf_ || !recv_buf_) {
    return makeError(FL_ERR_RESOURCES, "out of memory for the control chunks");
  }
  ctl_send_mr_ = api_.regMr(device_->pd(), ctl_send_buf_.get(), send_bytes, 0);
  if (ctl_send_mr_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, "ibv_reg_mr of the control send chunks (" +
                                           std::to_string(send_bytes) + " bytes): " + std::strerror(errno));
  }
  recv_mr_ = api_.regMr(device_->pd(), recv_buf_.get(), recv_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (recv_mr_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, "ibv_reg_mr of the receive chunks (" + std::to_string(recv_bytes) +
                                           " bytes): " + std::strerror(errno));
  }
  return {};
}

void RdmaTransport::sizeWorkRequests() {
  const uint32_t sq = options_.send_queue_depth;
  const uint32_t rq = options_.recv_queue_depth;
  sends_.resize(sq);
  send_wrs_.resize(sq);
  send_sges_.resize(size_t{2} * sq);
  ctl_wrs_.resize(options_.control_send_chunks);
  ctl_sges_.resize(options_.control_send_chunks);
  ctl_frames_before_.resize(options_.control_send_chunks);
  recv_wrs_.resize(rq);
  recv_sges_.resize(rq);
  window_ring_.resize(options_.window_queue_depth);
}

Status RdmaTransport::watchChannels() {
  if (!setNonBlocking(comp_channel_->fd) || !setNonBlocking(cm_.channel()->fd)) {
    return makeError(FL_ERR_RESOURCES,
                     std::string("O_NONBLOCK on the event channels: ") + std::strerror(errno));
  }
  for (int fd : {comp_channel_->fd, cm_.channel()->fd, event_fd_.get(), link_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return makeError(FL_ERR_RESOURCES, std::string("epoll_ctl: ") + std::strerror(errno));
    }
  }
  return {};
}

// Receives before the connection is accepted: the peer may write at once.
Status RdmaTransport::startReceiving() {
  replenishRecvs();
  if (recvs_posted_ != options_.recv_queue_depth) {
    return makeError(FL_ERR_RESOURCES, "ibv_post_recv failed while setting up");
  }
  if (api_.reqNotifyCq(cq_, 0) != 0) {
    return makeError(FL_ERR_RESOURCES, std::string("ibv_req_notify_cq: ") + std::strerror(errno));
  }
  cq_armed_ = true;
  watch_id_ = device_->watch(qp_, cq_, [this](int status, const std::string& message) {
    {
      MutexLock l(async_mu_);
      if (!async_error_) async_error_.emplace(status, message);
    }
    signalEventFd(link_fd_.get());
  });
  return {};
}

}  // namespace framelink::transport::rdma
