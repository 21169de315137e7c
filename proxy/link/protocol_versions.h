// The peer protocol versions a daemon speaks, and the one a link runs at.
//
// A daemon speaks a range, [kMinProtocolVersion, kProtocolVersion]: its own
// version and, by the version policy (docs/operations/upgrade.md), the one
// before it, so that a line of hosts is upgraded one host at a time.  The
// dialer's Hello carries its range (protocol_version: the newest,
// min_protocol_version: the oldest; 0 from a daemon that speaks one version);
// the listener answers with the newest version both speak in HelloAck's
// protocol_version, or refuses the Session with FAILED_PRECONDITION, a
// message naming both ranges and the trailing metadata kVersionsKey ("3-4"),
// so that the dialer reports a version mismatch, with both ranges, and not
// merely a refusal.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace grpc {
class ClientContext;
}

namespace framelink {

// 2: per-frame protocol on the data transport; 3: pull (Offer).
inline constexpr uint32_t kProtocolVersion = 3;
// The oldest version this daemon still speaks.
inline constexpr uint32_t kMinProtocolVersion = 3;
// Trailing metadata of a Session refused for its version: the listener's range.
inline constexpr std::string_view kVersionsKey = "x-framelink-protocol-versions";

struct VersionRange {
  uint32_t min = 0;
  uint32_t max = 0;
};

inline constexpr VersionRange kSpokenVersions{kMinProtocolVersion, kProtocolVersion};

// A Hello's range: `newest` alone when `oldest` is 0 (a daemon from before
// ranges) or above it (a malformed Hello: only `newest` is believed).
VersionRange helloRange(uint32_t newest, uint32_t oldest) noexcept;
// The newest version in both ranges; none when they do not meet.
std::optional<uint32_t> agreedVersion(VersionRange mine, VersionRange theirs) noexcept;
// "3" or "3-4".
std::string describe(VersionRange range);
// Parses describe()'s text; none when it is not one.
std::optional<VersionRange> parseRange(std::string_view text) noexcept;
// What a side says of a peer it shares no version with: both ranges, and
// which daemon to upgrade.
std::string mismatchText(VersionRange mine, VersionRange theirs);
// The dialer's side: the listener's range when it refused the finished
// Session `ctx` for its version (kVersionsKey); none for another refusal.
std::optional<VersionRange> refusedVersions(const ::grpc::ClientContext& ctx);

}  // namespace framelink
