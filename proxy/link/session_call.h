// The Session call on gRPC's asynchronous API, either side, as a reactor:
// startRead, startWrite and finish, and on...Done when each completes, as on
// gRPC's callback API -- but every completion comes through one completion
// queue that one thread of the daemon drives (SessionQueue), asleep in
// Next() while nothing happens.  (gRPC 1.51's callback API on Linux runs
// its reactions on "nexting" threads that wake every second, calls or not:
// 2.4 % of a core for 64 idle daemons.)  Reactions run one at a time on that
// thread and must not block; startWrite may come from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <thread>

#include "common/thread_annotations.h"
#include "framelink/v1/link.grpc.pb.h"
#include "transport/grpc/grpc_transport.h"

namespace framelink {

// One completion's handler (the grpc transport's Data calls share the queue).
using SessionTag = transport::QueueTag;
using transport::MemberTag;

// The completion queue of the daemon's Session calls and grpc-transport
// Data calls, and its thread.
class SessionQueue {
 public:
  explicit SessionQueue(std::unique_ptr<::grpc::ServerCompletionQueue> cq);
  ~SessionQueue() { shutdown(); }
  SessionQueue(const SessionQueue&) = delete;
  SessionQueue& operator=(const SessionQueue&) = delete;

  ::grpc::ServerCompletionQueue* cq() const { return cq_.get(); }
  // After the server's Shutdown: what is queued completes, then the thread ends.
  void shutdown();

 private:
  std::unique_ptr<::grpc::ServerCompletionQueue> cq_;
  std::thread thread_;
};

// The service: Session asynchronous, Data (the grpc transport's) asynchronous and raw.
using SessionService = v1::Link::WithAsyncMethod_Session<transport::RawDataService>;

// The listener's side.  A call object waits for the next Session (await);
// it ends, onDone, once everything it started completed and the call is over.
class ServerSessionCall {
 public:
  ServerSessionCall() = default;
  virtual ~ServerSessionCall() = default;
  ServerSessionCall(const ServerSessionCall&) = delete;
  ServerSessionCall& operator=(const ServerSessionCall&) = delete;

  void startRead(v1::PeerMessage* message) {
    ops_.fetch_add(1);
    stream_.Read(message, &read_tag_);
  }
  // At most one write (finish() included) is out at a time.
  void startWrite(const v1::PeerMessage* message, ::grpc::WriteOptions options = {}) {
    ops_.fetch_add(1);
    stream_.Write(*message, options, &write_tag_);
  }
  void finish(const ::grpc::Status& status) {
    ops_.fetch_add(1);
    stream_.Finish(status, &finish_tag_);
  }

  virtual void onReadDone(bool /*ok*/) {}
  virtual void onWriteDone(bool /*ok*/) {}
  // The peer went away or the call was cancelled (TryCancel).
  virtual void onCancel() {}
  // The last reaction: the object may delete itself.
  virtual void onDone() = 0;

 protected:
  // Asks for the next Session a peer opens on `cq`: onStart(true) once it
  // came, onStart(false) when the server shuts down first.
  void await(SessionService& service, ::grpc::ServerCompletionQueue* cq) {
    ctx_.AsyncNotifyWhenDone(&done_tag_);
    service.RequestSession(&ctx_, &stream_, cq, cq, &start_tag_);
  }
  virtual void onStart(bool ok) = 0;
  // Keeps the call object while something outside the queue's thread may
  // still start an operation on it (a timer, a listener's hand-over); each
  // hold() is released once (unhold()).
  void hold() { ops_.fetch_add(1); }
  void unhold() { release(); }

  ::grpc::ServerContext ctx_;

 private:
  void started(bool ok) {
    if (!ok) {
      onStart(false);
      return;
    }
    ops_.store(2);  // the done tag, and a hold while onStart runs
    onStart(true);
    release();
  }
  void readDone(bool ok) {
    onReadDone(ok);
    release();
  }
  void writeDone(bool ok) {
    onWriteDone(ok);
    release();
  }
  void finished(bool /*ok*/) { release(); }
  void done(bool /*ok*/) {
    if (ctx_.IsCancelled()) onCancel();
    release();
  }
  void release() {
    if (ops_.fetch_sub(1) == 1) onDone();
  }

  ::grpc::ServerAsyncReaderWriter<v1::PeerMessage, v1::PeerMessage> stream_{&ctx_};
  std::atomic<int> ops_{0};  // completions to come, and the done tag
  MemberTag<ServerSessionCall> start_tag_{this, &ServerSessionCall::started};
  MemberTag<ServerSessionCall> read_tag_{this, &ServerSessionCall::readDone};
  MemberTag<ServerSessionCall> write_tag_{this, &ServerSessionCall::writeDone};
  MemberTag<ServerSessionCall> finish_tag_{this, &ServerSessionCall::finished};
  MemberTag<ServerSessionCall> done_tag_{this, &ServerSessionCall::done};
};

// The dialer's side.  Once a read failed (the call ended or broke) or
// finishWhenIdle() was called, the status is asked for as soon as no read
// or write is out; onDone(status) once everything completed.
class ClientSessionCall {
 public:
  ClientSessionCall() = default;
  virtual ~ClientSessionCall() = default;
  ClientSessionCall(const ClientSessionCall&) = delete;
  ClientSessionCall& operator=(const ClientSessionCall&) = delete;

  void startRead(v1::PeerMessage* message) {
    ops_.fetch_add(1);
    {
      MutexLock lock(mutex_);
      reading_ = true;
    }
    stream_->Read(message, &read_tag_);
  }
  void startWrite(const v1::PeerMessage* message, ::grpc::WriteOptions options = {}) {
    ops_.fetch_add(1);
    {
      MutexLock lock(mutex_);
      ++writing_;
    }
    stream_->Write(*message, options, &write_tag_);
  }

  virtual void onReadDone(bool /*ok*/) {}
  virtual void onWriteDone(bool /*ok*/) {}
  virtual void onStarted(bool /*ok*/) {}
  // The last reaction: the object may be deleted.
  virtual void onDone(const ::grpc::Status& status) = 0;

 protected:
  void startCallOn(v1::Link::Stub& stub, ::grpc::CompletionQueue* cq) {
    stream_ = stub.PrepareAsyncSession(&ctx_, cq);
    ops_.store(2);  // the start, and a hold the Finish releases
    stream_->StartCall(&start_tag_);
  }
  // The call's context.  Declared before stream_, which lives in the call's
  // memory (its arena) and so must go first.
  ::grpc::ClientContext ctx_;

  // For a call with no read out that is to end (cancelled, say): its status now.
  void finishWhenIdle() {
    {
      MutexLock lock(mutex_);
      want_finish_ = true;
    }
    maybeFinish();
  }

 private:
  void started(bool ok) {
    if (!ok) {
      MutexLock lock(mutex_);
      want_finish_ = true;
    }
    onStarted(ok);
    maybeFinish();
    release();
  }
  void readDone(bool ok) {
    {
      MutexLock lock(mutex_);
      reading_ = false;
      want_finish_ = want_finish_ || !ok;
    }
    onReadDone(ok);
    maybeFinish();
    release();
  }
  void writeDone(bool ok) {
    {
      MutexLock lock(mutex_);
      --writing_;
    }
    onWriteDone(ok);
    maybeFinish();
    release();
  }
  void finished(bool /*ok*/) {
    release();  // the Finish
    release();  // the hold
  }
  void maybeFinish() {
    {
      MutexLock lock(mutex_);
      if (!want_finish_ || finishing_ || reading_ || writing_ != 0) return;
      finishing_ = true;
    }
    ops_.fetch_add(1);
    stream_->Finish(&status_, &finish_tag_);
  }
  void release() {
    if (ops_.fetch_sub(1) == 1) onDone(status_);
  }

  std::unique_ptr<::grpc::ClientAsyncReaderWriterInterface<v1::PeerMessage, v1::PeerMessage>> stream_;
  ::grpc::Status status_;  // set by the Finish, read once it completed
  std::atomic<int> ops_{0};
  Mutex mutex_;
  bool reading_ FL_GUARDED_BY(mutex_) = false;
  int writing_ FL_GUARDED_BY(mutex_) = 0;
  bool want_finish_ FL_GUARDED_BY(mutex_) = false;
  bool finishing_ FL_GUARDED_BY(mutex_) = false;
  MemberTag<ClientSessionCall> start_tag_{this, &ClientSessionCall::started};
  MemberTag<ClientSessionCall> read_tag_{this, &ClientSessionCall::readDone};
  MemberTag<ClientSessionCall> write_tag_{this, &ClientSessionCall::writeDone};
  MemberTag<ClientSessionCall> finish_tag_{this, &ClientSessionCall::finished};
};

}  // namespace framelink
