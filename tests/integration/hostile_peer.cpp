#include "hostile_peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "framelink/framelink.h"
#include "transport/grpc/grpc_limits.h"
#include "transport/tcp/tcp_wire.h"

namespace framelink::integ {

namespace tcp = transport::tcp;

namespace {

bool sendAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool recvAll(int fd, void* data, size_t n) {
  return n == 0 || ::recv(fd, data, n, MSG_WAITALL) == static_cast<ssize_t>(n);
}

}  // namespace

HostilePeer::HostilePeer(Options options) : options_(std::move(options)) {
  // A chunk of a frame or a read's answer is up to grpc_chunk_bytes, as a peer daemon takes it.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(
      static_cast<int>(transport::kMaxGrpcChunkBytes + transport::kGrpcMessageSlack));
  channel_ = grpc::CreateCustomChannel(options_.address, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::Link::NewStub(channel_);
  session_ctx_.AddMetadata(transport::kTokenMetadataKey, options_.token);
  session_ = stub_->Session(&session_ctx_);
  v1::PeerMessage hello;
  auto* h = hello.mutable_hello();
  h->set_protocol_version(options_.protocol_version);
  h->set_daemon_id(options_.daemon_id);
  h->add_transports(options_.transport);
  h->set_token(options_.token);
  h->set_session_id(options_.session_id);
  h->set_instance(options_.instance);
  REQUIRE(session_->Write(hello));
  v1::PeerMessage ack;
  const bool answered = session_->Read(&ack);
  if (!answered && options_.may_be_refused) {
    refusal_ = session_->Finish();
    REQUIRE_FALSE(refusal_.ok());
    return;
  }
  REQUIRE(answered);
  REQUIRE(ack.has_hello_ack());
  hello_ack_ = ack.hello_ack();
  REQUIRE(hello_ack_.transport() == options_.transport);
  if (options_.transport == "tcp") {
    openTcp();
    return;
  }
  data_ctx_.AddMetadata(transport::kTokenMetadataKey, options_.token);
  data_ = transport::openRawDataCall(channel_, &data_ctx_);
  REQUIRE(data_);
  REQUIRE(data_->Write(transport::encodeSessionId(options_.session_id)));
}

// The tcp handshake as a dialing daemon makes it (tcp_wire.h, 1.).
void HostilePeer::openTcp() {
  tcp_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(tcp_fd_ >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(hello_ack_.tcp_data_port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(tcp_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  // A daemon that stops reading makes a send fail after this, not hang the test.
  timeval timeout{10, 0};
  REQUIRE(::setsockopt(tcp_fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout) == 0);
  tcp::TcpHello hello{};
  std::memcpy(hello.magic, tcp::kTcpHelloMagic, sizeof hello.magic);
  hello.version = tcp::kTcpWireVersion;
  hello.session_id = options_.session_id;
  transport::tokenDigest(options_.token, options_.session_id, hello.token);
  REQUIRE(sendAll(tcp_fd_, &hello, sizeof hello));
  tcp::TcpHelloReply reply{};
  REQUIRE(recvAll(tcp_fd_, &reply, sizeof reply));
  REQUIRE(reply.status == FL_OK);
}

bool HostilePeer::sendTcp(uint32_t magic, const transport::FrameHeader* header, const std::string& bytes) {
  tcp::TcpFrameHeader w{};
  if (header != nullptr) w = tcp::toWire(*header);
  w.magic = magic;
  w.length = bytes.size();
  return sendAll(tcp_fd_, &w, sizeof w) && sendAll(tcp_fd_, bytes.data(), bytes.size());
}

HostilePeer::~HostilePeer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  resumed_.notify_all();
  session_ctx_.TryCancel();
  data_ctx_.TryCancel();
  if (tcp_fd_ >= 0) ::shutdown(tcp_fd_, SHUT_RDWR);
  if (session_reader_.joinable()) session_reader_.join();
  if (data_reader_.joinable()) data_reader_.join();
  if (tcp_fd_ >= 0) ::close(tcp_fd_);
}

bool HostilePeer::sendSession(const v1::PeerMessage& message) { return session_->Write(message); }

bool HostilePeer::sendControl(const v1::ControlBatch& record) {
  if (tcp_fd_ >= 0) return sendTcp(tcp::kTcpControlMagic, nullptr, record.SerializeAsString());
  return data_->Write(transport::encodeControl(record.SerializeAsString()));
}

bool HostilePeer::sendControl(const v1::PeerMessage& message) {
  v1::ControlBatch record;
  *record.add_messages() = message;
  return sendControl(record);
}

bool HostilePeer::sendFrame(const v1::FrameHeader& header, const std::string& payload, bool more) {
  transport::FrameHeader h;
  // Not a REQUIRE: a flood sends hundreds of thousands.
  if (!transport::fromProto(header, &h)) FAIL("the test built a header with too many attribute bytes");
  if (tcp_fd_ >= 0) return sendTcp(tcp::kTcpFrameMagic, &h, payload);
  std::string bytes;
  transport::encodeChunkPrefix(&h, 0, true, payload.size(), &bytes);
  bytes += payload;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  grpc::WriteOptions options;
  if (more) options.set_buffer_hint();
  return data_->Write(buffer, options);
}

bool HostilePeer::answerRead(uint64_t read_id, uint64_t source_id, const std::string& bytes) {
  if (tcp_fd_ >= 0) {
    transport::FrameHeader h;
    h.credit_id = source_id;
    h.frame_id = read_id;
    return sendTcp(tcp::kTcpReadResponseMagic, &h, bytes);
  }
  v1::ReadResponse response;
  response.set_source_id(source_id);
  response.set_read_id(read_id);
  response.set_length(bytes.size());
  std::string message;
  transport::encodeReadResponsePrefix(&response, 0, true, bytes.size(), &message);
  message += bytes;
  grpc::Slice slice(message);
  return data_->Write(grpc::ByteBuffer(&slice, 1));
}

bool HostilePeer::askRead(uint64_t source_id, uint64_t read_id, uint64_t length) {
  if (tcp_fd_ >= 0) {
    transport::FrameHeader h;
    h.credit_id = source_id;
    h.frame_id = read_id;
    tcp::TcpFrameHeader w = tcp::toWire(h);
    w.magic = tcp::kTcpReadRequestMagic;
    w.length = length;  // what is asked for: a request has no body
    return sendAll(tcp_fd_, &w, sizeof w);
  }
  v1::ReadRequest request;
  request.set_source_id(source_id);
  request.set_read_id(read_id);
  request.set_length(length);
  return data_->Write(transport::encodeReadRequest(request));
}

void HostilePeer::readSession() {
  if (!session_reader_.joinable()) session_reader_ = std::thread([this] { sessionLoop(); });
}

void HostilePeer::readData() {
  if (data_reader_.joinable()) return;
  data_reader_ = std::thread([this] { tcp_fd_ >= 0 ? tcpLoop() : dataLoop(); });
}

void HostilePeer::readDataUntil(std::function<bool(const PeerInbox&)> pause) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pause_when_ = std::move(pause);
  }
  readData();
}

void HostilePeer::resumeData() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = false;
  }
  resumed_.notify_all();
}

void HostilePeer::holdIfPaused() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (pause_when_ && pause_when_(inbox_)) {
    pause_when_ = nullptr;
    paused_ = true;
  }
  resumed_.wait(lock, [this] { return !paused_ || stopping_; });
}

void HostilePeer::sessionLoop() {
  v1::PeerMessage m;
  while (session_->Read(&m)) {
    std::lock_guard<std::mutex> lock(mutex_);
    inbox_.session.push_back(m);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  inbox_.session_ended = true;
}

void HostilePeer::frameArrived(const v1::FrameHeader& header, uint64_t payload_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  inbox_.frames.push_back(header);
  inbox_.payload_bytes += payload_bytes;
  inbox_.frame_arrival_ns.push_back(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

void HostilePeer::controlArrived(const std::string& bytes) {
  v1::ControlBatch record;
  // A record that does not parse is kept as an empty message: a test sees it.
  if (!record.ParseFromString(bytes)) record.add_messages();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& message : record.messages()) inbox_.control.push_back(message);
}

void HostilePeer::readAsked(const ReadAsked& read) {
  std::lock_guard<std::mutex> lock(mutex_);
  inbox_.reads.push_back(read);
}

void HostilePeer::readAnswered(ReadAnswered answer) {
  std::lock_guard<std::mutex> lock(mutex_);
  inbox_.answers.push_back(std::move(answer));
}

void HostilePeer::dataLoop() {
  grpc::ByteBuffer buffer;
  transport::ReceivedDataMessage m;
  v1::FrameHeader current;
  uint64_t bytes = 0;
  // The answer whose chunks arrive (a read response's first chunk says so).
  std::optional<ReadAnswered> answer;
  std::string answer_bytes;
  while ((holdIfPaused(), data_->Read(&buffer))) {
    // A malformed message from the daemon is recorded as the end of the channel.
    if (!transport::parseDataMessage(&buffer, &m).empty()) break;
    if (!m.control.empty()) {
      controlArrived(m.control);
      continue;
    }
    if (m.has_read_request) {
      readAsked(ReadAsked{m.read_request.source_id(), m.read_request.read_id(), m.read_request.length()});
      continue;
    }
    if (m.has_read_response) {
      answer = ReadAnswered{m.read_response.read_id(), !m.read_response.no_source(), nullptr};
      answer_bytes.clear();
    } else if (m.has_header) {
      answer.reset();
      current = m.header;
      bytes = 0;
    }
    if (answer) {
      const size_t at = answer_bytes.size();
      answer_bytes.resize(at + m.payload_bytes);
      m.copyPayload(reinterpret_cast<uint8_t*>(answer_bytes.data() + at));
      if (!m.last) continue;
      answer->bytes = std::make_shared<const std::string>(std::move(answer_bytes));
      readAnswered(std::move(*answer));
      answer.reset();
      answer_bytes = std::string();
      continue;
    }
    bytes += m.payload_bytes;
    if (m.last) frameArrived(current, bytes);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  inbox_.data_ended = true;
}

void HostilePeer::tcpLoop() {
  tcp::TcpFrameHeader w{};
  std::string bytes;
  while ((holdIfPaused(), recvAll(tcp_fd_, &w, sizeof w))) {
    if (w.magic == tcp::kTcpReadRequestMagic) {  // no body: `length` is what is asked for
      readAsked(ReadAsked{w.credit_id, w.frame_id, w.length});
      continue;
    }
    if (w.length > (uint64_t{1} << 30)) break;
    bytes.resize(w.length);
    if (!recvAll(tcp_fd_, bytes.data(), bytes.size())) break;
    if (w.magic == tcp::kTcpReadResponseMagic) {
      const bool known = (w.flags & tcp::kTcpReadNoSource) == 0;
      readAnswered(ReadAnswered{w.frame_id, known, std::make_shared<const std::string>(bytes)});
    } else if (w.magic == tcp::kTcpControlMagic) {
      controlArrived(bytes);
    } else {
      v1::FrameHeader header;
      transport::toProto(tcp::fromWire(w), &header);
      frameArrived(header, w.length);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  inbox_.data_ended = true;
}

PeerInbox HostilePeer::inbox() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inbox_;
}

bool HostilePeer::waitFor(const std::function<bool(const PeerInbox&)>& done, Millis timeout) const {
  return waitUntil([&] { return done(inbox()); }, timeout, Millis(5));
}

bool HostilePeer::finReceived(v1::Fin* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& m : inbox_.session) {
    if (m.has_fin()) {
      *out = m.fin();
      return true;
    }
  }
  return false;
}

size_t countMessages(const PeerInbox& inbox, const std::function<bool(const v1::PeerMessage&)>& pred) {
  size_t n = 0;
  for (const auto& m : inbox.session) n += pred(m) ? 1 : 0;
  for (const auto& m : inbox.control) n += pred(m) ? 1 : 0;
  return n;
}

int64_t residentKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kib = -1;
      fields >> kib;
      return kib;
    }
  }
  return -1;
}

}  // namespace framelink::integ
