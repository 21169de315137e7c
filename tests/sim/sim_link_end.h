// The world's hold on one end of a simulated link, as its agent sees it.
//
// Half-open: a dialer that gives up on a connection closes its socket, but a
// peer behind a dead route never hears the FIN: until its keepalive ends
// the session it keeps the link, and what it writes there goes nowhere.  The
// loopback tells the other end of every shutdown at once, so this end
// swallows its own shutdown once the world says the connection is
// half-open; the world later breaks the link itself.
//
// Tapped: the last control records this end wrote are kept, so that an
// adversarial peer can send one again later (a duplicate, out of order).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "transport/transport.h"

namespace framelink::sim {

class SimLinkEnd final : public transport::Transport {
 public:
  explicit SimLinkEnd(std::shared_ptr<transport::Transport> inner) : inner_(std::move(inner)) {}

  // From now on this end's shutdown stays here: the listener keeps the link.
  void goHalfOpen() { half_open_ = true; }

  const char* name() const noexcept override { return inner_->name(); }
  bool connected() const noexcept override { return !half_open_ && inner_->connected(); }
  Result<transport::RemoteCredit> exposeCredit(transport::LocalCredit credit) override {
    return inner_->exposeCredit(std::move(credit));
  }
  void retractCredit(uint64_t credit_id) override { inner_->retractCredit(credit_id); }
  transport::PostResult post(const transport::SendRequest& request) noexcept override {
    return inner_->post(request);
  }
  std::string_view lastRefusal() const noexcept override { return inner_->lastRefusal(); }
  bool readable() const noexcept override { return inner_->readable(); }
  Result<transport::RemoteSource> exposeSource(transport::LocalSource source) override {
    return inner_->exposeSource(std::move(source));
  }
  void retractSource(uint64_t source_id) override { inner_->retractSource(source_id); }
  transport::PostResult postRead(const transport::ReadRequest& request) noexcept override {
    return inner_->postRead(request);
  }
  transport::PostResult postControl(std::string record) noexcept override {
    if (recent_.size() == kRecent) recent_.pop_front();
    recent_.push_back(record);
    return inner_->postControl(std::move(record));
  }
  // A control record this end wrote lately (empty: none yet).
  const std::string& recent(size_t pick) const {
    static const std::string kNone;
    return recent_.empty() ? kNone : recent_[pick % recent_.size()];
  }
  // Straight onto the wire, as if this end's agent had written it.
  transport::PostResult inject(std::string record) noexcept { return inner_->postControl(std::move(record)); }
  void flush() noexcept override { inner_->flush(); }
  size_t poll(transport::TransportEvent* out, size_t max) noexcept override { return inner_->poll(out, max); }
  int eventFd() const noexcept override { return inner_->eventFd(); }
  void shutdown() noexcept override {
    if (!half_open_) inner_->shutdown();
  }
  transport::TransportCounters counters() const noexcept override { return inner_->counters(); }

 private:
  std::shared_ptr<transport::Transport> inner_;
  static constexpr size_t kRecent = 8;
  bool half_open_ = false;
  std::deque<std::string> recent_;
};

}  // namespace framelink::sim
