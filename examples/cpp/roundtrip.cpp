// roundtrip: a C++ producer and consumer of one stream on the local framelinkd, through
// framelink.hpp. It sends FRAMES frames of SIZE bytes, each filled with a pattern of its id,
// checks every byte that arrives and waits for each frame's completion.
//
//   framelink_roundtrip [STREAM [SOCKET [FRAMES [SIZE]]]]
//
// STREAM defaults to "example-cpp"; SOCKET to $FRAMELINK_SOCKET, else the default socket;
// FRAMES to 100, SIZE to 65536. Exit status: 0 every frame arrived intact and was delivered,
// 1 bad arguments, 2 the daemon could not be reached or refused, 3 a frame went wrong.
#include <framelink/framelink.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace {

uint8_t patternByte(uint64_t frame_id, uint64_t offset) {
  return static_cast<uint8_t>(frame_id * 31 + offset);
}

int run(const std::string& stream, const std::string& socket, uint64_t frames, uint64_t size) {
  framelink::Options options;
  options.stream = stream;
  options.socket_path = socket;
  options.slot_count = 4;
  options.slot_size = size;
  options.attach_timeout_ms = 2000;
  // The consumer first: a frame goes to the readers attached when it is sent.
  framelink::Consumer consumer(options);
  framelink::Producer producer(options);
  uint64_t intact = 0, delivered = 0;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t id = 1; id <= frames; ++id) {
    std::optional<framelink::SlotLease> slot = producer.acquire(5000);
    if (!slot) throw framelink::Error(FL_ETIMEDOUT, "no free slot in 5 s");
    for (uint64_t i = 0; i < size; ++i) slot->data()[i] = patternByte(id, i);
    framelink::FrameMeta meta;
    meta.frame_id = id;
    slot->setMeta(meta);
    slot->submit(size);
    std::optional<framelink::Frame> frame = consumer.receive(5000);
    if (!frame)
      throw framelink::Error(FL_ETIMEDOUT, "frame " + std::to_string(id) + " did not arrive in 5 s");
    bool same = frame->frameId() == id && frame->size() == size;
    for (uint64_t i = 0; same && i < size; ++i) same = frame->data()[i] == patternByte(id, i);
    intact += same ? 1 : 0;
    frame->release();
    for (const fl_completion& c : producer.waitCompletions(5000)) delivered += c.status == FL_OK ? 1 : 0;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("stream '%s': %llu frames of %llu bytes, %llu intact, %llu delivered, %.0f frames/s\n",
              stream.c_str(), static_cast<unsigned long long>(frames), static_cast<unsigned long long>(size),
              static_cast<unsigned long long>(intact), static_cast<unsigned long long>(delivered),
              seconds > 0 ? double(frames) / seconds : 0.0);
  return intact == frames && delivered == frames ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 5 || (argc > 1 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help"))) {
    std::fprintf(stderr, "usage: %s [STREAM [SOCKET [FRAMES [SIZE]]]]\n", argv[0]);
    return 1;
  }
  const uint64_t frames = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 100;
  const uint64_t size = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 65536;
  if (frames == 0 || size == 0) {
    std::fprintf(stderr, "%s: FRAMES and SIZE must be positive numbers\n", argv[0]);
    return 1;
  }
  try {
    return run(argc > 1 ? argv[1] : "example-cpp", argc > 2 ? argv[2] : "", frames, size);
  } catch (const framelink::Error& e) {
    std::fprintf(stderr, "%s: %s (%s)\n", argv[0], e.what(), framelink::statusName(e.status()).c_str());
    return e.status() == FL_ETIMEDOUT ? 3 : 2;
  }
}
