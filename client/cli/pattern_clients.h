// The producer and consumer processes `framelink-bench demo` and `bench` fork: attached with page-rounded
// slots for frames of one size that carry the synthetic pattern (frame_pattern.h), and checked the
// same way on the consumer side.
#ifndef FRAMELINK_CLI_PATTERN_CLIENTS_H
#define FRAMELINK_CLI_PATTERN_CLIENTS_H

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "consumer.h"
#include "producer.h"

namespace framelink::cli {

// A consumer of `stream` with `slots` slots of frames of `size`; nullptr and `err` set when it
// cannot attach.
std::unique_ptr<Consumer> attachPatternConsumer(const std::string& socket, const std::string& stream,
                                                uint32_t slots, uint64_t size, std::string& err,
                                                bool subscribe = false);

// What the consumer checks of every frame: its pattern, attrs and wafer, that ids go up by one,
// and that it has `size` bytes.
CheckOptions patternChecks(uint64_t size);

// A producer of `stream` with `slots` slots of frames of `size`; the caller may change the rest.
ProducerOptions patternProducerOptions(const std::string& socket, const std::string& stream, uint32_t slots,
                                       uint64_t size);

// Describes pattern frame `id` of `length` bytes; the payload is the caller's (pattern::fillPattern).
void describePatternFrame(uint64_t id, uint64_t length, FrameSpec& spec);

// Waits until a forked consumer has said whether it attached (`state`: 0 starting, 1 attached,
// 2 failed), at most until `deadline_ns` (monotonic) or Ctrl-C; true when it attached.  The
// consumer attaches before the producer starts, so that the first frames find a receiver.
bool waitForAttach(const std::atomic<int>& state, uint64_t deadline_ns);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_PATTERN_CLIENTS_H
