// The journal entry of a log line: priority, identifier, the FL_* fields of
// the LogScopes open where it was logged, and the message byte for byte.
#include <spdlog/spdlog.h>
#include <syslog.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/journal_sink.h"
#include "common/log_fields.h"
#include "common/log_limit.h"

using framelink::journalFields;
using framelink::JournalSink;
using framelink::LogFields;
using framelink::LogScope;

namespace {

spdlog::details::log_msg message(spdlog::level::level_enum level, std::string_view text) {
  return spdlog::details::log_msg("framelinkd", level, text);
}

bool has(const std::vector<std::string>& fields, const std::string& field) {
  return std::find(fields.begin(), fields.end(), field) != fields.end();
}

bool hasName(const std::vector<std::string>& fields, const std::string& name) {
  return std::any_of(fields.begin(), fields.end(),
                     [&](const std::string& f) { return f.rfind(name + "=", 0) == 0; });
}

// The entries the sink sent, each as its fields.
std::vector<std::vector<std::string>> g_sent;

int catchEntry(const struct iovec* fields, int count) {
  std::vector<std::string> entry;
  for (int i = 0; i < count; ++i)
    entry.emplace_back(static_cast<const char*>(fields[i].iov_base), fields[i].iov_len);
  g_sent.push_back(std::move(entry));
  return 0;
}

int failEntry(const struct iovec* /*fields*/, int /*count*/) { return -ENOENT; }

}  // namespace

TEST_CASE("an entry without a scope has the message, priority and identifier only") {
  const auto f = journalFields("framelinkd", message(spdlog::level::warn, "peer down"), LogFields{});
  CHECK(f == std::vector<std::string>{"MESSAGE=peer down", "PRIORITY=4", "SYSLOG_IDENTIFIER=framelinkd"});
}

TEST_CASE("levels map to syslog priorities") {
  CHECK(framelink::journalPriority(spdlog::level::trace) == LOG_DEBUG);
  CHECK(framelink::journalPriority(spdlog::level::debug) == LOG_DEBUG);
  CHECK(framelink::journalPriority(spdlog::level::info) == LOG_INFO);
  CHECK(framelink::journalPriority(spdlog::level::warn) == LOG_WARNING);
  CHECK(framelink::journalPriority(spdlog::level::err) == LOG_ERR);
  CHECK(framelink::journalPriority(spdlog::level::critical) == LOG_CRIT);
}

TEST_CASE("the fields set are sent, the others left out") {
  const auto msg = message(spdlog::level::info, "x");
  const auto all = journalFields("framelinkd", msg,
                                 LogFields{.client = 12, .peer = "hostB", .stream = "cam0", .sequence = 0});
  CHECK(has(all, "FL_CLIENT=12"));
  CHECK(has(all, "FL_PEER=hostB"));
  CHECK(has(all, "FL_STREAM=cam0"));
  CHECK(has(all, "FL_SEQUENCE=0"));  // sequence 0 is a sequence
  CHECK(all.size() == 7);

  const auto peer_only = journalFields("framelinkd", msg, LogFields{.peer = "hostB"});
  CHECK(has(peer_only, "FL_PEER=hostB"));
  CHECK_FALSE(hasName(peer_only, "FL_CLIENT"));
  CHECK_FALSE(hasName(peer_only, "FL_STREAM"));
  CHECK_FALSE(hasName(peer_only, "FL_SEQUENCE"));
}

TEST_CASE("the call site goes in CODE_FILE, CODE_LINE and CODE_FUNC when spdlog has it") {
  const spdlog::details::log_msg msg(spdlog::source_loc{"proxy/x.cpp", 42, "f"}, "framelinkd",
                                     spdlog::level::err, "boom");
  const auto f = journalFields("framelinkd", msg, LogFields{});
  CHECK(has(f, "CODE_FILE=proxy/x.cpp"));
  CHECK(has(f, "CODE_LINE=42"));
  CHECK(has(f, "CODE_FUNC=f"));
  CHECK_FALSE(
      hasName(journalFields("framelinkd", message(spdlog::level::err, "boom"), LogFields{}), "CODE_FILE"));
}

TEST_CASE("a message with newlines, non-ASCII text or a NUL byte is passed intact") {
  const std::string text =
      std::string("stream 'kamera-\xc3\xa4\xe2\x82\xac'\nsecond line\n\tthird") + '\0' + "end";
  const auto f =
      journalFields("framelinkd", message(spdlog::level::info, text), LogFields{.stream = "\xc3\xa4"});
  CHECK(f[0] == "MESSAGE=" + text);
  CHECK(has(f, "FL_STREAM=\xc3\xa4"));
}

TEST_CASE("scopes nest: inner fields add to the outer ones and are undone at their end") {
  CHECK(framelink::currentLogFields().client == 0);
  {
    const LogScope peer(LogFields{.peer = "hostB"});
    {
      const LogScope client(LogFields{.client = 3, .stream = "cam0", .sequence = 9});
      CHECK(framelink::currentLogFields().peer == "hostB");
      CHECK(framelink::currentLogFields().client == 3);
      CHECK(framelink::currentLogFields().stream == "cam0");
      CHECK(framelink::currentLogFields().sequence == 9);
      {
        const LogScope other(LogFields{.peer = "hostC"});
        CHECK(framelink::currentLogFields().peer == "hostC");
        CHECK(framelink::currentLogFields().client == 3);
      }
      CHECK(framelink::currentLogFields().peer == "hostB");
    }
    CHECK(framelink::currentLogFields().peer == "hostB");
    CHECK(framelink::currentLogFields().client == 0);
    CHECK(framelink::currentLogFields().stream.empty());
    CHECK_FALSE(framelink::currentLogFields().sequence.has_value());
  }
  CHECK(framelink::currentLogFields().peer.empty());
}

TEST_CASE("the sink sends each line with the fields of the scope it was logged in") {
  g_sent.clear();
  auto logger =
      std::make_shared<spdlog::logger>("framelinkd", std::make_shared<JournalSink>("framelinkd", catchEntry));
  {
    const LogScope scope(LogFields{.client = 12, .peer = "hostB"});
    logger->warn("client {} of peer {}:\nfailed", 12, "hostB");
  }
  logger->info("outside");
  REQUIRE(g_sent.size() == 2);
  CHECK(g_sent[0] == std::vector<std::string>{"MESSAGE=client 12 of peer hostB:\nfailed", "PRIORITY=4",
                                              "SYSLOG_IDENTIFIER=framelinkd", "FL_CLIENT=12",
                                              "FL_PEER=hostB"});
  CHECK(g_sent[1] ==
        std::vector<std::string>{"MESSAGE=outside", "PRIORITY=6", "SYSLOG_IDENTIFIER=framelinkd"});
}

TEST_CASE("LogLimiter's lines, the count of suppressed ones too, carry the scope's fields") {
  g_sent.clear();
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "framelinkd", std::make_shared<JournalSink>("framelinkd", catchEntry)));
  framelink::LogLimiter limiter(std::chrono::milliseconds(1), 1);
  {
    const LogScope scope(LogFields{.client = 7, .stream = "cam0"});
    limiter.warn("client {} misbehaves", 7);
    limiter.warn("client {} misbehaves", 7);  // suppressed
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    limiter.warn("client {} misbehaves", 7);
  }
  spdlog::set_default_logger(previous);
  REQUIRE(g_sent.size() == 3);  // the first, the count, the third
  CHECK(has(g_sent[1], "MESSAGE=1 more lines like the next were suppressed in the last 1 ms"));
  for (const auto& entry : g_sent) {
    CHECK(has(entry, "FL_CLIENT=7"));
    CHECK(has(entry, "FL_STREAM=cam0"));
  }
}

TEST_CASE("a line the journal does not take goes to spdlog's error handler") {
  auto sink = std::make_shared<JournalSink>("framelinkd", failEntry);
  std::string error;
  spdlog::logger logger("framelinkd", sink);
  logger.set_error_handler([&](const std::string& what) { error = what; });
  logger.info("lost");
  CHECK(error.find("cannot write to the journal") != std::string::npos);
}
