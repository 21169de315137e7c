// [discovery] without etcd: an entry's JSON and what is refused of it, the
// found daemons as peers beside the written ones, and where a stream goes
// then (tests/integration/test_discovery.cpp runs it against a real etcd).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/base64.h"
#include "config/config.h"
#include "discovery/discovery.h"
#include "discovery/dns_srv.h"
#include "discovery/etcd_registry.h"

namespace fl = framelink;

namespace {

fl::PeerConfig written(const std::string& name, std::vector<std::string> streams = {}) {
  fl::PeerConfig p;
  p.name = name;
  p.address = name + ".example:7700";
  p.streams = std::move(streams);
  return p;
}

fl::RegistryEntry entry(const std::string& id, std::vector<std::string> readers = {},
                        std::vector<std::string> producers = {}) {
  return fl::RegistryEntry{id, id + ".example:7700", std::move(readers), std::move(producers), 7};
}

// Found, and dialed or not.
fl::FoundDaemon found(const std::string& id, std::vector<std::string> readers = {}, bool dial = false) {
  return fl::FoundDaemon{entry(id, std::move(readers)), dial};
}

}  // namespace

TEST_CASE("discovery: an entry goes to JSON and back; one that is malformed or names another id is refused",
          "[discovery]") {
  const fl::RegistryEntry e{"line-3", "10.0.0.3:7700", {"cam0", "thumbs"}, {"raw"}, 1234};
  auto back = fl::parseEntry("line-3", fl::formatEntry(e));
  REQUIRE(back.ok());
  CHECK(back.value() == e);

  auto refused = [](const std::string& id, const std::string& value) {
    auto r = fl::parseEntry(id, value);
    REQUIRE_FALSE(r.ok());
    return r.error().message;
  };
  CHECK(refused("line-3", "not json") == "not a JSON object");
  CHECK(refused("line-4", fl::formatEntry(e)) == "it names daemon 'line-3' under the key of 'line-4'");
  CHECK(refused("line-3", R"({"id":"line-3"})").find("a field is missing") == 0);
  CHECK(refused("line-3", R"({"id":"line-3","address":"nowhere"})") == "address 'nowhere' is not HOST:PORT");
  CHECK(refused("bad id", R"({"id":"bad id","address":"h:1"})").find("its id") != std::string::npos);
  CHECK(refused("line-3", R"({"id":"line-3","address":"h:1","readers":["no spaces"]})")
            .find("a reader's stream") != std::string::npos);
  CHECK(refused("line-3", R"({"id":"line-3","address":"h:1","producers":["a/b"]})")
            .find("a producer's stream") != std::string::npos);
  CHECK(refused("line-3", std::string(70000, ' ')) == "entry larger than 64 KiB");
}

TEST_CASE(
    "discovery: a link is needed where a producer here writes a stream a found daemon reads; one per pair",
    "[discovery]") {
  const fl::RegistryEntry cam = entry("cam-1", {}, {"raw", "thumbs"});
  const fl::RegistryEntry insp = entry("insp-1", {"raw"});
  const fl::RegistryEntry idle = entry("idle-1");
  CHECK(fl::needsLink(cam, insp));
  CHECK_FALSE(fl::needsLink(insp, cam));
  CHECK_FALSE(fl::needsLink(cam, idle));
  CHECK(fl::dialsFor(cam, insp));
  // Each writes what the other reads: the one whose id sorts first dials, the other does not.
  const fl::RegistryEntry a = entry("a", {"back"}, {"forth"});
  const fl::RegistryEntry b = entry("b", {"forth"}, {"back"});
  CHECK(fl::needsLink(a, b));
  CHECK(fl::needsLink(b, a));
  CHECK(fl::dialsFor(a, b));
  CHECK_FALSE(fl::dialsFor(b, a));
}

TEST_CASE("discovery: found daemons become peers beside the written ones; those dialed have their address",
          "[discovery]") {
  fl::Config c;
  c.id = "host-m";
  c.peers = {written("host-a", {"cam0"})};
  const fl::Config with = fl::withFoundPeers(c, {found("host-a", {"x"}, true), found("host-b", {"cam1"}),
                                                 found("host-z", {}, true), found("host-m")});
  REQUIRE(with.peers.size() == 3);
  CHECK(with.peers[0] == c.peers[0]);  // the written one wins over its entry
  const fl::PeerConfig& b = with.peers[1];
  CHECK(b.name == "host-b");
  CHECK(b.discovered);
  CHECK(b.address.empty());  // not dialed: no producer here writes what it reads
  CHECK(b.streams == std::vector<std::string>{"cam1"});
  CHECK(b.cert_name.empty());  // without TLS
  CHECK(with.peers[2].address == "host-z.example:7700");

  // Found again: the earlier finds are replaced, not added to.
  const fl::Config again = fl::withFoundPeers(with, {found("host-z", {"cam1"}, true)});
  REQUIRE(again.peers.size() == 2);
  CHECK(again.peers[1].streams == std::vector<std::string>{"cam1"});
  const auto changes = fl::foundChanges(with, again);
  REQUIRE(changes.size() == 2);
  CHECK(changes[0] == "host-z changed (dialed at host-z.example:7700; readers: cam1)");
  CHECK(changes[1] == "host-b gone from the registry");
  CHECK(fl::foundChanges(again, again).empty());
  CHECK(fl::foundChanges(c, with)[0] == "host-b found (not dialed from here; readers: cam1)");

  // Under TLS a found daemon's certificate must name its id.
  c.tls_cert_file = "/etc/framelink/host.pem";
  CHECK(fl::withFoundPeers(c, {found("host-z")}).peers[1].cert_name == "host-z");
}

TEST_CASE("discovery: a stream goes to the daemons with readers of it, unless a written peer takes it",
          "[discovery][routes]") {
  fl::Config c;
  c.id = "producer";
  c.discovery_etcd = "http://etcd:2379";
  c.peers = {written("archive", {"raw"})};
  c = fl::withFoundPeers(c, {found("insp-1", {"cam0", "raw"}), found("insp-2", {"cam0"}), found("idle")});
  CHECK(c.routesFor("cam0") == std::vector<std::string>{"insp-1", "insp-2"});
  CHECK_FALSE(c.routeIsImplicit("cam0"));
  CHECK(c.routesFor("raw") == std::vector<std::string>{"archive"});  // written routes override
  CHECK(c.routesFor("thumbs").empty());
  CHECK(c.whyNoRoute("thumbs") ==
        "none of the 1 configured peers takes stream 'thumbs' (no peer's streams list names it or \"*\"); of "
        "the 3 daemons found in the registry, none has a reader of it");
  CHECK(c.routeWarnings().empty());  // found daemons without readers are no ambiguous peers

  // A single written peer without a list still takes the rest; found readers come first.
  c.peers[0].streams.clear();
  CHECK(c.routesFor("thumbs") == std::vector<std::string>{"archive"});
  CHECK(c.routeIsImplicit("thumbs"));
  CHECK(c.routesFor("cam0") == std::vector<std::string>{"insp-1", "insp-2"});

  // At most kMaxRoutesPerStream found readers of one stream.
  std::vector<fl::FoundDaemon> many;
  for (size_t i = 0; i < fl::kMaxRoutesPerStream + 4; ++i)
    many.push_back(found("r" + std::to_string(100 + i), {"wide"}));
  CHECK(fl::withFoundPeers(c, many).routesFor("wide").size() == fl::kMaxRoutesPerStream);
}

TEST_CASE(
    "discovery: which of a stream's frames a found daemon gets follows its readers' kind; an older release "
    "gets every frame",
    "[discovery][routes]") {
  // Announced and read back: the kinds travel with the readers, each a reader's stream.
  fl::RegistryEntry e = entry("insp-1", {"cam0", "cam1", "cam2"});
  e.subscribed = {"cam0", "cam2"};
  e.grouped = {"cam1", "cam2"};
  auto back = fl::parseEntry("insp-1", fl::formatEntry(e));
  REQUIRE(back.ok());
  CHECK(back.value() == e);
  fl::RegistryEntry lying = e;
  lying.grouped.push_back("cam9");
  auto refused = fl::checkEntry(lying);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message == "stream 'cam9' is grouped but not among its readers");

  fl::Config c;
  c.id = "producer";
  c.discovery_etcd = "http://etcd:2379";
  c.peers = {written("archive", {"raw"})};
  fl::RegistryEntry old = entry("insp-old", {"cam0"});  // a release that does not say which
  c = fl::withFoundPeers(c, {fl::FoundDaemon{e, true}, fl::FoundDaemon{old, true}});
  using R = fl::RouteReaders;
  CHECK(c.routeReaders("insp-1", "cam0") == R::kSubscribers);
  CHECK(c.routeReaders("insp-1", "cam1") == R::kGroup);
  CHECK(c.routeReaders("insp-1", "cam2") == R::kBoth);
  CHECK(c.routeReaders("insp-old", "cam0") == R::kEvery);
  CHECK(c.routeReaders("archive", "raw") == R::kEvery);  // a written peer: every frame, as configured
  CHECK(c.routeReaders("nobody", "cam0") == R::kEvery);

  const auto changes = fl::foundChanges(fl::Config{}, c);
  REQUIRE(changes.size() == 2);
  CHECK(changes[0] ==
        "insp-1 found (dialed at insp-1.example:7700; readers: cam0 [subscribers], cam1 [queue group], cam2 "
        "[subscribers, queue group])");
  CHECK(changes[1] == "insp-old found (dialed at insp-old.example:7700; readers: cam0)");
}

namespace {

// A "server" that sends each datagram back as it came: what a resolver whose
// ephemeral port is the server's own receives when that server is down.
class EchoServer {
 public:
  EchoServer() : fd_(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      unsigned char buf[4096];
      for (;;) {
        sockaddr_in from{};
        socklen_t from_len = sizeof from;
        const ssize_t n = ::recvfrom(fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &from_len);
        if (n <= 0 || stop_) return;
        ++echoed_;
        ::sendto(fd_, buf, static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), from_len);
      }
    });
  }
  ~EchoServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int echoed() const { return echoed_; }

 private:
  int fd_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> echoed_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("DNS SRV: a datagram that is the query itself is no answer (no records would drop the fleet)",
          "[discovery]") {
  EchoServer echo;
  auto found = fl::resolveSrv("_framelink._tcp.fleet.test", echo.address());
  CHECK(echo.echoed() >= 1);
  REQUIRE_FALSE(found);
  INFO(found.error().message);
  CHECK(found.error().message.find("the query itself came back") != std::string::npos);
}

TEST_CASE("base64: RFC 4648's vectors both ways, and what is not base64", "[discovery]") {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    CAPTURE(plain);
    CHECK(framelink::base64Encode(plain) == encoded);
    CHECK(framelink::base64Decode(encoded) == std::optional<std::string>(plain));
  }
  CHECK(framelink::base64Decode(std::string("\0\xff", 2) + "ab") == std::nullopt);
  CHECK(framelink::base64Decode("Zm9") == std::nullopt);  // not a multiple of 4
  CHECK(framelink::base64Decode("Zm9v!!==") == std::nullopt);
}
