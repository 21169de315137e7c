// framelink_sim: runs seeded schedules of the frame-protocol simulation
// (sim_world.h) and stops at the first broken invariant, printing its seed and
// the event trace that led to it.
//
//   framelink_sim --schedules 100000             seeds 1..100000
//   framelink_sim --seconds 600 --seed 77        as many as fit, from seed 77
//   framelink_sim --seed 1234 --schedules 1 --trace   one schedule, with its events
//   framelink_sim --receivers 2 --schedules 1000 two receiving daemons, the stream routed to both
#include <chrono>
#include <cstdio>

#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "sim_world.h"

namespace {

// Adds one passed schedule's counts to the totals.
void addToTotal(framelink::sim::SimResult& total, const framelink::sim::SimResult& r) {
  total.frames += r.frames;
  total.delivered += r.delivered;
  total.failed += r.failed;
  total.unknown += r.unknown;
  total.redelivered += r.redelivered;
  total.lent += r.lent;
  total.skipped += r.skipped;
  total.link_breaks += r.link_breaks;
  total.crashes += r.crashes;
  total.damaged += r.damaged;
  total.released_then_lost += r.released_then_lost;
  total.owed_delivered += r.owed_delivered;
  total.forged += r.forged;
  total.two_receivers += r.two_receivers;
  total.pulled += r.pulled;
  total.pulled_adversary += r.pulled_adversary;
}

// The broken invariant of a failed schedule, and the command that replays it.
void printFailure(const framelink::sim::SimOptions& options, const framelink::sim::SimResult& r) {
  std::printf("SIMULATION FAILED at seed %llu (%d daemons, %d receiving): %s\n",
              static_cast<unsigned long long>(options.seed), options.daemons, options.receivers,
              r.failure.c_str());
  std::printf(
      "replay: framelink_sim --seed %llu --schedules 1 --daemons %d --receivers %d --adversary %s "
      "--trace\n",
      static_cast<unsigned long long>(options.seed), options.daemons, options.receivers,
      options.adversary ? "on" : "off");
}

// The summary of a run in which every schedule passed: `ran` schedules from
// seed `seed` on, in `took` seconds.
void printPassed(const framelink::sim::SimResult& total, uint64_t seed, uint64_t ran, double took) {
  std::printf(
      "SIMULATION PASSED: %llu schedules (seeds %llu..%llu, %llu with two receivers, %llu pulled, %llu of "
      "them with the adversary) in %.1f s, "
      "%.0f "
      "schedules/s; frames %llu: "
      "delivered "
      "%llu, failed %llu, unknown %llu, redelivered (flagged) %llu; link breaks %llu, daemon crashes %llu, "
      "damaged payloads %llu, released on a crashed daemon %llu; "
      "released frames a healthy period saw DELIVERED %llu, forged records %llu, lent to a local reader "
      "%llu, skipped for a slow subscriber %llu\n",
      static_cast<unsigned long long>(ran), static_cast<unsigned long long>(seed),
      static_cast<unsigned long long>(seed + ran - 1), static_cast<unsigned long long>(total.two_receivers),
      static_cast<unsigned long long>(total.pulled), static_cast<unsigned long long>(total.pulled_adversary),
      took, took > 0 ? ran / took : 0.0, static_cast<unsigned long long>(total.frames),
      static_cast<unsigned long long>(total.delivered), static_cast<unsigned long long>(total.failed),
      static_cast<unsigned long long>(total.unknown), static_cast<unsigned long long>(total.redelivered),
      static_cast<unsigned long long>(total.link_breaks), static_cast<unsigned long long>(total.crashes),
      static_cast<unsigned long long>(total.damaged),
      static_cast<unsigned long long>(total.released_then_lost),
      static_cast<unsigned long long>(total.owed_delivered), static_cast<unsigned long long>(total.forged),
      static_cast<unsigned long long>(total.lent), static_cast<unsigned long long>(total.skipped));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Deterministic simulation of the framelink frame protocol"};
  uint64_t seed = 1, schedules = 0;
  double seconds = 0;
  size_t steps = 120;
  std::string daemons = "mixed", receivers = "mixed", adversary = "mixed";
  bool trace = false, keep_going = false;
  std::string log_level = "off";
  app.add_option("--seed", seed, "first seed");
  app.add_option("--schedules", schedules, "number of schedules (0: until --seconds)");
  app.add_option("--seconds", seconds, "run for this long (with --schedules, whichever ends first)");
  app.add_option("--steps", steps, "events per schedule before healing");
  app.add_option("--daemons", daemons,
                 "2, 3 (two senders to one receiver), or mixed (every third schedule has 3)")
      ->check(CLI::IsMember({"2", "3", "mixed"}));
  app.add_option(
         "--receivers", receivers,
         "receiving daemons: 1, 2 (one more, the last daemon; each sender routes the stream to both), "
         "or mixed (two in schedules whose seed is 3 or 6 modulo 8)")
      ->check(CLI::IsMember({"1", "2", "mixed"}));
  app.add_option("--adversary", adversary,
                 "forged and duplicated control records (and, in the half of its schedules that pull, read "
                 "answers late or twice): on, off, or mixed (every fifth schedule)")
      ->check(CLI::IsMember({"on", "off", "mixed"}));
  app.add_flag("--trace", trace, "print every schedule's events");
  app.add_flag("--keep-going", keep_going, "do not stop at the first failing seed: list every one");
  app.add_option("--log-level", log_level, "the agents' log level (off, debug, ...)");
  CLI11_PARSE(app, argc, argv);
  if (schedules == 0 && seconds <= 0) schedules = 1000;

  spdlog::set_level(spdlog::level::from_str(log_level));
  google::protobuf::SetLogHandler(nullptr);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  framelink::sim::SimResult total;
  uint64_t ran = 0, failed = 0;
  for (uint64_t s = seed;; ++s) {
    if (schedules != 0 && ran >= schedules) break;
    if (seconds > 0 && Clock::now() >= deadline) break;
    framelink::sim::SimOptions options;
    options.seed = s;
    options.steps = steps;
    options.daemons = daemons == "mixed" ? (s % 3 == 0 ? 3 : 2) : std::stoi(daemons);
    // A quarter of the seeds, of either parity (odd seeds hold ACKs back).
    options.receivers = receivers == "mixed" ? (s % 8 == 3 || s % 8 == 6 ? 2 : 1) : std::stoi(receivers);
    options.keep_trace = trace;
    options.adversary = adversary == "on" || (adversary == "mixed" && s % 5 == 2);
    framelink::sim::SimResult r = framelink::sim::runSchedule(options);
    ++ran;
    if (trace || (!r.ok && !keep_going)) {
      for (const auto& line : r.trace) std::printf("  %s\n", line.c_str());
    }
    if (!r.ok) {
      ++failed;
      printFailure(options, r);
      if (!keep_going) return 1;
      continue;
    }
    addToTotal(total, r);
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  if (failed > 0) {
    std::printf("SIMULATION FAILED: %llu of %llu schedules broke an invariant\n",
                static_cast<unsigned long long>(failed), static_cast<unsigned long long>(ran));
    return 1;
  }
  printPassed(total, seed, ran, took);
  return 0;
}
