// End to end with real processes only: two daemons, producers and consumers
// as separate `framelink send` / `framelink recv` processes.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "harness.h"

using namespace framelink::integ;

namespace {

// The one-line JSON summary `send --json` / `recv --json` print on stdout.
std::string jsonLine(const std::string& output) {
  std::string last;
  size_t pos = 0;
  while (pos < output.size()) {
    size_t end = output.find('\n', pos);
    if (end == std::string::npos) end = output.size();
    std::string line = output.substr(pos, end - pos);
    if (!line.empty() && line.front() == '{') last = line;
    pos = end + 1;
  }
  return last;
}

std::optional<uint64_t> jsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\":([0-9]+)");
  if (!std::regex_search(json, m, re)) return std::nullopt;
  return std::stoull(m[1].str());
}

std::optional<bool> jsonBool(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\":(true|false)");
  if (!std::regex_search(json, m, re)) return std::nullopt;
  return m[1].str() == "true";
}

struct Summary {
  int exit_code = -1;
  std::string json;
};

Summary finish(ChildProcess& p, Millis timeout) {
  Summary s;
  s.exit_code = p.wait(timeout);
  s.json = jsonLine(p.output());
  return s;
}

void checkSender(const Summary& s, uint64_t frames, const std::string& what) {
  INFO(what << " summary: " << s.json);
  CHECK(s.exit_code == 0);
  REQUIRE_FALSE(s.json.empty());
  CHECK(jsonNumber(s.json, "submitted") == frames);
  CHECK(jsonNumber(s.json, "delivered") == frames);
  CHECK(jsonNumber(s.json, "failed") == uint64_t{0});
}

void checkReceiver(const Summary& s, uint64_t frames, const std::string& what) {
  INFO(what << " summary: " << s.json);
  CHECK(s.exit_code == 0);
  REQUIRE_FALSE(s.json.empty());
  CHECK(jsonNumber(s.json, "received") == frames);
  CHECK(jsonNumber(s.json, "bad") == uint64_t{0});
  CHECK(jsonBool(s.json, "ok") == true);
}

std::vector<std::string> recvArgs(const DaemonProcess& b, const std::string& stream, uint64_t count,
                                  const std::string& slot_size, std::vector<std::string> checks) {
  std::vector<std::string> args = {
      "recv",        "--socket", b.socketPath(), "--stream", stream,  "--count", std::to_string(count),
      "--slot-size", slot_size,  "--timeout-ms", "60000",    "--json"};
  args.insert(args.end(), checks.begin(), checks.end());
  return args;
}

}  // namespace

TEST_CASE("cli: 2,000 frames of random sizes 1 B .. 8 MiB through two daemons", "[integration][cli][bulk]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  const uint64_t frames = 2000;
  const std::string seed = transport == "tcp" ? "20240601" : "777";

  ChildProcess consumer("recv-" + transport, recvArgs(pair.b(), "bulk", frames, "8M",
                                                      {"--verify", "--expect-seed", seed,
                                                       "--expect-random-size", "1:8M", "--expect-order"}));
  ChildProcess producer(
      "send-" + transport,
      {"send", "--socket", pair.a().socketPath(), "--stream", "bulk", "--random-size", "1:8M", "--seed", seed,
       "--count", std::to_string(frames), "--slot-size", "8M", "--slots", "8", "--crc", "--json"});

  // ~8 GB of payload per run; generous bounds for a loaded 2-core machine.
  Summary sent = finish(producer, Millis(150000));
  Summary got = finish(consumer, Millis(30000));
  checkSender(sent, frames, "send");
  checkReceiver(got, frames, "recv");
  CHECK(pair.a().alive());
  CHECK(pair.b().alive());
}

TEST_CASE("cli: several producers attached to one daemon at once", "[integration][cli][multi]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  const uint64_t frames = 300;

  SECTION("three streams, one consumer each") {
    std::vector<std::unique_ptr<ChildProcess>> consumers, producers;
    for (int i = 1; i <= 3; ++i) {
      const std::string stream = "s" + std::to_string(i);
      const std::string seed = std::to_string(100 + i);
      consumers.push_back(std::make_unique<ChildProcess>(
          "recv-" + stream,
          recvArgs(pair.b(), stream, frames, "2M",
                   {"--verify", "--expect-seed", seed, "--expect-random-size", "1:2M", "--expect-order"})));
    }
    for (int i = 1; i <= 3; ++i) {
      const std::string stream = "s" + std::to_string(i);
      const std::string seed = std::to_string(100 + i);
      producers.push_back(std::make_unique<ChildProcess>(
          "send-" + stream,
          std::vector<std::string>{"send", "--socket", pair.a().socketPath(), "--stream", stream,
                                   "--random-size", "1:2M", "--seed", seed, "--count", std::to_string(frames),
                                   "--slots", "4", "--crc", "--json"}));
    }
    for (auto& p : producers) checkSender(finish(*p, Millis(90000)), frames, p->label());
    for (auto& c : consumers) checkReceiver(finish(*c, Millis(30000)), frames, c->label());
  }

  SECTION("one stream, three producers with disjoint frame id ranges") {
    // The consumer checks every byte, size and attribute by frame id; the
    // interleaving of the three producers is not specified, so no order check.
    const std::string seed = "55";
    ChildProcess consumer("recv-shared",
                          recvArgs(pair.b(), "shared", 3 * frames, "1M",
                                   {"--verify", "--expect-seed", seed, "--expect-random-size", "1:1M"}));
    std::vector<std::unique_ptr<ChildProcess>> producers;
    for (int i = 0; i < 3; ++i) {
      producers.push_back(std::make_unique<ChildProcess>(
          "send-shared-" + std::to_string(i),
          std::vector<std::string>{"send", "--socket", pair.a().socketPath(), "--stream", "shared",
                                   "--random-size", "1:1M", "--seed", seed, "--first-id",
                                   std::to_string(i * 10000), "--count", std::to_string(frames), "--slots",
                                   "4", "--json"}));
    }
    for (auto& p : producers) checkSender(finish(*p, Millis(90000)), frames, p->label());
    checkReceiver(finish(consumer, Millis(30000)), 3 * frames, "recv-shared");
  }
  CHECK(pair.a().alive());
  CHECK(pair.b().alive());
}
