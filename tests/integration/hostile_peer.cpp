#include "hostile_peer.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "transport/grpc/grpc_limits.h"

namespace framelink::integ {

HostilePeer::HostilePeer(Options options) : options_(std::move(options)) {
  channel_ = grpc::CreateChannel(options_.address, grpc::InsecureChannelCredentials());
  stub_ = v1::Link::NewStub(channel_);
  session_ctx_.AddMetadata(transport::kTokenMetadataKey, options_.token);
  session_ = stub_->Session(&session_ctx_);
  v1::PeerMessage hello;
  auto* h = hello.mutable_hello();
  h->set_protocol_version(options_.protocol_version);
  h->set_daemon_id(options_.daemon_id);
  h->add_transports("grpc");
  h->set_token(options_.token);
  h->set_session_id(options_.session_id);
  h->set_instance(1);
  REQUIRE(session_->Write(hello));
  v1::PeerMessage ack;
  REQUIRE(session_->Read(&ack));
  REQUIRE(ack.has_hello_ack());
  hello_ack_ = ack.hello_ack();
  REQUIRE(hello_ack_.transport() == "grpc");

  data_ctx_.AddMetadata(transport::kTokenMetadataKey, options_.token);
  data_ = transport::openRawDataCall(channel_, &data_ctx_);
  REQUIRE(data_);
  REQUIRE(data_->Write(transport::encodeSessionId(options_.session_id)));
}

HostilePeer::~HostilePeer() {
  session_ctx_.TryCancel();
  data_ctx_.TryCancel();
  if (session_reader_.joinable()) session_reader_.join();
  if (data_reader_.joinable()) data_reader_.join();
}

bool HostilePeer::sendSession(const v1::PeerMessage& message) { return session_->Write(message); }

bool HostilePeer::sendControl(const v1::ControlBatch& record) {
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
  std::string bytes;
  transport::encodeChunkPrefix(&h, 0, true, payload.size(), &bytes);
  bytes += payload;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  grpc::WriteOptions options;
  if (more) options.set_buffer_hint();
  return data_->Write(buffer, options);
}

void HostilePeer::readSession() {
  if (!session_reader_.joinable()) session_reader_ = std::thread([this] { sessionLoop(); });
}

void HostilePeer::readData() {
  if (!data_reader_.joinable()) data_reader_ = std::thread([this] { dataLoop(); });
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

void HostilePeer::dataLoop() {
  grpc::ByteBuffer buffer;
  transport::ReceivedDataMessage m;
  v1::FrameHeader current;
  while (data_->Read(&buffer)) {
    // A malformed message from the daemon is recorded as the end of the channel.
    if (!transport::parseDataMessage(&buffer, &m).empty()) break;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!m.control.empty()) {
      v1::ControlBatch record;
      if (!record.ParseFromString(m.control)) break;
      for (const auto& message : record.messages()) inbox_.control.push_back(message);
      continue;
    }
    if (m.has_header) current = m.header;
    inbox_.payload_bytes += m.payload_bytes;
    if (m.last) {
      inbox_.frames.push_back(current);
      inbox_.frame_arrival_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
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
