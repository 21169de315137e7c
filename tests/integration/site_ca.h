// A site CA made by the packaged script (packaging/scripts/framelink-site-ca.sh)
// for the integration tests (test_tls.cpp, test_discovery.cpp).
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "harness.h"

namespace framelink::integ {

// In its own directory, with a certificate issued for each host (naming it and 127.0.0.1).
class SiteCa {
 public:
  SiteCa(const char* name, std::initializer_list<const char*> hosts) : dir_(name) {
    run("init '" + file("ca") + "'");
    for (const char* host : hosts) issue(host, {});
  }

  // A certificate for `host` naming it, 127.0.0.1 and `names` (in host/).
  void issue(const std::string& host, const std::vector<std::string>& names) const {
    std::string line = "issue '" + file("ca") + "' " + host + " '" + file(host) + "' 127.0.0.1";
    for (const auto& n : names) line += " " + n;
    run(line);
  }

  std::string file(const std::string& name) const { return dir_.file(name); }
  // The script with ARGS (its output in ca.log, shown when it fails).
  void run(const std::string& args) const {
    const std::string line =
        "sh '" + std::string(FRAMELINK_SITE_CA_SCRIPT) + "' " + args + " >>'" + file("ca.log") + "' 2>&1";
    INFO(line << "\n" << readFile(file("ca.log")));
    REQUIRE(std::system(line.c_str()) == 0);
  }
  // Every host trusts the CA alone (the copy `issue` gave it) and takes a peer
  // only as the id its certificate names.
  std::vector<std::string> tls(const std::string& host) const {
    return {"--tls-cert", file(host + "/host.crt"), "--tls-key",         file(host + "/host.key"),
            "--tls-ca",   file(host + "/ca.crt"),   "--tls-client-auth", "--tls-require-cert-name"};
  }

 private:
  TempDir dir_;
};

}  // namespace framelink::integ
