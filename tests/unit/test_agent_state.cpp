// Ids the data agent resolves once: interned stream names and peers.
#include <catch2/catch.hpp>

#include "agent/agent_state.h"
#include "framelink/framelink.h"

using namespace framelink;

TEST_CASE("stream names are interned while in use and forgotten with the last user", "[agent_state]") {
  NameTable names;
  const NameKey cam = names.acquire("cam");
  const NameKey cam_again = names.acquire("cam");
  const NameKey other = names.acquire("other");
  CHECK(cam == cam_again);
  CHECK(cam != other);
  CHECK(names.name(cam) == "cam");
  CHECK(names.size() == 2);
  names.release(cam);
  CHECK(names.size() == 2);  // one user left
  names.release(cam);
  CHECK(names.size() == 1);
  // A peer churning through names reuses the keys: the table does not grow.
  for (int i = 0; i < 1000; ++i) {
    const NameKey k = names.acquire("churn-" + std::to_string(i));
    CHECK(k <= 1);
    names.release(k);
  }
  CHECK(names.size() == 1);
  CHECK(names.name(other) == "other");
  names.release(other);
  names.release(other);  // one release too many is ignored
  CHECK(names.size() == 0);
}

TEST_CASE("peers keep the id they were first given", "[agent_state]") {
  PeerTable peers;
  const PeerId a = peers.resolve("host-a");
  const PeerId b = peers.resolve("host-b");
  CHECK(a != b);
  CHECK(peers.resolve("host-a") == a);
  CHECK(peers[b].name == "host-b");
  CHECK(peers[a].link_id == 0);
  peers[a].link_id = 7;
  CHECK(peers[peers.resolve("host-a")].link_id == 7);
  CHECK(peers.size() == 2);
}

TEST_CASE("status names drop fl_status_str's description", "[agent_state]") {
  CHECK(statusName(FL_ERR_TOO_LARGE) == "FL_ERR_TOO_LARGE");
  CHECK(statusName(FL_OK) == "FL_OK");
}
