#include "link/transport_registry.h"

#include <algorithm>

#include "config/config.h"

namespace framelink {

namespace {

void addReason(std::string& reason, std::string_view transport, const std::string& why) {
  reason += (reason.empty() ? "" : "; ") + std::string("not ") + std::string(transport) + ": " + why;
}

}  // namespace

std::string joinedNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out.empty() ? "(none)" : out;
}

std::chrono::milliseconds TransportEntry::handshakeTimeout(const Config& config) const {
  return std::chrono::milliseconds(config.connect_timeout_ms);
}

::grpc::Status TransportEntry::admitDataCall(::grpc::ServerContext& ctx, uint64_t session_id) {
  (void)ctx, (void)session_id;
  return {::grpc::StatusCode::UNIMPLEMENTED, std::string(name()) + " does not use the Data call"};
}

void TransportEntry::dataCallAccepted(uint64_t session_id, std::shared_ptr<transport::Transport> t) {
  (void)session_id;
  if (t) t->shutdown();
}

TransportRegistry::TransportRegistry(std::vector<std::unique_ptr<TransportEntry>> entries)
    : entries_(std::move(entries)) {}

TransportEntry* TransportRegistry::find(std::string_view name) const noexcept {
  for (const auto& e : entries_) {
    if (e->name() == name) return e.get();
  }
  return nullptr;
}

std::vector<std::string> TransportRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.emplace_back(e->name());
  return out;
}

Result<std::vector<TransportEntry*>> TransportRegistry::select(
    const std::vector<std::string>& configured) const {
  std::vector<TransportEntry*> out;
  for (const auto& name : configured) {
    TransportEntry* t = find(name);
    if (t == nullptr) {
      return makeError(FL_EINVAL,
                       "unknown transport '" + name + "'; the registered ones are " + joinedNames(names()));
    }
    if (std::find(out.begin(), out.end(), t) != out.end()) {
      return makeError(FL_EINVAL, "transport '" + name + "' is listed twice");
    }
    out.push_back(t);
  }
  return out;
}

TransportRegistry::Choice TransportRegistry::choose(const std::vector<std::string>& offered,
                                                    const std::vector<std::string>& allowed,
                                                    const std::string& self_id,
                                                    uint64_t peer_instance) const {
  Choice choice;
  for (const auto& name : offered) {
    std::string why;
    TransportEntry* t = find(name);
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      why = "peer " + self_id + " does not allow it (transports " + joinedNames(allowed) + ")";
    } else if (t == nullptr) {
      why = "unknown transport; the registered ones are " + joinedNames(names());
    } else if (t->usable(peer_instance, &why)) {
      choice.transport = t;
      return choice;
    }
    addReason(choice.reason, name, why);
  }
  return choice;
}

TransportRegistry::Offer TransportRegistry::offer(const std::vector<TransportEntry*>& configured,
                                                  const HeldBack& held_back) {
  Offer out;
  for (TransportEntry* t : configured) {
    std::string why;
    if (!t->usable(0, &why)) {
      addReason(out.reason, t->name(), why);
      continue;
    }
    std::string held = held_back ? held_back(*t) : std::string();
    // A transport that failed recently waits its turn only when something else can run.
    const bool alternative = std::any_of(configured.begin(), configured.end(), [t](const TransportEntry* o) {
      return o != t && o->usable(0, nullptr);
    });
    if (!held.empty() && alternative) {
      addReason(out.reason, t->name(), held);
      continue;
    }
    out.transports.push_back(t);
  }
  return out;
}

}  // namespace framelink
