#include "link/protocol_versions.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <charconv>

namespace framelink {

VersionRange helloRange(uint32_t newest, uint32_t oldest) noexcept {
  if (oldest == 0 || oldest > newest) return {newest, newest};
  return {oldest, newest};
}

std::optional<uint32_t> agreedVersion(VersionRange mine, VersionRange theirs) noexcept {
  const uint32_t high = std::min(mine.max, theirs.max);
  if (high < std::max(mine.min, theirs.min) || high == 0) return std::nullopt;
  return high;
}

std::string describe(VersionRange range) {
  if (range.min == range.max) return std::to_string(range.max);
  return std::to_string(range.min) + "-" + std::to_string(range.max);
}

namespace {

bool parseNumber(std::string_view text, uint32_t& out) noexcept {
  if (text.empty() || text.size() > 10) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && end == text.data() + text.size();
}

}  // namespace

std::optional<VersionRange> parseRange(std::string_view text) noexcept {
  VersionRange range;
  const size_t dash = text.find('-');
  if (dash == std::string_view::npos) {
    if (!parseNumber(text, range.max)) return std::nullopt;
    range.min = range.max;
  } else if (!parseNumber(text.substr(0, dash), range.min) ||
             !parseNumber(text.substr(dash + 1), range.max)) {
    return std::nullopt;
  }
  if (range.min > range.max || range.min == 0) return std::nullopt;
  return range;
}

std::string mismatchText(VersionRange mine, VersionRange theirs) {
  const bool peer_older = theirs.max < mine.min;
  return "no protocol version in common: the peer speaks " + describe(theirs) + ", this daemon " +
         describe(mine) + " (FL_ERR_PEER_VERSION); upgrade the " + (peer_older ? "peer" : "daemon here") +
         ": a release speaks its own version and the one before, so hosts one release apart link";
}

std::optional<VersionRange> refusedVersions(const ::grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  const auto found = trailers.find(::grpc::string_ref(kVersionsKey.data(), kVersionsKey.size()));
  if (found == trailers.end()) return std::nullopt;
  return parseRange(std::string_view(found->second.data(), found->second.size()));
}

}  // namespace framelink
