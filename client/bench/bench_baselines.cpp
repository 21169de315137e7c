#include "bench_baselines.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "bench.grpc.pb.h"
#include "bench_commands.h"
#include "child_process.h"
#include "cli_util.h"

namespace framelink::cli {
namespace {

bool sendAll(int fd, const char* p, size_t len) {
  while (len > 0) {
    const ssize_t w = ::send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    len -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly len bytes; false on EOF or error.
bool recvAll(int fd, char* p, size_t len) {
  while (len > 0) {
    const ssize_t r = ::recv(fd, p, len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    len -= static_cast<size_t>(r);
  }
  return true;
}

// A loopback listener on an ephemeral port.
int listenLoopback(uint16_t& port, std::string& err) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    err = std::string("cannot listen on 127.0.0.1: ") + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  port = ntohs(a.sin_port);
  return fd;
}

int connectLoopback(uint16_t port, std::string& err) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    err = std::string("cannot connect to 127.0.0.1:") + std::to_string(port) + ": " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

void noDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// User + system CPU time of the calling thread (`who` RUSAGE_THREAD) or process, in microseconds.
double cpuUs(int who) {
  rusage ru{};
  getrusage(who, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct TcpShared {
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> messages{0};
  std::atomic<uint64_t> end_ns{0};
  std::atomic<double> recv_cpu_us{0};
  std::atomic<bool> failed{false};
};

}  // namespace

ThroughputResult plainTcpThroughput(uint64_t size, double seconds) {
  ThroughputResult res;
  uint16_t port = 0;
  const int lfd = listenLoopback(port, res.error);
  if (lfd < 0) return res;
  SharedRegion<TcpShared> sh;
  const pid_t child = forkChild([&] {
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return 1;
    std::vector<char> buf(size);
    uint64_t n = 0;
    while (recvAll(fd, buf.data(), buf.size())) ++n;
    sh->end_ns.store(monotonicNs());
    sh->recv_cpu_us.store(cpuUs(RUSAGE_SELF));  // a forked child counts from zero
    sh->messages.store(n);
    sh->bytes.store(n * size);
    ::close(fd);
    return 0;
  });
  ::close(lfd);
  const int fd = connectLoopback(port, res.error);
  if (fd < 0) {
    stopChild(child, 1000);
    return res;
  }
  std::vector<char> buf(size, 'x');
  const uint64_t t0 = monotonicNs();
  const double cpu0 = cpuUs(RUSAGE_THREAD);
  const uint64_t deadline = t0 + static_cast<uint64_t>(seconds * 1e9);
  while (monotonicNs() < deadline && !g_interrupted.load()) {
    if (!sendAll(fd, buf.data(), buf.size())) {
      res.error = std::string("plain TCP send failed: ") + std::strerror(errno);
      break;
    }
  }
  const double send_cpu_us = cpuUs(RUSAGE_THREAD) - cpu0;
  ::shutdown(fd, SHUT_WR);
  const int rc = waitChild(child, 30000);
  ::close(fd);
  if (rc != 0) {
    if (rc < 0) stopChild(child, 1000);
    if (res.error.empty()) res.error = "plain TCP receiver failed";
    return res;
  }
  res.bytes = sh->bytes.load();
  res.messages = sh->messages.load();
  res.seconds = (sh->end_ns.load() - t0) / 1e9;
  if (res.messages > 0) {
    res.send_cpu_us_per_msg = send_cpu_us / static_cast<double>(res.messages);
    res.recv_cpu_us_per_msg = sh->recv_cpu_us.load() / static_cast<double>(res.messages);
  }
  return res;
}

LatencyResult plainTcpOneWay(uint64_t size, uint64_t samples) {
  LatencyResult res;
  uint16_t port = 0;
  const int lfd = listenLoopback(port, res.error);
  if (lfd < 0) return res;
  const pid_t child = forkChild([&] {
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return 1;
    noDelay(fd);
    std::vector<char> buf(size);
    while (recvAll(fd, buf.data(), buf.size())) {
      if (!sendAll(fd, buf.data(), buf.size())) break;
    }
    ::close(fd);
    return 0;
  });
  ::close(lfd);
  const int fd = connectLoopback(port, res.error);
  if (fd < 0) {
    stopChild(child, 1000);
    return res;
  }
  noDelay(fd);
  std::vector<char> buf(size, 'p');
  std::vector<double> rtt;
  const uint64_t warmup = std::min<uint64_t>(samples / 10 + 10, 200);
  for (uint64_t i = 0; i < samples + warmup && !g_interrupted.load(); ++i) {
    const uint64_t t0 = monotonicNs();
    if (!sendAll(fd, buf.data(), buf.size()) || !recvAll(fd, buf.data(), buf.size())) {
      res.error = std::string("plain TCP ping-pong failed: ") + std::strerror(errno);
      break;
    }
    if (i >= warmup) rtt.push_back((monotonicNs() - t0) / 2e3);
  }
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
  if (waitChild(child, 5000) < 0) stopChild(child, 1000);
  res.samples = rtt.size();
  res.p50_us = percentile(rtt, 50);
  res.p99_us = percentile(rtt, 99);
  return res;
}

// ---- gRPC baseline ----

namespace {

constexpr uint64_t kAckEveryBytes = 8ull << 20;

class PipeService final : public framelink::bench::Pipe::Service {
 public:
  grpc::Status Stream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<framelink::bench::Ack, framelink::bench::Chunk>* stream) override {
    framelink::bench::Chunk chunk;
    framelink::bench::Ack ack;
    uint64_t bytes = 0;
    uint64_t messages = 0;
    uint64_t since_ack = 0;
    while (stream->Read(&chunk)) {
      bytes += chunk.payload().size();
      since_ack += chunk.payload().size();
      ++messages;
      if (since_ack >= kAckEveryBytes) {
        since_ack = 0;
        ack.set_bytes(bytes);
        ack.set_messages(messages);
        ack.set_final(false);
        stream->Write(ack);
      }
    }
    ack.set_bytes(bytes);
    ack.set_messages(messages);
    ack.set_final(true);
    stream->Write(ack);
    return grpc::Status::OK;
  }
};

int grpcServerMain() {
  PipeService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "framelink-bench run: cannot start the gRPC baseline server on 127.0.0.1:0\n");
    return 1;
  }
  std::printf("port=%d\n", port);
  std::fflush(stdout);
  // Serve until the parent closes our stdin (or dies).
  char c;
  while (::read(STDIN_FILENO, &c, 1) > 0) {
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

// One stream: writes `size`-byte chunks for `seconds`, returns bytes/messages/seconds as acked
// by the server.
ThroughputResult grpcStream(framelink::bench::Pipe::Stub& stub, uint64_t size, double seconds) {
  ThroughputResult res;
  grpc::ClientContext ctx;
  auto stream = stub.Stream(&ctx);
  framelink::bench::Chunk chunk;
  chunk.mutable_payload()->assign(size, 'g');
  std::atomic<bool> final_seen{false};
  framelink::bench::Ack final_ack;
  uint64_t end_ns = 0;
  std::thread reader([&] {
    framelink::bench::Ack ack;
    while (stream->Read(&ack)) {
      if (ack.final()) {
        end_ns = monotonicNs();
        final_ack = ack;
        final_seen.store(true);
      }
    }
  });
  const uint64_t t0 = monotonicNs();
  const uint64_t deadline = t0 + static_cast<uint64_t>(seconds * 1e9);
  while (monotonicNs() < deadline) {
    if (!stream->Write(chunk)) {
      res.error = "gRPC baseline stream broke while writing";
      break;
    }
  }
  stream->WritesDone();
  reader.join();
  const grpc::Status st = stream->Finish();
  if (!st.ok() && res.error.empty()) res.error = "gRPC baseline stream failed: " + st.error_message();
  if (final_seen.load()) {
    res.bytes = final_ack.bytes();
    res.messages = final_ack.messages();
    res.seconds = (end_ns - t0) / 1e9;
  } else if (res.error.empty()) {
    res.error = "gRPC baseline server never sent its final ack";
  }
  return res;
}

int grpcClientMain(int port, uint64_t size, double seconds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = framelink::bench::Pipe::NewStub(channel);
  // Warm-up: connection setup and HTTP/2 window growth are not what we measure.
  ThroughputResult warm = grpcStream(*stub, size, 0.3);
  if (!warm.error.empty()) {
    std::printf("error=%s\n", warm.error.c_str());
    return 1;
  }
  ThroughputResult r = grpcStream(*stub, size, seconds);
  if (!r.error.empty()) {
    std::printf("error=%s\n", r.error.c_str());
    return 1;
  }
  std::printf("bytes=%llu messages=%llu seconds=%.9f\n", (unsigned long long)r.bytes,
              (unsigned long long)r.messages, r.seconds);
  return 0;
}

// Starts `framelink <args...>` with its stdout on a pipe (and, if stdin_fd is given, its stdin on
// another pipe whose write end is returned there).
pid_t spawnSelf(const std::vector<std::string>& args, int& stdout_fd, int* stdin_fd) {
  int out[2];
  int in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0) return -1;
  if (stdin_fd != nullptr && pipe2(in, O_CLOEXEC) != 0) return -1;
  const std::string exe = selfExe();
  std::vector<std::string> full = {exe};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(full.size() + 1);
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    if (stdin_fd != nullptr) dup2(in[0], STDIN_FILENO);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  ::close(out[1]);
  stdout_fd = out[0];
  if (stdin_fd != nullptr) {
    ::close(in[0]);
    *stdin_fd = in[1];
  }
  return pid;
}

std::string readAll(int fd) {
  std::string s;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) s.append(buf, static_cast<size_t>(n));
  }
  return s;
}

std::string readLine(int fd) {
  std::string s;
  char c;
  while (true) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    s += c;
  }
  return s;
}

}  // namespace

ThroughputResult plainGrpcThroughput(uint64_t size, double seconds) {
  ThroughputResult res;
  int server_out = -1;
  int server_in = -1;
  const pid_t server = spawnSelf({"__bench-grpc-server"}, server_out, &server_in);
  if (server < 0) {
    res.error = std::string("cannot start the gRPC baseline server: ") + std::strerror(errno);
    return res;
  }
  const std::string line = readLine(server_out);
  ::close(server_out);
  if (line.rfind("port=", 0) != 0) {
    res.error = "the gRPC baseline server did not report its port";
    ::close(server_in);
    stopChild(server, 2000);
    return res;
  }
  const std::string port = line.substr(5);
  int client_out = -1;
  const pid_t client = spawnSelf({"__bench-grpc-client", "--port", port, "--size", std::to_string(size),
                                  "--seconds", std::to_string(seconds)},
                                 client_out, nullptr);
  const std::string out = client >= 0 ? readAll(client_out) : std::string();
  if (client >= 0) {
    ::close(client_out);
    waitChild(client, -1);
  }
  ::close(server_in);  // tells the server to shut down
  if (waitChild(server, 5000) < 0) stopChild(server, 1000);
  unsigned long long bytes = 0, messages = 0;
  double secs = 0;
  if (std::sscanf(out.c_str(), "bytes=%llu messages=%llu seconds=%lf", &bytes, &messages, &secs) == 3) {
    res.bytes = bytes;
    res.messages = messages;
    res.seconds = secs;
  } else {
    res.error = out.rfind("error=", 0) == 0 ? out.substr(6) : "the gRPC baseline client failed";
    while (!res.error.empty() && res.error.back() == '\n') res.error.pop_back();
  }
  return res;
}

void keepFreedMemoryLikeTheDaemon() {
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

void addBenchHelperCommands(CLI::App& app, int& exit_code) {
  auto* server = app.add_subcommand("__bench-grpc-server", "");  // empty description: hidden
  server->group("");
  server->callback([&exit_code] {
    keepFreedMemoryLikeTheDaemon();
    exit_code = grpcServerMain();
  });
  auto* client = app.add_subcommand("__bench-grpc-client", "");
  client->group("");
  auto port = std::make_shared<int>(0);
  auto size = std::make_shared<uint64_t>(0);
  auto seconds = std::make_shared<double>(1.0);
  client->add_option("--port", *port)->required();
  client->add_option("--size", *size)->required();
  client->add_option("--seconds", *seconds);
  client->callback([&exit_code, port, size, seconds] {
    keepFreedMemoryLikeTheDaemon();
    exit_code = grpcClientMain(*port, *size, *seconds);
  });
}

}  // namespace framelink::cli
