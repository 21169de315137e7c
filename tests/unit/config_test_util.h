// What the configuration tests share: a scratch directory for the files a
// test writes, and parseConfig() called the way framelinkd's main calls it.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "config/config.h"

namespace framelink {
namespace config_test {

// The text of a certificate file as far as the configuration reads it (the files
// exist and look like PEM; nothing verifies them).
inline const std::string kPem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

// A private directory for the files one test writes; removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fl_config_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
    REQUIRE(!path_.empty());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path(const std::string& name) const { return path_ + "/" + name; }

  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    return file;
  }

 private:
  std::string path_;
};

inline framelink::Result<framelink::Config> parseAsIs(std::vector<std::string> args) {
  args.insert(args.begin(), "framelinkd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return framelink::parseConfig(static_cast<int>(argv.size()), argv.data());
}

// Most cases are about other settings, with the default listen address
// (0.0.0.0) and no token: they accept that explicitly.  The rule itself is
// tested with parseAsIs.
inline framelink::Result<framelink::Config> parse(std::vector<std::string> args) {
  args.push_back("--allow-unauthenticated");
  return parseAsIs(std::move(args));
}

// Parsing must fail, with a message that contains every fragment given.
inline void requireError(const std::vector<std::string>& args, const std::vector<std::string>& fragments) {
  auto result = parse(args);
  INFO("args: " << [&] {
    std::string s;
    for (const auto& a : args) s += a + " ";
    return s;
  }());
  REQUIRE_FALSE(result.ok());
  CHECK(result.error().code == FL_EINVAL);
  for (const auto& fragment : fragments) {
    INFO("message: " << result.error().message);
    CHECK(result.error().message.find(fragment) != std::string::npos);
  }
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The peers `stream` is routed to, comma-separated ("" for none).
inline std::string routes(const Config& config, const std::string& stream) {
  std::string joined;
  for (const auto& peer : config.routesFor(stream)) joined += (joined.empty() ? "" : ",") + peer;
  return joined;
}

}  // namespace config_test
}  // namespace framelink
