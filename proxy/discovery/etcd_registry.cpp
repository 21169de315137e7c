#include "discovery/etcd_registry.h"

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/base64.h"
#include "config/config_values.h"
#include "framelink/framelink.h"

namespace framelink {

namespace {

using nlohmann::json;

// The int64 fields of etcd's JSON come as strings ("ID":"7587..."), 0 as absent.
int64_t jsonInt(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}

// The end of the key range that holds every key starting with `prefix`.
std::string rangeEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

constexpr size_t kMaxEntryBytes = size_t{64} * 1024;

}  // namespace

std::string formatEntry(const RegistryEntry& entry) {
  return json{{"id", entry.id},
              {"address", entry.address},
              {"readers", entry.readers},
              {"producers", entry.producers},
              {"instance", std::to_string(entry.instance)},
              {"subscribed", entry.subscribed},
              {"grouped", entry.grouped}}
      .dump();
}

Result<RegistryEntry> parseEntry(const std::string& key_id, const std::string& value) {
  if (value.size() > kMaxEntryBytes) return makeError(FL_ERR_PROTOCOL, "entry larger than 64 KiB");
  const json j = json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return makeError(FL_ERR_PROTOCOL, "not a JSON object");
  RegistryEntry e;
  try {
    e.id = j.at("id").get<std::string>();
    e.address = j.at("address").get<std::string>();
    for (const auto& r : j.value("readers", json::array())) e.readers.push_back(r.get<std::string>());
    for (const auto& p : j.value("producers", json::array())) e.producers.push_back(p.get<std::string>());
    e.instance = static_cast<uint64_t>(jsonInt(j, "instance"));
    for (const auto& s : j.value("subscribed", json::array())) e.subscribed.push_back(s.get<std::string>());
    for (const auto& g : j.value("grouped", json::array())) e.grouped.push_back(g.get<std::string>());
  } catch (const json::exception& ex) {
    return makeError(FL_ERR_PROTOCOL, std::string("a field is missing or of the wrong type: ") + ex.what());
  }
  if (e.id != key_id) {
    return makeError(FL_ERR_PROTOCOL, "it names daemon '" + e.id + "' under the key of '" + key_id + "'");
  }
  return checkEntry(std::move(e));
}

Result<RegistryEntry> checkEntry(RegistryEntry e, bool with_address) {
  if (auto st = checkStreamName(e.id, "its id", false); !st) return st.error();
  const size_t colon = e.address.rfind(':');
  if (with_address && (colon == std::string::npos || colon == 0 || colon + 1 == e.address.size())) {
    return makeError(FL_ERR_PROTOCOL, "address '" + e.address + "' is not HOST:PORT");
  }
  for (auto* streams : {&e.readers, &e.producers, &e.subscribed, &e.grouped}) {
    for (const auto& name : *streams) {
      if (auto st = checkStreamName(
              name, streams == &e.producers ? "a producer's stream" : "a reader's stream", false);
          !st) {
        return st.error();
      }
    }
    std::sort(streams->begin(), streams->end());
    streams->erase(std::unique(streams->begin(), streams->end()), streams->end());
  }
  for (auto* kind : {&e.subscribed, &e.grouped}) {
    for (const auto& name : *kind) {
      if (!std::binary_search(e.readers.begin(), e.readers.end(), name)) {
        return makeError(FL_ERR_PROTOCOL, "stream '" + name + "' is " +
                                              (kind == &e.subscribed ? "subscribed" : "grouped") +
                                              " but not among its readers");
      }
    }
  }
  return e;
}

EtcdRegistry::EtcdRegistry(std::vector<std::string> endpoints, std::string prefix, uint32_t lease_ttl_s)
    : endpoints_(std::move(endpoints)), prefix_(std::move(prefix)), ttl_s_(lease_ttl_s) {
  clients_.resize(endpoints_.size());
}

EtcdRegistry::~EtcdRegistry() = default;

httplib::Client& EtcdRegistry::client(size_t endpoint) {
  auto& c = clients_[endpoint];
  if (!c) {
    c = std::make_unique<httplib::Client>(endpoints_[endpoint]);
    c->set_keep_alive(true);  // one connection for every call: no connect per keep-alive
    // A request goes as two writes (head, body): with Nagle the body waited
    // for the server's delayed ACK, and every call took 40 ms.
    c->set_tcp_nodelay(true);
    c->set_connection_timeout(std::chrono::seconds(1));
    c->set_read_timeout(std::chrono::seconds(2));
    c->set_write_timeout(std::chrono::seconds(2));
  }
  return *c;
}

Result<std::string> EtcdRegistry::call(const std::string& path, const std::string& body) {
  std::string why;
  for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
    const size_t i = (current_ + tried) % endpoints_.size();
    auto res = client(i).Post(path, body, "application/json");
    if (!res) {
      why += (why.empty() ? "" : "; ") + endpoints_[i] + ": " + httplib::to_string(res.error());
      continue;
    }
    current_ = i;
    if (res->status != 200) {
      // etcd answered, and refused: {"error": "...", "code": N}
      const json j = json::parse(res->body, nullptr, false);
      const std::string message = !j.is_discarded() && j.is_object()
                                      ? j.value("message", j.value("error", ""))
                                      : res->body.substr(0, 200);
      return makeError(FL_ERR_PEER_REJECTED, endpoints_[i] + path + ": HTTP " + std::to_string(res->status) +
                                                 (message.empty() ? "" : ": " + message));
    }
    return std::move(res->body);
  }
  return makeError(FL_ERR_DAEMON_UNREACHABLE, "no etcd endpoint answered (" + why + ")");
}

Status EtcdRegistry::publish(const RegistryEntry& self) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (lease_ == 0) {
      auto granted = call("/v3/lease/grant", json{{"TTL", ttl_s_}, {"ID", 0}}.dump());
      if (!granted) return granted.error();
      const json j = json::parse(*granted, nullptr, false);
      lease_ = j.is_discarded() ? 0 : jsonInt(j, "ID");
      if (lease_ == 0) return makeError(FL_ERR_PROTOCOL, "etcd granted no lease: " + granted->substr(0, 200));
    }
    auto put = call("/v3/kv/put", json{{"key", base64Encode(prefix_ + "daemons/" + self.id)},
                                       {"value", base64Encode(formatEntry(self))},
                                       {"lease", std::to_string(lease_)}}
                                      .dump());
    if (put) return {};
    if (put.error().code != FL_ERR_PEER_REJECTED) return put.error();
    lease_ = 0;  // "requested lease not found": etcd lost it (restarted empty, or it expired); grant another
  }
  return makeError(FL_ERR_PEER_REJECTED, "etcd refused this daemon's entry under a new lease");
}

Status EtcdRegistry::keepAlive() {
  if (lease_ == 0) return makeError(FL_ERR_NO_LINK, "no lease to keep alive");
  auto kept = call("/v3/lease/keepalive", json{{"ID", std::to_string(lease_)}}.dump());
  if (!kept) return kept.error();
  // The gateway answers a stream of one message: {"result":{"ID":..,"TTL":..}}.
  const json j = json::parse(*kept, nullptr, false);
  const json result = !j.is_discarded() && j.is_object() ? j.value("result", json::object()) : json::object();
  if (jsonInt(result, "TTL") <= 0) {
    lease_ = 0;
    return makeError(FL_ERR_PEER_REJECTED, "etcd no longer knows this daemon's lease (it expired)");
  }
  return {};
}

Result<Listing> EtcdRegistry::list(std::vector<std::string>& refused) {
  const std::string prefix = prefix_ + "daemons/";
  auto listed =
      call("/v3/kv/range",
           json{{"key", base64Encode(prefix)}, {"range_end", base64Encode(rangeEnd(prefix))}}.dump());
  if (!listed) return listed.error();
  const json j = json::parse(*listed, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return makeError(FL_ERR_PROTOCOL, "etcd's range answer is not JSON");
  }
  Listing out;
  out.revision = jsonInt(j.value("header", json::object()), "revision");
  if (out.revision <= 0) return makeError(FL_ERR_PROTOCOL, "etcd's range answer has no revision");
  for (const auto& kv : j.value("kvs", json::array())) {
    const auto key = base64Decode(kv.value("key", ""));
    const auto value = base64Decode(kv.value("value", ""));
    if (!key || !value || key->rfind(prefix, 0) != 0) {
      refused.push_back("a key that is not base64 under " + prefix);
      continue;
    }
    const std::string id = key->substr(prefix.size());
    auto entry = parseEntry(id, *value);
    if (!entry) {
      refused.push_back(*key + ": " + entry.error().message);
      continue;
    }
    out.entries.push_back(std::move(entry.value()));
  }
  return out;
}

Status EtcdRegistry::watch(int64_t revision, const std::function<void()>& changed) {
  const size_t i = watch_endpoint_++ % endpoints_.size();
  auto client = std::make_shared<httplib::Client>(endpoints_[i]);
  client->set_connection_timeout(std::chrono::seconds(1));
  client->set_write_timeout(std::chrono::seconds(2));
  client->set_tcp_nodelay(true);
  // An idle watch carries nothing: its end is the server's (a closed
  // connection), stopWatch's, or, for a server that vanished without a word,
  // the keep-alive's failure, on which the daemon stops it.
  client->set_read_timeout(std::chrono::hours(24));
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    if (watch_stopped_) return makeError(FL_ERR_SHUTDOWN, "the watch was stopped");
    watching_ = client;
  }
  const std::string prefix = prefix_ + "daemons/";
  httplib::Request req;
  req.method = "POST";
  req.path = "/v3/watch";
  req.body = json{{"create_request",
                   {{"key", base64Encode(prefix)},
                    {"range_end", base64Encode(rangeEnd(prefix))},
                    {"start_revision", std::to_string(revision)}}}}
                 .dump();
  req.set_header("Content-Type", "application/json");
  std::string pending, why;
  bool created = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    if (pending.size() > kMaxEntryBytes * 64) {
      why = "a watch message larger than 4 MiB";
      return false;
    }
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
      const json j = json::parse(pending.substr(0, nl), nullptr, false);
      const json result = !j.is_discarded() && j.is_object() ? j.value("result", json::object()) : json();
      if (!result.is_object()) {
        why = "a watch message that is not etcd's: " + pending.substr(0, std::min<size_t>(nl, 200));
        return false;
      }
      if (result.value("canceled", false) || jsonInt(result, "compact_revision") > 0) {
        why =
            "etcd ended the watch (" + result.value("cancel_reason", std::string("revision compacted")) + ")";
        return false;
      }
      created = created || result.value("created", false);
      if (!result.value("events", json::array()).empty()) changed();
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client->send(req, res, error);
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    watching_.reset();
  }
  if (!why.empty()) return makeError(FL_ERR_PROTOCOL, endpoints_[i] + "/v3/watch: " + why);
  if (!sent) {
    return makeError(FL_ERR_DAEMON_UNREACHABLE, endpoints_[i] + "/v3/watch: " + httplib::to_string(error));
  }
  if (res.status != 200) {
    return makeError(FL_ERR_PEER_REJECTED, endpoints_[i] + "/v3/watch: HTTP " + std::to_string(res.status));
  }
  return makeError(FL_ERR_NO_LINK, endpoints_[i] + "/v3/watch: the stream ended" +
                                       std::string(created ? "" : " before the watch was made"));
}

void EtcdRegistry::stopWatch() {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  watch_stopped_ = true;
  if (watching_) watching_->stop();
}

void EtcdRegistry::interruptWatch() {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  if (watching_) watching_->stop();
}

void EtcdRegistry::withdraw() {
  if (lease_ == 0) return;
  (void)call("/v3/lease/revoke", json{{"ID", std::to_string(lease_)}}.dump());
  lease_ = 0;
}

}  // namespace framelink
