// A peer daemon a test scripts: it dials a real framelinkd's Link service
// with a token and a claimed daemon id, says Hello (protocol 3), opens the
// data channel (`grpc`: Link.Data; `tcp`: the daemon's tcp data port), and
// from then on sends only what the test tells it to -- Session messages,
// in-band control records, frames into any credit, answers to the daemon's
// reads of its offers, whenever the test likes -- and reads nothing until
// the test asks it to.  Frames and control records are encoded by the
// daemon's own wire helpers (grpc_wire.h, tcp_wire.h), so what the daemon
// sees is byte for byte what a peer daemon could send.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "framelink/v1/link.grpc.pb.h"
#include "harness.h"
#include "transport/grpc/grpc_wire.h"

namespace framelink::integ {

// A read of an offer the daemon asked the peer for (pull).
struct ReadAsked {
  uint64_t source_id = 0;  // the offer's
  uint64_t read_id = 0;    // the daemon's, for the answer to echo
  uint64_t length = 0;
};

// The daemon's answer to a read the peer asked for (askRead).
struct ReadAnswered {
  uint64_t read_id = 0;
  bool known = false;  // false: the daemon exposes no such source
  std::shared_ptr<const std::string> bytes;
};

// What the peer received, in order of arrival per channel.
struct PeerInbox {
  std::vector<v1::PeerMessage> session;   // messages on the Session after the HelloAck
  std::vector<v1::PeerMessage> control;   // the messages of in-band control records, flattened
  std::vector<v1::FrameHeader> frames;    // a frame's header, once its last chunk arrived
  std::vector<int64_t> frame_arrival_ns;  // steady clock, per entry of `frames`
  std::vector<ReadAsked> reads;           // read requests, on the data channel
  std::vector<ReadAnswered> answers;      // answers to askRead, once whole
  uint64_t payload_bytes = 0;
  bool session_ended = false;
  bool data_ended = false;
};

class HostilePeer {
 public:
  struct Options {
    std::string address;  // the daemon's gRPC listener, host:port
    std::string token = "integ-secret";
    std::string daemon_id = "hostile";
    uint64_t session_id = 0x4057113;
    uint32_t protocol_version = 3;
    std::string transport = "grpc";  // or "tcp": the only one the Hello offers
    uint64_t instance = 1;           // the daemon instance its Hello claims
    // The daemon may refuse the Hello: then admitted() is false and
    // refusal() says why, and nothing else is done.
    bool may_be_refused = false;
  };

  // Completes Hello/HelloAck (the daemon must choose options.transport) and
  // opens the data channel; REQUIREs every step.
  explicit HostilePeer(Options options);
  // Cancels both calls and joins the readers.
  ~HostilePeer();
  HostilePeer(const HostilePeer&) = delete;
  HostilePeer& operator=(const HostilePeer&) = delete;

  const v1::HelloAck& helloAck() const noexcept { return hello_ack_; }
  bool admitted() const noexcept { return refusal_.ok(); }
  const grpc::Status& refusal() const noexcept { return refusal_; }

  // Sending; false once the call is broken.
  bool sendSession(const v1::PeerMessage& message);
  bool sendControl(const v1::ControlBatch& record);
  bool sendControl(const v1::PeerMessage& message);
  // A frame as one chunk: header first, payload, last set.  `more`: others
  // follow at once, so gRPC may hold this one back and send them together.
  bool sendFrame(const v1::FrameHeader& header, const std::string& payload, bool more = false);
  // The answer to a read the daemon asked for (or to none): `bytes` as the
  // contents of source `source_id`, for read `read_id`.
  bool answerRead(uint64_t read_id, uint64_t source_id, const std::string& bytes);
  // Asks the daemon for `length` bytes of its offer's source `source_id`,
  // as read `read_id` (the answer lands in the inbox's `answers`).
  bool askRead(uint64_t source_id, uint64_t read_id, uint64_t length);

  // Reading starts only when asked: until then the daemon's writes pile up
  // in its own buffers and the flow-control windows.
  void readSession();
  void readData();
  // Reads the data channel until `pause(inbox)` holds after a message it
  // took, then nothing more until resumeData(): what the daemon writes after
  // that waits in the socket (or the flow-control windows).
  void readDataUntil(std::function<bool(const PeerInbox&)> pause);
  void resumeData();

  // A copy of what arrived so far.
  PeerInbox inbox() const;
  // Waits until `done(inbox)` holds; returns its last value.
  bool waitFor(const std::function<bool(const PeerInbox&)>& done, Millis timeout) const;
  // The first Fin on the Session, into `out`; false: none yet.
  bool finReceived(v1::Fin* out) const;

 private:
  void openTcp();
  bool sendTcp(uint32_t magic, const transport::FrameHeader* header, const std::string& bytes);
  void sessionLoop();
  void dataLoop();
  void tcpLoop();
  void frameArrived(const v1::FrameHeader& header, uint64_t payload_bytes);
  void controlArrived(const std::string& record);
  void readAsked(const ReadAsked& read);
  void readAnswered(ReadAnswered answer);
  // Between messages of the data channel: holds the reader while paused.
  void holdIfPaused();

  Options options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Link::Stub> stub_;
  grpc::ClientContext session_ctx_;
  grpc::ClientContext data_ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::PeerMessage, v1::PeerMessage>> session_;
  std::unique_ptr<transport::RawClientDataStream> data_;  // grpc
  int tcp_fd_ = -1;                                       // tcp
  v1::HelloAck hello_ack_;
  grpc::Status refusal_;  // OK: the daemon answered the Hello

  mutable std::mutex mutex_;
  PeerInbox inbox_;
  std::function<bool(const PeerInbox&)> pause_when_;  // readDataUntil's
  bool paused_ = false;
  bool stopping_ = false;
  std::condition_variable resumed_;
  std::thread session_reader_;
  std::thread data_reader_;
};

// Messages of `inbox` (Session and in-band) that match `pred`.
size_t countMessages(const PeerInbox& inbox, const std::function<bool(const v1::PeerMessage&)>& pred);

// The daemon's resident set, from /proc/<pid>/status VmRSS, in KiB (-1: unreadable).
int64_t residentKiB(pid_t pid);

}  // namespace framelink::integ
