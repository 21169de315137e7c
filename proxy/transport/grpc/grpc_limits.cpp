#include "transport/grpc/grpc_limits.h"

#include <algorithm>
#include <climits>

namespace framelink::transport {

size_t grpcMaxMessageBytes(size_t chunk_bytes) noexcept {
  constexpr size_t kGrpcDefaultLimit = size_t{4} << 20;
  size_t want = std::min(chunk_bytes, kMaxGrpcChunkBytes) + kGrpcMessageSlack;
  return std::max(want, kGrpcDefaultLimit);
}

void configureServerBuilder(grpc::ServerBuilder& builder, size_t chunk_bytes) {
  int limit = static_cast<int>(std::min<size_t>(grpcMaxMessageBytes(chunk_bytes), INT_MAX));
  builder.SetMaxReceiveMessageSize(limit);
  builder.SetMaxSendMessageSize(limit);
}

grpc::ChannelArguments channelArguments(size_t chunk_bytes) {
  int limit = static_cast<int>(std::min<size_t>(grpcMaxMessageBytes(chunk_bytes), INT_MAX));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(limit);
  args.SetMaxSendMessageSize(limit);
  // The retry layer keeps a reference to every message sent before the call
  // commits, and the grpc transport's payload slices point into producers'
  // slots: it must not hold them.  (The Data server also sends its headers at
  // once, which commits the call where retries stay on.)  Nothing on these
  // channels has a retry policy anyway.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  return args;
}

}  // namespace framelink::transport
