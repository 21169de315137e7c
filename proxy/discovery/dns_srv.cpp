#include "discovery/dns_srv.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "config/config_values.h"

namespace framelink {

namespace {

// An answer of at most this many bytes is read (TCP is used when it is truncated).
constexpr int kMaxAnswerBytes = 65536;

struct Resolver {
  struct __res_state state {};
  Resolver() = default;
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;
  ~Resolver() { ::res_nclose(&state); }
};

Result<std::unique_ptr<Resolver>> openResolver(const std::string& server) {
  auto r = std::make_unique<Resolver>();
  if (::res_ninit(&r->state) != 0) {
    return makeError(FL_ERR_RESOURCES, "the resolver could not be set up (resolv.conf)");
  }
  // A fleet's answer outgrows 512 bytes at a dozen hosts: EDNS0 takes it in
  // one datagram up to ~1200, TCP past that (the resolver retries there when
  // the answer is truncated).  And a server that does not answer is known in
  // seconds, not resolv.conf's default 5 s twice.
  r->state.options |= RES_USE_EDNS0;
  r->state.retrans = std::min(r->state.retrans, 2);
  r->state.retry = std::min(r->state.retry, 2);
  if (server.empty()) return r;
  auto sa = ipv4WithPort(server, 53);  // checked with the configuration
  if (!sa) return std::move(sa).error();
  r->state.nscount = 1;
  r->state.nsaddr_list[0] = *sa;
  return r;
}

std::string expandedName(const ns_msg& msg, const unsigned char* at) {
  char name[NS_MAXDNAME];
  if (::dn_expand(ns_msg_base(msg), ns_msg_end(msg), at, name, sizeof name) < 0) return {};
  return name;
}

// The addresses of A and AAAA records in a section, by owner name (lowercase).
void collectAddresses(ns_msg& msg, ns_sect section, std::map<std::string, std::string>& out) {
  for (int i = 0; i < ns_msg_count(msg, section); ++i) {
    ns_rr rr;
    if (::ns_parserr(&msg, section, i, &rr) != 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    std::string owner = ns_rr_name(rr);
    std::transform(owner.begin(), owner.end(), owner.begin(), ::tolower);
    if (ns_rr_type(rr) == ns_t_a && ns_rr_rdlen(rr) == 4) {
      ::inet_ntop(AF_INET, ns_rr_rdata(rr), text, sizeof text);
      out.emplace(owner, text);
    } else if (ns_rr_type(rr) == ns_t_aaaa && ns_rr_rdlen(rr) == 16) {
      ::inet_ntop(AF_INET6, ns_rr_rdata(rr), text, sizeof text);
      out.emplace(owner, std::string("[") + text + "]");
    }
  }
}

// Queries `name` for `type`: the answer, parsed into `msg`; 0 records (not an
// error) when the name or the record does not exist.
Result<int> query(Resolver& r, const std::string& name, ns_type type, std::vector<unsigned char>& answer,
                  ns_msg& msg) {
  answer.assign(kMaxAnswerBytes, 0);
  const int n = ::res_nquery(&r.state, name.c_str(), ns_c_in, type, answer.data(), kMaxAnswerBytes);
  // What came back must be an answer (its QR bit set): the resolver takes a
  // datagram that is the query itself, as a socket whose ephemeral port is
  // the server's own (a server that is down, on this host) receives, for an
  // answer of no records -- and the whole fleet would be gone.
  constexpr unsigned char kQrBit = 0x80;  // of the header's third byte
  const int why = n < 0 ? r.state.res_h_errno : 0;
  const bool received = n >= 0 || why == HOST_NOT_FOUND || why == NO_DATA;
  if (received && (answer[2] & kQrBit) == 0) {
    return makeError(FL_ERR_LINK_LOST,
                     "no DNS server answered for " + name + " (the query itself came back)");
  }
  if (n < 0) {
    if (why == HOST_NOT_FOUND || why == NO_DATA) return 0;
    return makeError(FL_ERR_LINK_LOST, why == TRY_AGAIN ? "no DNS server answered for " + name
                                                        : "the DNS server refused the query for " + name);
  }
  if (::ns_initparse(answer.data(), n, &msg) != 0) {
    return makeError(FL_ERR_PROTOCOL, "the DNS answer for " + name + " is not well formed");
  }
  return ns_msg_count(msg, ns_s_an);
}

// The host's address from a query of its own ("" when it has none).
std::string lookUp(Resolver& r, const std::string& host) {
  std::vector<unsigned char> answer;
  for (ns_type type : {ns_t_a, ns_t_aaaa}) {
    ns_msg msg{};
    auto count = query(r, host, type, answer, msg);
    if (!count || *count == 0) continue;
    std::map<std::string, std::string> found;
    collectAddresses(msg, ns_s_an, found);
    if (!found.empty()) return found.begin()->second;
  }
  return {};
}

}  // namespace

Result<std::vector<SrvTarget>> resolveSrv(const std::string& name, const std::string& server) {
  auto resolver = openResolver(server);
  if (!resolver) return std::move(resolver).error();
  std::vector<unsigned char> answer;
  ns_msg msg{};
  auto count = query(**resolver, name, ns_t_srv, answer, msg);
  if (!count) return std::move(count).error();
  std::map<std::string, std::string> addresses;
  collectAddresses(msg, ns_s_ar, addresses);
  struct Record {
    uint16_t priority, weight;
    SrvTarget target;
  };
  std::vector<Record> records;
  for (int i = 0; i < *count; ++i) {
    ns_rr rr;
    if (::ns_parserr(&msg, ns_s_an, i, &rr) != 0 || ns_rr_type(rr) != ns_t_srv || ns_rr_rdlen(rr) < 7) {
      continue;
    }
    const unsigned char* rd = ns_rr_rdata(rr);
    Record rec{static_cast<uint16_t>(ns_get16(rd)), static_cast<uint16_t>(ns_get16(rd + 2)), {}};
    rec.target.port = static_cast<uint16_t>(ns_get16(rd + 4));
    rec.target.host = expandedName(msg, rd + 6);
    if (rec.target.host.empty() || rec.target.host == "." || rec.target.port == 0) continue;  // "no service"
    std::transform(rec.target.host.begin(), rec.target.host.end(), rec.target.host.begin(), ::tolower);
    records.push_back(std::move(rec));
  }
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) {
    return std::tie(a.priority, b.weight, a.target.host, a.target.port) <
           std::tie(b.priority, a.weight, b.target.host, b.target.port);
  });
  std::vector<SrvTarget> out;
  for (auto& rec : records) {
    auto known = addresses.find(rec.target.host);
    std::string ip = known != addresses.end() ? known->second : lookUp(**resolver, rec.target.host);
    rec.target.address = (ip.empty() ? rec.target.host : ip) + ":" + std::to_string(rec.target.port);
    out.push_back(std::move(rec.target));
  }
  return out;
}

}  // namespace framelink
