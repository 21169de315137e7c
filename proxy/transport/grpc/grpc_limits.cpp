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
  return args;
}

}  // namespace framelink::transport
