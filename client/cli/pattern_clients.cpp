#include "pattern_clients.h"

#include <unistd.h>

#include "cli_util.h"
#include "frame_pattern.h"

namespace framelink::cli {

std::unique_ptr<Consumer> attachPatternConsumer(const std::string& socket, const std::string& stream,
                                                uint32_t slots, uint64_t size, std::string& err,
                                                bool subscribe) {
  ConsumerOptions co;
  co.subscribe = subscribe;
  co.socket_path = socket;
  co.stream = stream;
  co.slot_count = slots;
  co.slot_size = pageRound(size);
  return Consumer::attach(co, err);
}

CheckOptions patternChecks(uint64_t size) {
  CheckOptions checks;
  checks.verify = true;
  checks.expect_order = true;
  checks.sizes.emplace(size);
  return checks;
}

ProducerOptions patternProducerOptions(const std::string& socket, const std::string& stream, uint32_t slots,
                                       uint64_t size) {
  ProducerOptions po;
  po.socket_path = socket;
  po.stream = stream;
  po.slot_count = slots;
  po.slot_size = pageRound(size);
  return po;
}

void describePatternFrame(uint64_t id, uint64_t length, FrameSpec& spec) {
  spec.frame_id = id;
  spec.group_id = pattern::waferOf(id);
  spec.length = length;
  spec.attrs = pattern::makeAttrs(id);
}

bool waitForAttach(const std::atomic<int>& state, uint64_t deadline_ns) {
  while (state.load() == 0 && monotonicNs() < deadline_ns && !g_interrupted.load()) usleep(2000);
  return state.load() == 1;
}

}  // namespace framelink::cli
