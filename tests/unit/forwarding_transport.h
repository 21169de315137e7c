// A Transport that hands every call to the one it wraps: a test derives from
// it and overrides only what it watches or changes (a refused exposure, a
// window kept open, the key of the last post).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "transport/transport.h"

namespace framelink::testing {

class ForwardingTransport : public transport::Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<transport::Transport> inner) : inner_(std::move(inner)) {}

  const char* name() const noexcept override { return inner_->name(); }
  bool connected() const noexcept override { return inner_->connected(); }
  Result<transport::RemoteCredit> exposeCredit(transport::LocalCredit credit) override {
    return inner_->exposeCredit(std::move(credit));
  }
  void retractCredit(uint64_t credit_id) override { inner_->retractCredit(credit_id); }
  bool windowOpen(uint64_t credit_id) const noexcept override { return inner_->windowOpen(credit_id); }
  bool creditsWritable() const noexcept override { return inner_->creditsWritable(); }
  transport::PostResult post(const transport::SendRequest& request) noexcept override {
    return inner_->post(request);
  }
  std::string_view lastRefusal() const noexcept override { return inner_->lastRefusal(); }
  transport::PostResult postControl(std::string record) noexcept override {
    return inner_->postControl(std::move(record));
  }
  bool readable() const noexcept override { return inner_->readable(); }
  Result<transport::RemoteSource> exposeSource(transport::LocalSource source) override {
    return inner_->exposeSource(std::move(source));
  }
  void retractSource(uint64_t source_id) override { inner_->retractSource(source_id); }
  transport::PostResult postRead(const transport::ReadRequest& request) noexcept override {
    return inner_->postRead(request);
  }
  void flush() noexcept override { inner_->flush(); }
  size_t poll(transport::TransportEvent* out, size_t max) noexcept override { return inner_->poll(out, max); }
  int eventFd() const noexcept override { return inner_->eventFd(); }
  void shutdown() noexcept override { inner_->shutdown(); }
  transport::TransportCounters counters() const noexcept override { return inner_->counters(); }

 private:
  std::unique_ptr<transport::Transport> inner_;
};

}  // namespace framelink::testing
