#include "client_util.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>

#include "frame_pattern.h"

namespace framelink::integ {

std::string statusName(int status) {
  const char* s = fl_status_str(status);
  return std::to_string(status) + " (" + (s ? s : "?") + ")";
}

AttachResult tryAttach(const std::string& socket, uint32_t role, const std::string& stream,
                       uint32_t slot_count, uint64_t slot_size) {
  fl_client_options opt;
  fl_client_options_init(&opt);
  // These clients see a daemon that went away as the tests expect it: FL_ERR_DAEMON_GONE.  The
  // tests of auto_reattach (on by default) attach with fl_client_options_init's defaults.
  opt.auto_reattach = 0;
  opt.role = role;
  opt.socket_path = socket.c_str();
  opt.stream = stream.c_str();
  opt.client_name = "integration-test";
  opt.slot_count = slot_count;
  opt.slot_size = slot_size;
  fl_client* c = nullptr;
  AttachResult r;
  r.status = fl_attach(&opt, &c);
  if (r.status != FL_OK) {
    r.message = fl_last_error();
    CHECK(c == nullptr);
  } else {
    r.client = Client(c);
  }
  return r;
}

namespace {
Client attachOrFail(const DaemonProcess& d, uint32_t role, const std::string& stream, uint32_t slot_count,
                    uint64_t slot_size) {
  AttachResult r = tryAttach(d.socketPath(), role, stream, slot_count, slot_size);
  INFO((role == FL_PRODUCER ? "producer" : "consumer") << " attach to " << d.id() << " stream " << stream
                                                       << ": " << statusName(r.status) << " " << r.message);
  REQUIRE(r.status == FL_OK);
  return std::move(r.client);
}

uint64_t realtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}
}  // namespace

Client attachProducer(const DaemonProcess& d, const std::string& stream, uint32_t slot_count,
                      uint64_t slot_size) {
  return attachOrFail(d, FL_PRODUCER, stream, slot_count, slot_size);
}

Client attachConsumer(const DaemonProcess& d, const std::string& stream, uint32_t slot_count,
                      uint64_t slot_size) {
  return attachOrFail(d, FL_CONSUMER, stream, slot_count, slot_size);
}

Client attachWith(const DaemonProcess& d, uint32_t role, const std::string& stream, bool subscribe,
                  uint32_t slot_count, uint64_t slot_size, bool pull) {
  fl_client_options opt;
  fl_client_options_init(&opt);
  opt.auto_reattach = 0;  // as in tryAttach
  opt.role = role;
  opt.socket_path = d.socketPath().c_str();
  opt.stream = stream.c_str();
  opt.slot_count = slot_count;
  opt.slot_size = slot_size;
  opt.subscribe = subscribe ? 1 : 0;
  opt.pull = pull ? 1 : 0;
  fl_client* c = nullptr;
  const int rc = fl_attach(&opt, &c);
  INFO("attach to " << d.id() << " stream " << stream << ": " << statusName(rc) << " " << fl_last_error());
  REQUIRE(rc == FL_OK);
  return Client(c);
}

std::string trySubmitFrame(fl_client* producer, uint64_t frame_id, uint64_t length, bool crc,
                           uint32_t* index) {
  fl_slot slot{};
  int rc = fl_acquire(producer, 10000, &slot);
  if (rc != FL_OK) return "fl_acquire for frame " + std::to_string(frame_id) + ": " + fl_last_error();
  if (slot.capacity < length) return "slot of " + std::to_string(slot.capacity) + " bytes";
  pattern::fillPattern(frame_id, slot.data, length);
  const std::string attrs = pattern::makeAttrs(frame_id);
  fl_frame_meta meta{};
  meta.frame_id = frame_id;
  meta.group_id = pattern::waferOf(frame_id);
  meta.timestamp_ns = realtimeNs();
  meta.flags = crc ? FL_META_CRC32C : 0;
  meta.attr_length = static_cast<uint32_t>(attrs.size());
  meta.attrs = reinterpret_cast<const uint8_t*>(attrs.data());
  rc = fl_set_meta(producer, slot.index, &meta);
  if (rc != FL_OK) return std::string("fl_set_meta: ") + fl_last_error();
  rc = fl_submit(producer, slot.index, length);
  if (rc != FL_OK) return std::string("fl_submit: ") + fl_last_error();
  if (index != nullptr) *index = slot.index;
  return {};
}

uint32_t submitFrame(fl_client* producer, uint64_t frame_id, uint64_t length, bool crc) {
  uint32_t index = 0;
  const std::string why = trySubmitFrame(producer, frame_id, length, crc, &index);
  INFO("frame " << frame_id << ": " << why);
  REQUIRE(why.empty());
  return index;
}

fl_frame receiveFrame(fl_client* consumer, Millis timeout) {
  fl_frame f{};
  int rc = fl_receive(consumer, &f, static_cast<int>(timeout.count()));
  INFO("fl_receive: " << statusName(rc) << " " << fl_last_error());
  REQUIRE(rc == FL_OK);
  return f;
}

void checkSyntheticFrame(const fl_frame& frame, uint64_t expected_id, uint64_t expected_length) {
  CHECK(frame.frame_id == expected_id);
  CHECK(frame.length == expected_length);
  CHECK(frame.group_id == pattern::waferOf(expected_id));
  const std::string attrs = pattern::makeAttrs(expected_id);
  REQUIRE(frame.attr_length == attrs.size());
  CHECK(std::memcmp(frame.attrs, attrs.data(), attrs.size()) == 0);
  CHECK(pattern::verifyPattern(expected_id, frame.data, frame.length) == pattern::kNpos);
}

std::vector<fl_completion> collectCompletions(fl_client* producer, size_t count, Millis timeout) {
  std::vector<fl_completion> got;
  const auto deadline = Clock::now() + timeout;
  while (got.size() < count) {
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) break;
    fl_completion buf[16];
    size_t n = 0;
    int rc = fl_wait_completions(producer, buf, 16, &n, static_cast<int>(std::min<long>(left, 200)));
    if (rc != FL_OK && rc != FL_ETIMEDOUT && rc != FL_EAGAIN) {
      FAIL_CHECK("fl_wait_completions: " << statusName(rc) << " " << fl_last_error());
      break;
    }
    got.insert(got.end(), buf, buf + n);
  }
  return got;
}

void requireServing(const DaemonProcess& a, const DaemonProcess& b, const std::string& stream, int frames) {
  INFO("daemons must still serve a fresh producer/consumer pair on stream " << stream);
  Client consumer = attachConsumer(b, stream, 4, 256 * 1024);
  Client producer = attachProducer(a, stream, 4, 256 * 1024);
  for (int i = 0; i < frames; ++i) {
    const uint64_t id = 1000 + uint64_t(i);
    const uint64_t len = 1000 + 4099 * uint64_t(i);
    submitFrame(producer.get(), id, len, true);
    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    checkSyntheticFrame(f, id, len);
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    INFO("completion status " << statusName(done[0].status));
    CHECK(done[0].status == FL_OK);
    CHECK(done[0].frame_id == id);
  }
}

int64_t waitForMetric(const DaemonProcess& d, const std::string& name, int64_t at_least) {
  const auto until = std::chrono::steady_clock::now() + Millis(20000);
  int64_t v = d.metric(name);
  while (v < at_least && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(Millis(50));
    v = d.metric(name);
  }
  return v;
}

}  // namespace framelink::integ
