// Message-size settings the `grpc` data transport needs on both ends.
//
// A DataMessage carries up to chunk_bytes of payload plus a FrameHeader
// (< 300 bytes) and framing, so the receive limit of the channel (dialing
// daemon) and of the server (listening daemon) must be at least
// grpcMaxMessageBytes(chunk_bytes).  gRPC's default receive limit is 4 MiB,
// which the default 4 MiB chunk already exceeds: the daemon must call
// configureServerBuilder() on its ServerBuilder and create its peer channels
// with channelArguments().  Both peers should use the same chunk size; a
// receiver accepts any chunk that fits its limit.
#pragma once

#include <cstddef>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

namespace framelink::transport {

inline constexpr size_t kDefaultGrpcChunkBytes = size_t{4} << 20;
inline constexpr size_t kGrpcMessageSlack = size_t{64} << 10;  // header, tags, length prefixes
inline constexpr size_t kMaxGrpcChunkBytes = size_t{256} << 20;

// Call metadata key for the shared secret on both Link RPCs.
inline constexpr char kTokenMetadataKey[] = "x-framelink-token";

// Receive limit for messages of `chunk_bytes` payload (never below gRPC's
// 4 MiB default, so control messages are not affected by a small chunk).
size_t grpcMaxMessageBytes(size_t chunk_bytes) noexcept;

// Raises the server's receive (and send) message limits for `chunk_bytes`.
void configureServerBuilder(grpc::ServerBuilder& builder, size_t chunk_bytes);

// Channel arguments with the matching limits, and retries off (see the
// .cpp); add your own on top.
grpc::ChannelArguments channelArguments(size_t chunk_bytes);

}  // namespace framelink::transport
