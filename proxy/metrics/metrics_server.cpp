// Metrics' lifetime and its HTTP endpoint (--metrics): /metrics (the
// Prometheus text), /stats (the JSON) and /healthz, served by cpp-httplib on
// a thread of its own that only reads the metrics.
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "framelink/framelink.h"
#include "metrics/metrics.h"

#ifdef FRAMELINK_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace framelink {

struct Metrics::Server {
#ifdef FRAMELINK_HAVE_HTTPLIB
  httplib::Server http;
#endif
};

Metrics::Metrics()
    : start_time_s_(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()) {}
Metrics::~Metrics() { stop(); }

Status Metrics::serve(const std::string& listen) {
#ifdef FRAMELINK_HAVE_HTTPLIB
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return makeError(FL_EINVAL, "metrics listen address '" + listen + "' must be HOST:PORT");
  }
  std::string host = listen.substr(0, colon);
  int port = std::stoi(listen.substr(colon + 1));
  server_ = std::make_unique<Server>();
  server_->http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus(), "text/plain; version=0.0.4");
  });
  server_->http.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json(), "application/json");
  });
  server_->http.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    const Health h = health();
    res.status = h.ok ? 200 : 503;
    res.set_content(h.text, "text/plain");
  });
  int bound =
      port == 0 ? server_->http.bind_to_any_port(host) : (server_->http.bind_to_port(host, port) ? port : -1);
  if (bound < 0) return makeError(FL_ERR_RESOURCES, "cannot listen for metrics on " + listen);
  port_ = static_cast<uint16_t>(bound);
  thread_ = std::thread([this] { server_->http.listen_after_bind(); });
  return {};
#else
  return makeError(FL_EINVAL, "metrics endpoint not built (cpp-httplib missing); remove --metrics " + listen);
#endif
}

void Metrics::stop() {
#ifdef FRAMELINK_HAVE_HTTPLIB
  if (server_) server_->http.stop();
#endif
  if (thread_.joinable()) thread_.join();
}

}  // namespace framelink
