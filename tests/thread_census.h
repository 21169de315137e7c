// A process's threads of one name, read from /proc: how many, and how often
// the scheduler has put them on a CPU (schedstat's third field), which is how
// the tests count a thread's wakes.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace framelink::test {

struct ThreadCensus {
  int threads = 0;    // -1: no such process
  uint64_t runs = 0;  // summed over them
};

inline ThreadCensus threadsNamed(pid_t pid, const std::string& name) {
  const std::string tasks = "/proc/" + (pid == 0 ? std::string("self") : std::to_string(pid)) + "/task";
  ThreadCensus census;
  DIR* dir = ::opendir(tasks.c_str());
  if (dir == nullptr) return {-1, 0};
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = tasks + "/" + entry->d_name;
    std::string comm;
    std::getline(std::ifstream(task + "/comm"), comm);
    if (comm != name) continue;
    uint64_t on_cpu = 0, waited = 0, runs = 0;
    std::ifstream(task + "/schedstat") >> on_cpu >> waited >> runs;
    ++census.threads;
    census.runs += runs;
  }
  ::closedir(dir);
  return census;
}

// This process's own.
inline ThreadCensus ownThreadsNamed(const std::string& name) { return threadsNamed(0, name); }

}  // namespace framelink::test
