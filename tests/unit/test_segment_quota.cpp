// proxy/attach/segment_quota: the caps "auto" resolves to, and the counting
// of segment bytes per uid and in all.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>

#include "attach/segment_quota.h"
#include "framelink/attach_proto.h"

namespace fl = framelink;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("segment caps: auto is half of RAM in all and half of that per uid; set values stand",
          "[attach][quota]") {
  fl::Config c;
  auto caps = fl::segmentCaps(c, 16 * fl::kGiB);
  CHECK(caps.total == 8 * fl::kGiB);
  CHECK(caps.per_uid == 4 * fl::kGiB);
  CHECK(caps.total_auto);
  CHECK(caps.per_uid_auto);

  c.max_total_bytes = 2 * fl::kGiB;  // per uid follows a set total
  caps = fl::segmentCaps(c, 16 * fl::kGiB);
  CHECK(caps.total == 2 * fl::kGiB);
  CHECK(caps.per_uid == fl::kGiB);
  CHECK_FALSE(caps.total_auto);

  c.max_uid_bytes = 3 * fl::kGiB;
  caps = fl::segmentCaps(c, 16 * fl::kGiB);
  CHECK(caps.per_uid == 3 * fl::kGiB);
  CHECK_FALSE(caps.per_uid_auto);

  // RAM unknown: sized as a small host, never unlimited.
  caps = fl::segmentCaps(fl::Config{}, 0);
  CHECK(caps.total == 4 * fl::kGiB);
  CHECK(fl::physicalRam() > 0);
}

TEST_CASE("segment quota: the user's cap, then the total; released bytes fit again", "[attach][quota]") {
  fl::SegmentQuota quota({.total = 300, .per_uid = 200, .total_auto = false, .per_uid_auto = true});
  CHECK(quota.admit(1, 200));
  auto first = quota.charge(1, 150);
  // uid 1: 150 + 60 > 200.
  auto mine = quota.admit(1, 60);
  REQUIRE_FALSE(mine);
  CHECK(mine.error().code == FL_ERR_QUOTA);
  const std::string& m = mine.error().message;
  INFO(m);
  CHECK(contains(m, "hold 150 bytes"));
  CHECK(contains(m, "needs 60 more"));
  CHECK(contains(m, "limits.max_uid_bytes = 200 (auto, --max-uid-bytes)"));
  CHECK(contains(m, "detach"));
  CHECK(quota.admit(1, 50));

  // uid 2 fits its own cap, but not what is left of the total.
  auto second = quota.charge(2, 100);
  CHECK(quota.total() == 250);
  auto all = quota.admit(2, 60);
  REQUIRE_FALSE(all);
  INFO(all.error().message);
  CHECK(contains(all.error().message, "all clients hold 250 bytes"));
  CHECK(contains(all.error().message, "limits.max_total_bytes = 300 (--max-total-bytes)"));
  // A request larger than a cap by itself is refused, without overflow.
  CHECK_FALSE(quota.admit(3, UINT64_MAX));

  first.reset();  // its segments went
  CHECK(quota.ofUid(1) == 0);
  CHECK(quota.total() == 100);
  CHECK(quota.admit(2, 60));
}

TEST_CASE("segment quota: a detached client's bytes count until its segments go", "[attach][quota]") {
  fl::SegmentQuota quota({.total = 300, .per_uid = 300, .total_auto = false, .per_uid_auto = false});
  auto gone = quota.charge(1, 200);
  std::shared_ptr<void> frame_in_flight = gone;  // what holds the segments after the client went
  CHECK_FALSE(quota.fitsOnceDrained(1, 200));    // nothing is draining: time lifts nothing
  gone->detached();
  gone.reset();
  CHECK(quota.total() == 200);
  CHECK(quota.draining() == 200);
  auto refused = quota.admit(1, 200);
  REQUIRE_FALSE(refused);
  INFO(refused.error().message);
  CHECK(contains(refused.error().message, "hold 200 bytes of segments"));
  CHECK(contains(refused.error().message,
                 "; 200 of them are of detached clients, held until their frames end"));
  CHECK(refused.error().message.size() < FL_ATTACH_MESSAGE_MAX);
  CHECK(quota.fitsOnceDrained(1, 200));
  CHECK_FALSE(quota.fitsOnceDrained(1, 301));  // more than the cap: never
  // Given back on another thread, as the data agent or a transport lets go of the segments last.
  std::thread([held = std::move(frame_in_flight)]() mutable { held.reset(); }).join();
  CHECK(quota.total() == 0);
  CHECK(quota.draining() == 0);
  CHECK(quota.admit(1, 200));
}

TEST_CASE("segment quota: the refusal fits an attach reply with realistic numbers", "[attach][quota]") {
  fl::SegmentQuota quota(
      {.total = 512 * fl::kGiB, .per_uid = 256 * fl::kGiB, .total_auto = true, .per_uid_auto = true});
  auto one = quota.charge(1, 255 * fl::kGiB);
  auto two = quota.charge(2, 255 * fl::kGiB);
  one->detached();
  auto mine = quota.admit(1, 64 * fl::kGiB);
  REQUIRE_FALSE(mine);
  CHECK(mine.error().message.size() < FL_ATTACH_MESSAGE_MAX);
  auto all = quota.admit(3, 64 * fl::kGiB);
  REQUIRE_FALSE(all);
  CHECK(all.error().message.size() < FL_ATTACH_MESSAGE_MAX);
}
