// Pull, as the consumer's daemon books it: the offers it took (each into a
// pull credit it granted), queued per link, posted as reads while the link has
// fewer than its bound in flight, and completed -- and when a link with reads
// out has seen none complete for long.  Posts nothing and answers nothing:
// InboundStreams decides what a read's end means (inbound_pull.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "transport/transport.h"

namespace framelink {

class PullReads {
 public:
  // One offer taken, to be read.
  struct Read {
    uint64_t link_id = 0;
    transport::FrameHeader header;
    transport::RemoteSource source;
    bool posted = false;
    bool abandoned = false;           // its consumer went: answered already, the read lands unused
    std::shared_ptr<void> keepalive;  // posted: the consumer's segments, until the read completes
  };
  using Reads = std::map<uint64_t, Read>;  // by cookie

  // The offer waits for its read on `link_id`; returns its cookie.
  uint64_t queue(uint64_t link_id, const transport::FrameHeader& header,
                 const transport::RemoteSource& source);
  // The offer next in line on the link, while it has fewer than `bound`
  // reads out; skips (drops) the cookies of offers erased meanwhile.
  Reads::iterator next(uint64_t link_id, size_t bound);
  // The offer at the head of the link's line leaves the line: posted, or not to be read.
  void leaveLine(uint64_t link_id);
  // That read was posted (on the agent's clock `now_ns`): it holds `keepalive` until it completes.
  void posted(Reads::iterator read, std::shared_ptr<void> keepalive, uint64_t now_ns);
  // A posted read of the link completed: returned, and forgotten; nullopt
  // when it is not a posted read of that link (late, forged, or dropped).
  std::optional<Read> complete(uint64_t link_id, uint64_t cookie, uint64_t now_ns);
  // Forgets a read not posted (its line keeps the cookie, skipped later).
  Reads::iterator erase(Reads::iterator read) { return reads_.erase(read); }
  // The link went: its reads and its line go (the transport ended the posted ones).
  void dropLink(uint64_t link_id);

  // Links whose reads out have not moved for `stall_ns` (0: none ever is): (link, reads out).
  std::vector<std::pair<uint64_t, size_t>> stalled(uint64_t now_ns, uint64_t stall_ns) const;

  Reads& reads() { return reads_; }
  Reads::iterator end() { return reads_.end(); }
  // Reads posted and not completed, on every link.
  size_t inFlight() const { return posted_; }
  // The most reads one link had in flight at once.
  size_t peakPerLink() const { return peak_; }

 private:
  struct LinkReads {
    std::deque<uint64_t> waiting;  // cookies of offers not yet read, in the order they came
    size_t out = 0;                // posted, not yet complete
    uint64_t moved_ns = 0;         // when one last completed, or the first of `out` was posted
  };
  Reads reads_;
  std::map<uint64_t, LinkReads> links_;
  size_t posted_ = 0;
  size_t peak_ = 0;
  uint64_t next_cookie_ = 1;
};

}  // namespace framelink
