#include "agent_state.h"

#include "framelink/framelink.h"

namespace framelink {

std::string statusName(int status) {
  const char* s = fl_status_str(status);
  if (s == nullptr) return std::to_string(status);
  std::string text(s);
  return text.substr(0, text.find(':'));
}

NameKey NameTable::acquire(const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    ++entries_[it->second].users;
    return it->second;
  }
  NameKey key;
  if (!free_.empty()) {
    key = free_.back();
    free_.pop_back();
  } else {
    key = static_cast<NameKey>(entries_.size());
    entries_.emplace_back();
  }
  entries_[key].name = name;
  entries_[key].users = 1;
  by_name_.emplace(name, key);
  return key;
}

void NameTable::release(NameKey key) {
  if (key >= entries_.size() || entries_[key].users == 0) return;
  Entry& e = entries_[key];
  if (--e.users > 0) return;
  by_name_.erase(e.name);
  e.name.clear();
  free_.push_back(key);
}

PeerId PeerTable::resolve(const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  const PeerId id = static_cast<PeerId>(peers_.size());
  peers_.push_back(PeerEntry{name, 0});
  by_name_.emplace(name, id);
  return id;
}

}  // namespace framelink
