#include "admin.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "framelink/attach_proto.h"
#include "framelink/framelink.h"
#include "framelink/status_name.hpp"

namespace framelink::cli {

namespace {

AdminReply failure(int status, std::string message, std::string hint = {}) {
  AdminReply r;
  r.status = status;
  r.error = std::move(message);
  r.hint = std::move(hint);
  return r;
}

// Columns padded to their widest cell; the last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  // Cells hold names applications and peers chose: a control byte (an
  // escape sequence for the operator's terminal) is shown as '?'.
  void add(std::vector<std::string> row) {
    for (auto& cell : row) {
      for (char& ch : cell) {
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
      }
    }
    rows_.push_back(std::move(row));
  }
  std::string str() const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
      if (width.size() < row.size()) width.resize(row.size(), 0);
      for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

uint64_t u64(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  return it->get<uint64_t>();
}

std::string str(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

const Json& member(const Json& j, const char* key) {
  static const Json kEmpty = Json::object();
  auto it = j.find(key);
  return it == j.end() ? kEmpty : *it;
}

const Json& counters(const Json& snapshot) { return member(member(snapshot, "metrics"), "counters"); }
const Json& detail(const Json& snapshot) { return member(member(snapshot, "metrics"), "detail"); }

// The counters `stats` shows, in order, and whether they are bytes.
struct Shown {
  const char* key;
  const char* label;
  bool bytes;
};
constexpr Shown kShown[] = {
    {"frames_submitted", "frames submitted", false},     {"frames_delivered", "frames delivered", false},
    {"frames_failed", "frames failed", false},           {"bytes_sent", "bytes sent", true},
    {"frames_received", "frames received", false},       {"frames_released", "frames released", false},
    {"bytes_received", "bytes received", true},          {"frames_replayed", "frames replayed", false},
    {"duplicates_dropped", "duplicates dropped", false}, {"nacks_sent", "frames refused (NACK)", false},
    {"bad_descriptors", "bad descriptors", false},       {"clients_attached", "clients attached", false},
    {"clients_detached", "clients detached", false},     {"link_failures", "links ended", false},
    {"auth_failures", "peers refused", false},           {"admin_requests", "admin requests", false},
    {"admin_refused", "admin refused", false},
};

double rate(const Json& now, const Json* before, const char* key, double seconds) {
  if (before == nullptr || seconds <= 0) return -1;
  const uint64_t a = u64(counters(*before), key), b = u64(counters(now), key);
  return b >= a ? static_cast<double>(b - a) / seconds : 0;  // a restarted daemon counts from 0 again
}

}  // namespace

std::string resolveSocket(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("FRAMELINK_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  return FL_DEFAULT_SOCKET_PATH;
}

namespace {

// A descriptor, closed when its owner goes.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// What one recvmsg brought: the bytes, the descriptors passed along (closed with it), errno.
struct RawReply {
  RawReply() = default;
  ~RawReply() {
    for (int f : fds) ::close(f);
  }
  RawReply(const RawReply&) = delete;
  RawReply& operator=(const RawReply&) = delete;

  // Larger than either reply kind, so a daemon of another version shows as a size mismatch.
  union {
    fl_admin_reply admin;
    fl_attach_reply attach;
    char bytes[sizeof(fl_attach_reply) + sizeof(fl_admin_reply)];
  } buf{};
  ssize_t n = -1;
  int err = 0;
  std::vector<int> fds;
};

// Connects `fd` to the daemon at `socket`; the failure, with what to do about it, if any.
std::optional<AdminReply> connectAdmin(int fd, const sockaddr_un& addr, const std::string& socket,
                                       int timeout_ms) {
  // Bounds the connect (a full backlog), the send and the reply alike.
  timeval tv{timeout_ms / 1000, static_cast<suseconds_t>(timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return std::nullopt;
  const int err = errno;
  if (err == EACCES || err == EPERM) {
    return failure(FL_ERR_DAEMON_UNREACHABLE,
                   "cannot connect to framelinkd at " + socket + ": " + strerror(err),
                   "this user needs to be in the socket's group (usually 'framelink'; framelink doctor says "
                   "which) or to run this as root");
  }
  if (err == EAGAIN || err == ETIMEDOUT) {
    return failure(FL_ERR_DAEMON_UNREACHABLE, "framelinkd at " + socket + " did not accept within " +
                                                  std::to_string(timeout_ms) +
                                                  " ms (overloaded? see its log)");
  }
  return failure(FL_ERR_DAEMON_UNREACHABLE,
                 "cannot connect to framelinkd at " + socket + ": " + strerror(err),
                 "is it running (systemctl status framelinkd)? if it listens elsewhere, pass --socket or set "
                 "FRAMELINK_SOCKET");
}

// Sends the request (FL_ADMIN_SNAPSHOT, FL_ADMIN_RELOAD); the failure, if any.
std::optional<AdminReply> sendAdminRequest(int fd, const std::string& socket, uint32_t command) {
  fl_admin_request req{};
  req.magic = FL_ADMIN_MAGIC;
  req.version = FL_ADMIN_VERSION;
  req.command = command;
  if (::send(fd, &req, sizeof(req), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(req))) return std::nullopt;
  return failure(FL_ERR_DAEMON_UNREACHABLE,
                 "cannot send the admin request to framelinkd at " + socket + ": " + strerror(errno));
}

// Waits for the answer and takes the descriptors that came with it.
void receiveReply(int fd, RawReply& raw) {
  union {
    cmsghdr align;
    char bytes[CMSG_SPACE(sizeof(int) * 8)];
  } control{};
  iovec iov{&raw.buf, sizeof(raw.buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.bytes;
  msg.msg_controllen = sizeof(control.bytes);
  do {
    raw.n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (raw.n < 0 && errno == EINTR);
  raw.err = errno;
  if (raw.n < 0) return;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int f = -1;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      raw.fds.push_back(f);
    }
  }
}

// The failure when no answer came: a timeout, an error, or the connection closed.
std::optional<AdminReply> noAnswerFailure(const RawReply& raw, const std::string& socket, int timeout_ms) {
  if (raw.n < 0) {
    if (raw.err == EAGAIN || raw.err == EWOULDBLOCK) {
      return failure(FL_ERR_DAEMON_UNREACHABLE, "framelinkd at " + socket + " did not answer within " +
                                                    std::to_string(timeout_ms) +
                                                    " ms (overloaded? see its log)");
    }
    return failure(FL_ERR_DAEMON_UNREACHABLE,
                   "cannot read the answer of framelinkd at " + socket + ": " + strerror(raw.err));
  }
  if (raw.n == 0) {
    return failure(FL_ERR_DAEMON_UNREACHABLE,
                   "framelinkd at " + socket + " closed the connection without answering (see its log)");
  }
  return std::nullopt;
}

// The failure the answer shows, if any: another program or protocol version, the daemon's refusal,
// or not exactly one snapshot descriptor.
std::optional<AdminReply> answerFailure(RawReply& raw, const std::string& socket) {
  const auto n = static_cast<size_t>(raw.n);
  auto& buf = raw.buf;
  if (n >= 8 && buf.attach.magic == FL_ATTACH_MAGIC) {
    buf.attach.message[FL_ATTACH_MESSAGE_MAX - 1] = '\0';
    return failure(FL_ERR_VERSION, "framelinkd at " + socket +
                                       " does not know admin requests (it predates this framelink tool; it "
                                       "answered: " +
                                       buf.attach.message + "); upgrade framelinkd");
  }
  if (n < 8 || buf.admin.magic != FL_ADMIN_MAGIC) {
    return failure(FL_ERR_VERSION,
                   socket + " did not answer with a framelink admin reply: is it framelinkd?");
  }
  if (buf.admin.version != FL_ADMIN_VERSION || n != sizeof(fl_admin_reply)) {
    return failure(FL_ERR_VERSION, "framelinkd at " + socket + " speaks admin protocol version " +
                                       std::to_string(buf.admin.version) + ", this tool " +
                                       std::to_string(FL_ADMIN_VERSION) + ": install matching versions");
  }
  buf.admin.message[FL_ATTACH_MESSAGE_MAX - 1] = '\0';
  if (buf.admin.status != FL_OK) return failure(buf.admin.status, buf.admin.message);
  if (raw.fds.size() != 1 || buf.admin.json_size > FL_ADMIN_JSON_MAX) {
    return failure(FL_ERR_VERSION, "framelinkd sent " + std::to_string(raw.fds.size()) +
                                       " descriptors and a " + std::to_string(buf.admin.json_size) +
                                       "-byte snapshot; expected one of at most " +
                                       std::to_string(FL_ADMIN_JSON_MAX) + " (version skew?)");
  }
  return std::nullopt;
}

// Reads the `size`-byte snapshot from the sealed memfd the daemon passed, and parses it.
AdminReply readSnapshot(int memfd, uint64_t size) {
  struct stat st {};
  if (::fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != size) {
    return failure(FL_ERR_VERSION,
                   "the snapshot framelinkd sent is not the announced " + std::to_string(size) + " bytes");
  }
  std::string text(size, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::pread(memfd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return failure(FL_ERR_RESOURCES, std::string("cannot read the snapshot: ") + strerror(errno));
    got += static_cast<size_t>(r);
  }
  AdminReply reply;
  try {
    reply.snapshot = Json::parse(text);
  } catch (const Json::exception& e) {
    return failure(FL_ERR_VERSION, std::string("framelinkd sent a snapshot that is not JSON: ") + e.what());
  }
  return reply;
}

}  // namespace

AdminReply fetchSnapshot(const std::string& socket, int timeout_ms, uint32_t command) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.empty() || socket.size() >= sizeof(addr.sun_path)) {
    return failure(FL_EINVAL, "socket path '" + socket + "' is empty or longer than " +
                                  std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);
  const Fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    return failure(FL_ERR_RESOURCES, std::string("cannot create a Unix socket: ") + strerror(errno));
  }
  if (auto f = connectAdmin(fd.get(), addr, socket, timeout_ms)) return std::move(*f);
  if (auto f = sendAdminRequest(fd.get(), socket, command)) return std::move(*f);
  RawReply raw;
  receiveReply(fd.get(), raw);
  if (auto f = noAnswerFailure(raw, socket, timeout_ms)) return std::move(*f);
  if (auto f = answerFailure(raw, socket)) return std::move(*f);
  return readSnapshot(raw.fds[0], raw.buf.admin.json_size);
}

std::string formatDuration(double seconds) {
  if (seconds < 0) seconds = 0;
  char buf[48];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  } else {
    const auto total = static_cast<uint64_t>(seconds);
    const uint64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
    if (h > 0) {
      std::snprintf(buf, sizeof buf, "%lluh%02llum%02llus", (unsigned long long)h, (unsigned long long)m,
                    (unsigned long long)s);
    } else {
      std::snprintf(buf, sizeof buf, "%llum%02llus", (unsigned long long)m, (unsigned long long)s);
    }
  }
  return buf;
}

std::string formatByteRate(double bytes, double seconds) {
  if (seconds <= 0 || bytes < 0) return "-";
  return formatBytes(static_cast<uint64_t>(std::llround(bytes / seconds))) + "/s";
}

std::string formatRtt(uint64_t rtt_ns) {
  if (rtt_ns == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(rtt_ns) / 1e6);
  return buf;
}

Json statsJson(const Json& now, const Json* before, double seconds) {
  Json out;
  out["daemon"] = member(now, "daemon");
  out["counters"] = counters(now);
  out["failed_by_status"] = member(member(now, "metrics"), "failed_by_status");
  Json rates = Json::object();
  if (before != nullptr && seconds > 0) {
    for (const auto& [key, value] : counters(now).items()) {
      if (key == "links_up") continue;  // a gauge
      rates[key] = rate(now, before, key.c_str(), seconds);
    }
  }
  out["rates_per_s"] = rates;
  out["interval_s"] = before != nullptr ? seconds : 0.0;
  out["clients"] = member(detail(now), "clients").size();
  out["links"] = member(detail(now), "links").size();
  return out;
}

std::string formatStats(const Json& now, const Json* before, double seconds) {
  const Json& d = member(now, "daemon");
  const double uptime = static_cast<double>(realtimeNs() - u64(d, "start_ns")) / 1e9;
  std::string out = "framelinkd '" + str(d, "id") + "' pid " + std::to_string(u64(d, "pid")) + ", version " +
                    str(d, "version") + ", up " + formatDuration(uptime) + ", socket " + str(d, "socket") +
                    "\n";
  size_t producers = 0, consumers = 0;
  for (const auto& c : member(detail(now), "clients")) {
    (str(c, "role") == "producer" ? producers : consumers)++;
  }
  out += "clients: " + std::to_string(producers) + " producer(s), " + std::to_string(consumers) +
         " consumer(s); links up: " + std::to_string(u64(counters(now), "links_up")) + "\n\n";
  Table t({"COUNTER", "TOTAL", before != nullptr ? "PER SECOND" : "PER SECOND (next refresh)"});
  for (const auto& s : kShown) {
    const uint64_t total = u64(counters(now), s.key);
    const double r = rate(now, before, s.key, seconds);
    std::string rs = "-";
    if (r >= 0) {
      if (s.bytes) {
        rs = formatByteRate(r, 1.0);
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f", r);
        rs = buf;
      }
    }
    t.add({s.label, s.bytes ? formatBytes(total) : std::to_string(total), rs});
  }
  out += t.str();
  const Json& failed = member(member(now, "metrics"), "failed_by_status");
  if (!failed.empty()) {
    out += "\nfailed frames by reason:\n";
    for (const auto& [code, n] : failed.items()) {
      out += "  " + statusName(std::atoi(code.c_str())) + ": " +
             std::to_string(n.is_number() ? n.get<uint64_t>() : 0) + "\n";
    }
  }
  return out;
}

std::string formatClients(const Json& snapshot) {
  const Json& clients = member(detail(snapshot), "clients");
  if (clients.empty()) return "no clients attached\n";
  // A reader's lag: the frames it holds, and for a subscriber those that
  // wait here for one of its slots.  DROPPED (drop streams): a subscriber's
  // frames it was skipped for, a producer's subscribers its frames skipped.
  Table t({"ID", "PID", "UID", "ROLE", "STREAM", "SLOTS", "IN FLIGHT", "LAG", "DROPPED", "FRAMES", "BYTES",
           "ERRORS", "NAME"});
  for (const auto& c : clients) {
    const bool producer = str(c, "role") == "producer";
    t.add({std::to_string(u64(c, "id")), std::to_string(u64(c, "pid")), std::to_string(u64(c, "uid")),
           str(c, "role") + (str(c, "delivery") == "pull" ? " (pull)" : "") +
               (c.value("gone", false) ? " (gone)" : ""),
           str(c, "stream"), std::to_string(u64(c, "slots")) + " x " + formatBytes(u64(c, "slot_size")),
           std::to_string(u64(c, "in_flight")),
           producer ? "-" : std::to_string(u64(c, "in_flight") + u64(c, "waiting")),
           std::to_string(u64(c, "dropped")), std::to_string(u64(c, "frames")), formatBytes(u64(c, "bytes")),
           std::to_string(u64(c, "errors")), str(c, "name")});
  }
  return t.str();
}

Json linkRows(const Json& snapshot) {
  Json rows = Json::array();
  const Json& links = member(detail(snapshot), "links");
  // The last problem with each peer, on each of its rows: why a peer is
  // down (or was, until its link came back).
  const Json& problems = member(member(snapshot, "metrics"), "peer_problems");
  auto withProblem = [&problems](Json row) {
    const Json& p = member(problems, str(row, "peer").c_str());
    row["last_error"] = str(p, "last_error");
    row["last_error_ns"] = u64(p, "last_error_ns");
    return row;
  };
  for (const auto& l : links) rows.push_back(withProblem(l));
  // Configured peers with no link up are shown too: that they are down is
  // what an operator looks for.
  for (const auto& p : member(snapshot, "peers")) {
    bool up = false;
    for (const auto& l : links) up = up || str(l, "peer") == str(p, "name");
    if (up) continue;
    rows.push_back(withProblem(Json{{"peer", str(p, "name")},
                                    {"address", str(p, "address")},
                                    {"state", "down"},
                                    {"transport", ""},
                                    {"transport_reason", "not connected (the daemon keeps dialing)"},
                                    {"rtt_ns", 0},
                                    {"in_flight", 0},
                                    {"pending", 0},
                                    {"replayed", 0},
                                    {"frames_in", 0},
                                    {"frames_out", 0}}));
  }
  return rows;
}

std::string formatLinks(const Json& snapshot) {
  const Json rows = linkRows(snapshot);
  if (rows.empty()) return "no peers configured and no links up\n";
  // PULLED: streams this daemon pulls from the peer / the peer pulls from it.
  Table t({"PEER", "ADDRESS", "STATE", "UP FOR", "TRANSPORT", "RTT", "IN FLIGHT", "WAITING", "REPLAYS",
           "FRAMES OUT", "FRAMES IN", "PULLED IN/OUT", "WHY THIS TRANSPORT", "LAST ERROR"});
  for (const auto& l : rows) {
    const uint64_t since = u64(l, "up_since_ns");
    const uint64_t now = realtimeNs();
    const uint64_t error_at = u64(l, "last_error_ns");
    const std::string last_error =
        str(l, "last_error").empty()
            ? "-"
            : (error_at != 0 && now > error_at
                   ? formatDuration(static_cast<double>(now - error_at) / 1e9) + " ago: "
                   : std::string()) +
                  str(l, "last_error");
    t.add({str(l, "peer"), str(l, "address").empty() ? "-" : str(l, "address"), str(l, "state"),
           since != 0 && now > since ? formatDuration(static_cast<double>(now - since) / 1e9) : "-",
           str(l, "transport").empty() ? "-" : str(l, "transport"), formatRtt(u64(l, "rtt_ns")),
           std::to_string(u64(l, "in_flight")), std::to_string(u64(l, "pending")),
           std::to_string(u64(l, "replayed")), std::to_string(u64(l, "frames_out")),
           std::to_string(u64(l, "frames_in")),
           str(l, "state") == "down"
               ? "-"
               : std::to_string(u64(l, "pulled_in")) + "/" + std::to_string(u64(l, "pulled_out")),
           !str(l, "transport_reason").empty() ? str(l, "transport_reason")
           : str(l, "state") == "down"         ? "-"
                                               : "first choice",
           last_error});
  }
  return t.str();
}

}  // namespace framelink::cli
