// CommandQueue on its own: its eventfd is readable exactly while something is
// queued (so the owner's epoll wakes for a push and never spins on an empty
// queue), drainIf() leaves what it does not take readable, and pushes from
// several threads into an owner that sleeps on epoll are all seen.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <thread>
#include <vector>

#include "agent/command_queue.h"

using namespace framelink;

namespace {

bool queueReadable(const CommandQueue<int>& queue) {
  pollfd p{queue.eventFd(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

}  // namespace

TEST_CASE("command queue: readable while something is queued, and only then", "[command_queue]") {
  CommandQueue<int> queue;
  std::deque<int> out;
  REQUIRE_FALSE(queueReadable(queue));
  CHECK(queue.drain(out) == 0);

  queue.push(1);
  queue.push(2);
  CHECK(queueReadable(queue));
  CHECK(queue.drain(out) == 2);
  CHECK(out == std::deque<int>{1, 2});
  CHECK_FALSE(queueReadable(queue));

  // A drain of nothing leaves it quiet; the next push wakes it again.
  CHECK(queue.drain(out) == 0);
  CHECK_FALSE(queueReadable(queue));
  queue.push(3);
  CHECK(queueReadable(queue));
}

TEST_CASE("command queue: drainIf takes some, the rest stay queued and readable", "[command_queue]") {
  CommandQueue<int> queue;
  for (int i = 1; i <= 5; ++i) queue.push(i);
  std::deque<int> even;
  CHECK(queue.drainIf([](int v) { return v % 2 == 0; }, even) == 2);
  CHECK(even == std::deque<int>{2, 4});
  CHECK(queueReadable(queue));
  std::deque<int> rest;
  CHECK(queue.drain(rest) == 3);
  CHECK(rest == std::deque<int>{1, 3, 5});
  CHECK_FALSE(queueReadable(queue));
}

TEST_CASE("command queue: pushes from four threads all reach an owner sleeping on epoll", "[command_queue]") {
  constexpr int kThreads = 4;
  constexpr int kEach = 20000;
  CommandQueue<int> queue;
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, queue.eventFd(), &ev) == 0);

  std::vector<std::thread> pushers;
  for (int t = 0; t < kThreads; ++t) {
    pushers.emplace_back([&queue, t] {
      for (int i = 0; i < kEach; ++i) queue.push(t * kEach + i);
    });
  }
  std::vector<int> seen(kThreads * kEach, 0);
  size_t got = 0;
  size_t idle_turns = 0;  // turns that woke with nothing to take
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::deque<int> out;
  while (got < seen.size() && std::chrono::steady_clock::now() < give_up) {
    epoll_event fired{};
    // A lost wakeup shows as a wait that never ends: a second is plenty.
    if (::epoll_wait(ep, &fired, 1, 1000) <= 0) break;
    out.clear();
    if (queue.drain(out) == 0) ++idle_turns;
    for (int v : out) ++seen[static_cast<size_t>(v)];
    got += out.size();
  }
  for (auto& p : pushers) p.join();
  ::close(ep);
  REQUIRE(got == seen.size());
  for (size_t i = 0; i < seen.size(); ++i) REQUIRE(seen[i] == 1);
  // A wake with nothing queued would be a spin: the eventfd said so wrongly.
  CHECK(idle_turns == 0);
  CHECK_FALSE(queueReadable(queue));
}
