// framelink_transport_bench: a transport's two ways to move a frame, side by
// side on one link, in one process: push (the receiver exposes a credit, the
// sender posts the frame into it: RDMA_WRITE_WITH_IMM on rdma) and pull (the
// owner exposes the frame as a source, the reader posts a read of it: RDMA
// READ).  Both pay what the daemon pays per frame at this layer: a credit or
// a source exposed (rdma: a memory window bound) and ended (invalidated) per
// frame; what the peer protocol adds (grants, offers, ACKs) is not here.
//
//   framelink_transport_bench [--transport tcp|grpc|loopback|rdma] [--sizes 4K,64K,1M,4M]
//                             [--bytes-per-size N] [--window 16] [--latency-samples 300]
//
// rdma needs two RDMA devices whose IPs are in FRAMELINK_RDMA_A_IP and
// FRAMELINK_RDMA_B_IP (the Soft-RoCE lane's bench step runs it there, next to
// ib_read_bw and ib_write_bw).  Prints one table: GB/s of each way, their
// ratio; then the 4 KiB one-at-a-time latency of each, spinning and sleeping
// between events, and of reads of one source exposed once (means, in
// microseconds).
// A benchmark: it measures and prints, it does not pass or fail on numbers.
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "transport_pair.h"

using namespace framelink;
using namespace framelink::transport;
using namespace framelink::transport::testing;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "framelink_transport_bench: %s\n", why.c_str());
  std::exit(1);
}

uint64_t parseSize(const std::string& s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) die("bad size '" + s + "'");
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  return v;
}

std::string sizeName(uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

// Memory registered with the pair (rdma needs it; the others ignore it),
// with the slot header's room before each receive slot.
struct Slots {
  static constexpr size_t kHeader = sizeof(fl_slot_header);
  std::vector<uint8_t> bytes;
  std::shared_ptr<void> registration;
  size_t stride;
  Slots(TransportPair& pair, size_t count, size_t size, bool receive)
      : bytes(count * (kHeader + size) + 4096), stride(kHeader + size) {
    auto r = pair.registerMemory(bytes.data(), bytes.size(), receive);
    if (!r) die("cannot register memory: " + r.error().message);
    registration = std::move(r).value();
    std::memset(bytes.data(), 0x5A, bytes.size());
  }
  uint8_t* slot(size_t i) { return bytes.data() + i * stride + kHeader; }
};

// How drive() waits when neither end has an event: in poll(2) on their
// event fds (as the daemon does by default), or not at all (as perftest's
// *_lat and the daemon's spin option do).
enum class Wait { kSleep, kSpin };

// Polls both ends until `done` holds, handing every event to `on`.
template <typename On, typename Done>
void drive(Transport& x, Transport& y, Wait wait, On on, Done done) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  TransportEvent ev[32];
  while (!done()) {
    bool any = false;
    for (Transport* t : {&x, &y}) {
      t->flush();
      for (size_t n; (n = t->poll(ev, 32)) > 0;) {
        any = true;
        for (size_t i = 0; i < n; ++i) {
          if (ev[i].kind == TransportEvent::Kind::kLinkError) die("link error: " + ev[i].message);
          on(t, ev[i]);
        }
      }
    }
    if (Clock::now() > deadline) die("a run took longer than 120 s");
    if (!any && wait == Wait::kSleep && !done()) {
      pollfd fds[2] = {{x.eventFd(), POLLIN, 0}, {y.eventFd(), POLLIN, 0}};
      ::poll(fds, 2, 1);
    }
  }
}

// What one run measured: GB/s, and microseconds per frame (with one in
// flight: the time from post to arrival, or from postRead to completion).
struct Run {
  double gbps = 0;
  double us_per_frame = 0;
};

Run measured(Clock::time_point start, uint64_t size, uint64_t frames) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return Run{static_cast<double>(size) * static_cast<double>(frames) / seconds / 1e9,
             seconds * 1e6 / static_cast<double>(frames)};
}

// Push: b exposes `window` credits; a posts frames into them; each arrival
// frees its slot, which b exposes again under a new id (the grant).
Run push(TransportPair& pair, uint64_t size, uint64_t frames, size_t window, Wait wait = Wait::kSleep) {
  Transport& a = *pair.a;
  Transport& b = *pair.b;
  Slots src(pair, 1, size, false);
  Slots dst(pair, window, size, true);
  const std::optional<uint32_t> key = pair.localKey(a, src.slot(0), size);
  std::deque<RemoteCredit> granted;
  static uint64_t next_credit = 1;  // ids stay unique over the runs on one link
  auto grant = [&](size_t slot) {
    auto c = b.exposeCredit(LocalCredit{next_credit * 1000 + slot, dst.slot(slot), size, nullptr});
    if (!c) die("exposeCredit: " + c.error().message);
    ++next_credit;
    granted.push_back(c.value());
  };
  for (size_t i = 0; i < window; ++i) grant(i);
  b.flush();
  uint64_t posted = 0, arrived = 0;
  const auto start = Clock::now();
  drive(
      a, b, wait,
      [&](Transport* t, const TransportEvent& ev) {
        if (t == &b && ev.kind == TransportEvent::Kind::kFrameArrived) {
          if (ev.status != FL_OK) die("frame arrived with status " + std::to_string(ev.status));
          ++arrived;
          if (posted < frames) grant(ev.header.credit_id % 1000);
        } else if (t == &a && ev.kind == TransportEvent::Kind::kSendComplete && ev.status != FL_OK) {
          die("send completed with status " + std::to_string(ev.status) + ": " + ev.message);
        }
      },
      [&] {
        while (posted < frames && !granted.empty()) {
          SendRequest r;
          r.cookie = posted;
          r.credit = granted.front();
          r.header.credit_id = r.credit.credit_id;
          r.header.length = size;
          r.header.sequence = posted + 1;
          r.payload = src.slot(0);
          r.local_key = key;
          const PostResult p = a.post(r);
          if (p == PostResult::kBackpressure) break;
          if (p != PostResult::kOk) die("post refused: " + std::string(a.lastRefusal()));
          granted.pop_front();
          ++posted;
        }
        return arrived == frames;
      });
  const Run run = measured(start, size, frames);
  for (const RemoteCredit& c : granted) b.retractCredit(c.credit_id);  // granted, never used
  return run;
}

// Pull: a exposes `window` sources (one per frame in flight); b reads each
// into a slot of its own; each completed read ends its source, which a
// exposes again under a new id (the next offer).
Run pull(TransportPair& pair, uint64_t size, uint64_t frames, size_t window, Wait wait = Wait::kSleep) {
  Transport& a = *pair.a;
  Transport& b = *pair.b;
  Slots src(pair, window, size, false);
  Slots dst(pair, window, size, true);
  std::deque<std::pair<RemoteSource, size_t>> offered;  // source, its slot
  static uint64_t next_source = 1;                      // ids stay unique over the runs on one link
  auto offer = [&](size_t slot) {
    auto s = a.exposeSource(LocalSource{next_source * 1000 + slot, src.slot(slot), size, nullptr});
    if (!s) die("exposeSource: " + s.error().message);
    ++next_source;
    offered.emplace_back(s.value(), slot);
  };
  for (size_t i = 0; i < window; ++i) offer(i);
  a.flush();
  std::vector<uint64_t> reading(window);  // source id per reader slot
  uint64_t posted = 0, done = 0;
  const auto start = Clock::now();
  drive(
      a, b, wait,
      [&](Transport* t, const TransportEvent& ev) {
        if (t == &b && ev.kind == TransportEvent::Kind::kReadComplete) {
          if (ev.status != FL_OK)
            die("read completed with status " + std::to_string(ev.status) + ": " + ev.message);
          ++done;
          const uint64_t id = reading[ev.cookie % window];
          a.retractSource(id);  // the reader is done with it: its ACK, in the daemon
          if (posted < frames) offer(id % 1000);
        }
      },
      [&] {
        while (posted < frames && !offered.empty()) {
          const size_t slot = posted % window;
          ReadRequest r;
          r.cookie = posted;
          r.source = offered.front().first;
          r.buffer = dst.slot(slot);
          r.capacity = size;
          r.local_key = pair.localKey(b, r.buffer, size);
          const PostResult p = b.postRead(r);
          if (p == PostResult::kBackpressure) break;
          if (p != PostResult::kOk) die("postRead refused: " + std::string(b.lastRefusal()));
          reading[slot] = r.source.source_id;
          offered.pop_front();
          ++posted;
        }
        return done == frames;
      });
  const Run run = measured(start, size, frames);
  for (const auto& [source, slot] : offered) a.retractSource(source.source_id);  // offered, never read
  return run;
}

// Reads of one source exposed once, one at a time, spinning: what
// ib_read_lat measures (one registration read over and over), without the
// window bound and invalidated per frame that pull() pays.  Microseconds per
// read.
double rereadUs(TransportPair& pair, uint64_t size, uint64_t reads) {
  Transport& a = *pair.a;
  Transport& b = *pair.b;
  Slots src(pair, 1, size, false);
  Slots dst(pair, 1, size, true);
  static uint64_t next_source = 1;
  const uint64_t id = (uint64_t{1} << 40) + next_source++;  // apart from pull()'s ids
  auto s = a.exposeSource(LocalSource{id, src.slot(0), size, nullptr});
  if (!s) die("exposeSource: " + s.error().message);
  a.flush();
  ReadRequest r;
  r.source = s.value();
  r.buffer = dst.slot(0);
  r.capacity = size;
  r.local_key = pair.localKey(b, r.buffer, size);
  uint64_t posted = 0, done = 0;
  const auto start = Clock::now();
  drive(
      a, b, Wait::kSpin,
      [&](Transport* t, const TransportEvent& ev) {
        if (t == &b && ev.kind == TransportEvent::Kind::kReadComplete) {
          if (ev.status != FL_OK)
            die("read completed with status " + std::to_string(ev.status) + ": " + ev.message);
          ++done;
        }
      },
      [&] {
        if (posted == done && posted < reads) {
          r.cookie = posted;
          if (b.postRead(r) != PostResult::kOk) die("postRead refused: " + std::string(b.lastRefusal()));
          ++posted;
        }
        return done == reads;
      });
  const Run run = measured(start, size, reads);
  a.retractSource(id);
  return run.us_per_frame;
}

// --sizes: sizes separated by commas, e.g. 4K,64K,1M.
std::vector<uint64_t> parseSizeList(const std::string& list) {
  std::vector<uint64_t> sizes;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    sizes.push_back(parseSize(list.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return sizes;
}

// --transport: tcp, grpc, loopback or rdma.
TransportKind parseTransportKind(const std::string& transport) {
  if (transport == "loopback") return TransportKind::kLoopback;
  if (transport == "rdma") return TransportKind::kRdma;
  if (transport == "grpc") return TransportKind::kGrpc;
  if (transport != "tcp") die("--transport must be tcp, grpc, loopback or rdma");
  return TransportKind::kTcp;
}

}  // namespace

int main(int argc, char** argv) {
  std::string transport = "tcp";
  std::vector<uint64_t> sizes = {4 << 10, 64 << 10, 1 << 20, 4 << 20};
  uint64_t bytes_per_size = uint64_t{256} << 20;
  size_t window = 16;
  int latency_samples = 300;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--transport") {
      transport = value();
    } else if (arg == "--sizes") {
      sizes = parseSizeList(value());
    } else if (arg == "--bytes-per-size") {
      bytes_per_size = parseSize(value());
    } else if (arg == "--window") {
      window = std::max<size_t>(1, std::strtoul(value().c_str(), nullptr, 10));
    } else if (arg == "--latency-samples") {
      latency_samples = std::max(1, std::atoi(value().c_str()));
    } else {
      die("unknown option " + arg +
          " (usage: [--transport tcp|grpc|loopback|rdma] [--sizes 4K,64K,1M,4M] [--bytes-per-size N] "
          "[--window 16] [--latency-samples 300])");
    }
  }
  auto made = TransportPair::make(parseTransportKind(transport));
  if (!made) die("cannot make a " + transport + " pair: " + made.error().message);
  std::unique_ptr<TransportPair> pair = std::move(made).value();
  if (!pair->a->readable() || !pair->b->readable()) die(transport + " links cannot be read");

  std::printf("push (post into a credit) vs pull (read an exposed source), %s, %zu in flight, one process\n",
              transport.c_str(), window);
  std::printf("%-9s %8s %10s %10s %10s\n", "size", "frames", "push GB/s", "pull GB/s", "pull/push");
  for (uint64_t size : sizes) {
    const uint64_t frames = std::max<uint64_t>(4 * window, bytes_per_size / std::max<uint64_t>(size, 1));
    // Alternately, twice each, so that neither way gets the warmer cache.
    double push_sum = 0, pull_sum = 0;
    for (int round = 0; round < 2; ++round) {
      push_sum += push(*pair, size, frames, window).gbps;
      pull_sum += pull(*pair, size, frames, window).gbps;
    }
    std::printf("%-9s %8llu %10.3f %10.3f %10.2f\n", sizeName(size).c_str(),
                static_cast<unsigned long long>(frames), push_sum / 2, pull_sum / 2,
                push_sum > 0 ? pull_sum / push_sum : 0.0);
    std::fflush(stdout);
  }
  // One frame at a time: post to arrival, and postRead to its completion (with the credit's
  // or the source's exposure for the next one), averaged over the samples.
  // Spinning between events as perftest's ib_read_lat and ib_write_lat do, and sleeping in
  // poll(2) between them as the daemon does unless its spin option is on.
  for (const Wait wait : {Wait::kSpin, Wait::kSleep}) {
    const auto n = static_cast<uint64_t>(latency_samples);
    const double push_us = push(*pair, 4096, n, 1, wait).us_per_frame;
    const double pull_us = pull(*pair, 4096, n, 1, wait).us_per_frame;
    std::printf("4 KiB one at a time, %s (mean of %d): push %.1f us, pull %.1f us, pull/push %.2f\n",
                wait == Wait::kSpin ? "spinning" : "sleeping", latency_samples, push_us, pull_us,
                push_us > 0 ? pull_us / push_us : 0.0);
  }
  std::printf(
      "4 KiB reads of one source, spinning (mean of %d): %.1f us (no window per frame, as ib_read_lat)\n",
      latency_samples, rereadUs(*pair, 4096, static_cast<uint64_t>(latency_samples)));
  return 0;
}
