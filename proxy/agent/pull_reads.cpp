#include "agent/pull_reads.h"

#include <algorithm>

namespace framelink {

uint64_t PullReads::queue(uint64_t link_id, const transport::FrameHeader& header,
                          const transport::RemoteSource& source) {
  const uint64_t cookie = next_cookie_++;
  reads_[cookie] = Read{link_id, header, source, false};
  links_[link_id].waiting.push_back(cookie);
  return cookie;
}

PullReads::Reads::iterator PullReads::next(uint64_t link_id, size_t bound) {
  auto link = links_.find(link_id);
  if (link == links_.end()) return reads_.end();
  std::deque<uint64_t>& waiting = link->second.waiting;
  while (!waiting.empty() && link->second.out < bound) {
    auto read = reads_.find(waiting.front());
    if (read != reads_.end()) return read;
    waiting.pop_front();
  }
  return reads_.end();
}

void PullReads::leaveLine(uint64_t link_id) {
  auto link = links_.find(link_id);
  if (link != links_.end() && !link->second.waiting.empty()) link->second.waiting.pop_front();
}

void PullReads::posted(Reads::iterator read, std::shared_ptr<void> keepalive, uint64_t now_ns) {
  read->second.posted = true;
  read->second.keepalive = std::move(keepalive);
  LinkReads& link = links_[read->second.link_id];
  if (link.out == 0) link.moved_ns = now_ns;
  ++link.out;
  peak_ = std::max(peak_, link.out);
  ++posted_;
}

std::optional<PullReads::Read> PullReads::complete(uint64_t link_id, uint64_t cookie, uint64_t now_ns) {
  auto it = reads_.find(cookie);
  if (it == reads_.end() || it->second.link_id != link_id || !it->second.posted) return std::nullopt;
  Read read = std::move(it->second);
  reads_.erase(it);
  LinkReads& link = links_[link_id];
  if (link.out > 0) --link.out;
  link.moved_ns = now_ns;
  if (posted_ > 0) --posted_;
  return read;
}

void PullReads::dropLink(uint64_t link_id) {
  for (auto it = reads_.begin(); it != reads_.end();) {
    if (it->second.link_id != link_id) {
      ++it;
      continue;
    }
    if (it->second.posted && posted_ > 0) --posted_;
    it = reads_.erase(it);
  }
  links_.erase(link_id);
}

std::vector<std::pair<uint64_t, size_t>> PullReads::stalled(uint64_t now_ns, uint64_t stall_ns) const {
  std::vector<std::pair<uint64_t, size_t>> links;
  if (stall_ns == 0) return links;  // never
  for (const auto& [link_id, link] : links_) {
    if (link.out != 0 && now_ns - link.moved_ns >= stall_ns) links.emplace_back(link_id, link.out);
  }
  return links;
}

}  // namespace framelink
