// The Prometheus text of proxy/metrics/metrics.cpp with values in it (a live
// daemon's, read by prometheus_client in unit.metrics_exposition, is mostly 0).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "framelink/framelink.h"
#include "metrics/metrics.h"

using namespace framelink;

namespace {

bool has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

}  // namespace

TEST_CASE("delivery latency is exposed in seconds with _sum and _count", "[metrics]") {
  Metrics m;
  m.recordDeliveryLatency(3);     // the 4 us bucket
  m.recordDeliveryLatency(1000);  // the 1024 us bucket
  const std::string text = m.prometheus();
  CHECK(has(text, "# TYPE framelink_delivery_latency_seconds histogram"));
  CHECK(has(text, "framelink_delivery_latency_seconds_bucket{le=\"2e-06\"} 0"));
  CHECK(has(text, "framelink_delivery_latency_seconds_bucket{le=\"4e-06\"} 1"));
  CHECK(has(text, "framelink_delivery_latency_seconds_bucket{le=\"0.000512\"} 1"));
  CHECK(has(text, "framelink_delivery_latency_seconds_bucket{le=\"0.001024\"} 2"));
  CHECK(has(text, "framelink_delivery_latency_seconds_bucket{le=\"+Inf\"} 2"));
  CHECK(has(text, "framelink_delivery_latency_seconds_sum 0.001003"));
  CHECK(has(text, "framelink_delivery_latency_seconds_count 2"));
  CHECK(text.find("_us") == std::string::npos);
}

TEST_CASE("a peer name from a Hello is escaped as a label value", "[metrics][security]") {
  // The listening side labels a link with the id the peer's Hello claims:
  // a quote, backslash or newline in it must not end the label or the line.
  Metrics m;
  Metrics::Gauges g;
  Metrics::LinkGauge l;
  l.peer = "evil\"} 1\nframelink_fake 9\\";
  l.transport = "tcp";
  l.rtt_ns = 1'500'000;
  g.links.push_back(l);
  m.setGauges(g);
  const std::string text = m.prometheus();
  const std::string label = R"(peer="evil\"} 1\nframelink_fake 9\\")";
  CHECK(has(text, "framelink_link_up{" + label + R"(,transport="tcp"} 1)"));
  CHECK(has(text, "framelink_link_rtt_seconds{" + label + "} 0.0015"));
  CHECK(text.find("\nframelink_fake") == std::string::npos);
}

TEST_CASE("failed frames are counted under _total by their status name", "[metrics]") {
  Metrics m;
  m.recordFailure(FL_ERR_NO_CONSUMER);
  m.recordFailure(FL_ERR_NO_CONSUMER);
  m.recordFailure(499);  // no fl_status
  const std::string text = m.prometheus();
  CHECK(has(text, "# TYPE framelink_frames_failed_total counter"));
  CHECK(has(text, "framelink_frames_failed_total{status=\"FL_ERR_NO_CONSUMER\"} 2"));
  CHECK(has(text, "framelink_frames_failed_total{status=\"FL_ERR_TIMEOUT\"} 0"));  // there before it happens
  CHECK(has(text, "framelink_frames_failed_total{status=\"FL_STATUS_499\"} 1"));
  CHECK(text.find("status=\"FL_OK\"") == std::string::npos);
  CHECK(text.find("\nframelink_frames_failed_total ") == std::string::npos);  // one family, all labelled
  CHECK(text.find("failed_by_status") == std::string::npos);
}

TEST_CASE("build info, start time, and clients and their slots by role", "[metrics]") {
  Metrics m;
  Metrics::Gauges g;
  g.producers = {2, 16};
  g.consumers = {1, 8};
  m.setGauges(g);
  const std::string text = m.prometheus();
  const std::string version = std::to_string(FL_VERSION_MAJOR) + "." + std::to_string(FL_VERSION_MINOR) +
                              "." + std::to_string(FL_VERSION_PATCH);
  CHECK(text.find("\nframelink_build_info{version=\"" + version + "\",rdma=\"") != std::string::npos);
  CHECK(text.find("\nframelink_start_time_seconds 1") != std::string::npos);  // after 2001-09-09
  CHECK(has(text, "framelink_clients{role=\"producer\"} 2"));
  CHECK(has(text, "framelink_clients{role=\"consumer\"} 1"));
  CHECK(has(text, "framelink_client_slots{role=\"producer\"} 16"));
  CHECK(has(text, "framelink_client_slots{role=\"consumer\"} 8"));
}

TEST_CASE("peer problems: past their bound the oldest is forgotten, and counted", "[metrics]") {
  Metrics m;
  constexpr size_t kOver = 3;
  for (size_t i = 0; i < PeerProblems::kMaxPeers + kOver; ++i) {
    m.peer_problems.record("peer-" + std::to_string(i), PeerProblems::Cause::kUnreachable, "no connection");
  }
  CHECK(m.peer_problems.snapshot().size() == PeerProblems::kMaxPeers);
  CHECK(m.counters.peer_problems_forgotten.load() == kOver);
  // A peer that has a problem already only updates it: nothing is forgotten.
  const std::string kept = m.peer_problems.snapshot().begin()->first;
  m.peer_problems.record(kept, PeerProblems::Cause::kLinkDown, "went down");
  CHECK(m.peer_problems.snapshot().at(kept).count == 2);
  CHECK(m.counters.peer_problems_forgotten.load() == kOver);
  CHECK(has(m.prometheus(), "framelink_peer_problems_forgotten_total 3"));
  CHECK(m.json().find("\"peer_problems_forgotten\":3") != std::string::npos);
}

TEST_CASE("the JSON is valid for any peer name and carries the agent's snapshot as an object", "[metrics]") {
  Metrics m;
  m.counters.frames_delivered = 7;
  m.recordFailure(FL_ERR_TIMEOUT);
  m.peer_problems.record("bad\xff\"name\n", PeerProblems::Cause::kUnreachable, "no \x01 connection");
  m.setDetail(R"({"clients":[],"links":[{"id":1}]})");
  const auto j = nlohmann::json::parse(m.json());  // throws on invalid JSON or UTF-8
  CHECK(j.at("frames_delivered") == 7);
  CHECK(j.at("counters").at("frames_delivered") == 7);
  CHECK(j.at("failed_by_status").at(std::to_string(FL_ERR_TIMEOUT)) == 1);
  CHECK(j.at("peer_problems").size() == 1);
  CHECK(j.at("detail").at("links").at(0).at("id") == 1);
  CHECK(j.at("detail").at("clients").empty());
}

TEST_CASE("healthz: healthy while the agent publishes its state, and says how long ago it last did",
          "[metrics]") {
  Metrics m;
  m.setHealthWindow(200'000'000);  // 200 ms
  const Metrics::Health starting = m.health();
  CHECK_FALSE(starting.ok);
  CHECK(starting.text.find("has not published") != std::string::npos);
  m.setDetail("{}");
  const Metrics::Health fresh = m.health();
  CHECK(fresh.ok);
  CHECK(fresh.text.rfind("ok: ", 0) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const Metrics::Health stale = m.health();
  CHECK_FALSE(stale.ok);
  CHECK(stale.text.find("ms ago") != std::string::npos);
  CHECK(stale.text.find("stuck") != std::string::npos);
  m.setDetail("{}");  // the agent again
  CHECK(m.health().ok);
}

TEST_CASE(
    "healthz: an idle agent whose state is old is asked for a new one; one that does not answer is stuck",
    "[metrics]") {
  Metrics m;
  m.setHealthWindow(100'000'000);  // 100 ms
  m.setDetail("{}");
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  // An agent that answers (as DataAgent does to CmdPublishStats, from its thread).
  std::vector<std::thread> answers;
  int asked = 0;
  m.setPublishRequest([&] {
    ++asked;
    answers.emplace_back([&m] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      m.setDetail("{}");
    });
  });
  const Metrics::Health answered = m.health();
  for (auto& t : answers) t.join();
  CHECK(asked == 1);
  CHECK(answered.ok);
  CHECK(m.health().ok);  // fresh: not asked again
  CHECK(asked == 1);
  // One that never answers: unhealthy after the wait (a second at most).
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  m.setPublishRequest([&] { ++asked; });
  const auto t0 = std::chrono::steady_clock::now();
  const Metrics::Health stuck = m.health();
  CHECK(asked == 2);
  CHECK_FALSE(stuck.ok);
  CHECK(stuck.text.find("did not when asked") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
}

TEST_CASE("the streams watcher is called when the streams here change, not on every publish", "[metrics]") {
  Metrics m;
  int calls = 0;
  m.setStreamsWatcher([&] { ++calls; });
  Metrics::Gauges g;
  g.streams.readers = {"cam0"};
  m.setGauges(g);
  CHECK(calls == 1);
  g.frames_in_flight = 3;  // another gauge only
  m.setGauges(g);
  CHECK(calls == 1);
  g.streams.grouped = {"cam0"};
  m.setGauges(g);
  CHECK(calls == 2);
  m.setStreamsWatcher({});
  g.streams = {};
  m.setGauges(g);
  CHECK(calls == 2);
  CHECK(m.streamsHere().readers.empty());
}

TEST_CASE("the status line counts clients by role, links up of the peers, frames delivered and failed",
          "[metrics]") {
  Metrics m;
  CHECK(m.summary() ==
        "serving: 0 producers and 0 consumers attached; links up to 0 of 0 peers; 0 frames "
        "delivered, 0 failed");
  Metrics::Gauges g;
  g.producers.clients = 1;
  g.consumers.clients = 2;
  g.links.push_back({"hostB", "rdma"});
  g.links.push_back({"hostC", ""});  // configured, down
  m.setGauges(g);
  m.counters.frames_delivered = 1200;
  m.counters.frames_failed = 3;
  CHECK(m.summary() ==
        "serving: 1 producer and 2 consumers attached; links up to 1 of 2 peers; 1200 frames "
        "delivered, 3 failed");
}
