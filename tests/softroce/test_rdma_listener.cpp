// With real verbs: a connection request that stalls -- a dialer without a QP that takes the
// listener's reply and never completes the connection (no rdma_establish, so no RTU) -- delays
// no genuine peer, and the listener drops it at its deadline and counts it.
//
//   FRAMELINK_RDMA_A_IP=10.77.1.1 FRAMELINK_RDMA_B_IP=10.77.1.2 framelink_rdma_listener
//
// B_IP is the listener's device, A_IP both dialers'.  Exit status: 0 passed, 1 failed, 77
// skipped (no addresses given).
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "framelink/framelink.h"
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_wire.h"

namespace rdma = framelink::transport::rdma;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSkip = 77;
constexpr uint64_t kSession = 0x57A11ED;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "  ok  " : "  FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

sockaddr_in ipv4(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

// The next event on `channel` within `wait`, acked; RDMA_CM_EVENT_CONNECT_ERROR when none came.
rdma_cm_event_type nextEvent(rdma_event_channel* channel, std::chrono::milliseconds wait) {
  pollfd p{channel->fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return RDMA_CM_EVENT_CONNECT_ERROR;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(channel, &ev) != 0) return RDMA_CM_EVENT_CONNECT_ERROR;
  const rdma_cm_event_type type = ev->event;
  rdma_ack_cm_event(ev);
  return type;
}

// The connections the listener handed on (its callback runs on the listener's thread).
struct Accepted {
  std::mutex mu;
  std::vector<std::unique_ptr<framelink::transport::Transport>> transports;
};

// The stalled dialer: plain librdmacm, no QP (qp_num made up), never rdma_establish().  Its
// channel and id stay open (the caller destroys them) so that the request stays half-way.
struct StalledDialer {
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
};

// Sends a connect request for kSession from a_ip to b_ip:port and takes the listener's reply
// without completing the connection.  False when the id cannot be created (reported).
bool stallHandshake(const char* a_ip, const char* b_ip, uint16_t port, StalledDialer* d) {
  d->channel = rdma_create_event_channel();
  if (d->channel == nullptr || rdma_create_id(d->channel, &d->id, nullptr, RDMA_PS_TCP) != 0) {
    std::printf("  FAIL rdma_create_id: %s\n", std::strerror(errno));
    return false;
  }
  rdma_event_channel* channel = d->channel;
  rdma_cm_id* id = d->id;
  sockaddr_in src = ipv4(a_ip, 0), dst = ipv4(b_ip, port);
  bool stalled_up = rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src),
                                      reinterpret_cast<sockaddr*>(&dst), 2000) == 0 &&
                    nextEvent(channel, 5s) == RDMA_CM_EVENT_ADDR_RESOLVED &&
                    rdma_resolve_route(id, 2000) == 0 &&
                    nextEvent(channel, 5s) == RDMA_CM_EVENT_ROUTE_RESOLVED;
  rdma::RdmaConnectData data{rdma::kRdmaConnectMagic, rdma::kRdmaProtocolVersion, 0, kSession, {}};
  framelink::transport::tokenDigest("", kSession, data.token);
  rdma_conn_param param{};
  param.private_data = &data;
  param.private_data_len = sizeof data;
  param.qp_num = 0xabcde;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  stalled_up = stalled_up && rdma_connect(id, &param) == 0;
  // Without a QP the reply is handed to us to complete; we never do.  (A lost request is sent
  // again after seconds: wait long enough for that.)
  stalled_up = stalled_up && nextEvent(channel, 15s) == RDMA_CM_EVENT_CONNECT_RESPONSE;
  check(stalled_up, "a dialer without a QP sent a request and got the listener's reply");
  return true;
}

// The listener sees ESTABLISHED a moment after the dialer does: true once it handed the one
// connection on, connected, within 5 s.
bool handedOn(Accepted& accepted) {
  bool handed_on = false;
  for (const auto until = Clock::now() + 5s; !handed_on && Clock::now() < until;) {
    {
      std::lock_guard<std::mutex> lock(accepted.mu);
      handed_on = accepted.transports.size() == 1 && accepted.transports[0]->connected();
    }
    if (!handed_on) std::this_thread::sleep_for(5ms);
  }
  return handed_on;
}

}  // namespace

int main() {
  const char* a_ip = std::getenv("FRAMELINK_RDMA_A_IP");
  const char* b_ip = std::getenv("FRAMELINK_RDMA_B_IP");
  if (a_ip == nullptr || b_ip == nullptr) {
    std::printf("skipped: set FRAMELINK_RDMA_A_IP and FRAMELINK_RDMA_B_IP to two RDMA devices' addresses\n");
    return kSkip;
  }
  auto device_a = rdma::RdmaDevice::open({"", a_ip});
  auto device_b = rdma::RdmaDevice::open({"", b_ip});
  if (!device_a || !device_b) {
    std::printf("  FAIL cannot open the devices: %s\n",
                (!device_a ? device_a.error() : device_b.error()).message.c_str());
    return 1;
  }
  std::atomic<uint64_t> timed_out{0}, refused{0}, auth{0};
  Accepted accepted;
  const auto handshake_timeout = 3000ms;
  auto listener = rdma::RdmaListener::listen(
      device_b.value(), b_ip, 0, [](uint64_t s) { return s == kSession; },
      [&](uint64_t, std::unique_ptr<framelink::transport::Transport> t) {
        std::lock_guard<std::mutex> lock(accepted.mu);
        accepted.transports.push_back(std::move(t));
      },
      {}, handshake_timeout, {&timed_out, &refused, &auth});
  if (!listener) {
    std::printf("  FAIL listen: %s\n", listener.error().message.c_str());
    return 1;
  }
  const uint16_t port = listener.value()->port();

  StalledDialer stalled;
  if (!stallHandshake(a_ip, b_ip, port, &stalled)) return 1;

  const auto start = Clock::now();
  auto good = rdma::dialRdma(device_a.value(), b_ip, port, kSession, 15s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  check(good.ok(),
        "a genuine peer connects meanwhile" +
            (good.ok() ? " (" + std::to_string(took.count()) + " ms)" : ": " + good.error().message));
  check(handedOn(accepted), "the listener handed the genuine connection on");
  check(timed_out.load() == 0, "while the stalled handshake was still pending");
  const auto deadline = start + handshake_timeout + 5s;
  while (timed_out.load() == 0 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  check(timed_out.load() == 1, "the stalled handshake was dropped at its deadline and counted");
  check(refused.load() == 0 && auth.load() == 0, "nothing refused");

  rdma_destroy_id(stalled.id);
  rdma_destroy_event_channel(stalled.channel);
  if (good) good.value().reset();
  accepted.transports.clear();
  const auto stop_start = Clock::now();
  listener.value().reset();
  check(Clock::now() - stop_start < 1s, "the listener stops at once");
  std::printf("%s\n", g_failures == 0 ? "PASSED" : "FAILED");
  return g_failures == 0 ? 0 : 1;
}
