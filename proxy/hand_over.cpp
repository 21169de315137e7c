#include "hand_over.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <utility>

#include "attach/segment.h"
#include "framelink/framelink.h"
#include "framelink/v1/hand_over.pb.h"

namespace framelink {

namespace {

constexpr const char* kListenerName = "framelink.listen";
// The state is written by a daemon of this host for the next one: a bound
// against a corrupt store, not a limit a real daemon comes near.
constexpr uint64_t kMaxStateBytes = uint64_t{64} * 1024 * 1024;

std::string clientFdName(uint64_t id, const char* what) {
  return "framelink." + std::to_string(id) + "." + what;
}

// A dup of `fd` named `name`; false when out of descriptors.
bool addDup(std::vector<NamedFd>& out, std::string name, int fd) {
  UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy.valid()) return false;
  out.push_back(NamedFd{std::move(name), std::move(copy)});
  return true;
}

void describeClient(const ClientSession& s, const std::vector<uint32_t>& held, v1::HandOverClient& out) {
  out.set_id(s.id);
  out.set_role(s.role);
  out.set_stream(s.stream);
  out.set_subscriber(s.subscriber);
  out.set_pull(s.pull);
  out.set_name(s.name);
  out.set_pid(s.pid);
  out.set_uid(s.uid);
  out.set_gid(s.gid);
  out.set_slot_count(s.segments->slotCount());
  out.set_slot_size(s.segments->slotSize());
  out.set_hugepages(s.segments->onHugepages());
  for (uint32_t slot : held) out.add_held_slots(slot);
  out.set_frames(s.frames);
  out.set_bytes(s.bytes);
  out.set_errors(s.errors);
}

Result<UniqueFd> stateMemfd(const std::string& bytes) {
  UniqueFd fd(::memfd_create("framelink-state", MFD_CLOEXEC));
  if (!fd.valid()) return makeError(FL_ERR_RESOURCES, "memfd_create for the hand-over state failed");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd.get(), bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n <= 0) return makeError(FL_ERR_RESOURCES, "writing the hand-over state failed");
    done += static_cast<size_t>(n);
  }
  return fd;
}

Result<std::string> readState(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 0 || static_cast<uint64_t>(st.st_size) > kMaxStateBytes) {
    return makeError(FL_ERR_BAD_REQUEST, "the hand-over state is not a file of a sane size");
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n <= 0) return makeError(FL_ERR_BAD_REQUEST, "reading the hand-over state failed");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

// One client's session from its record and descriptors (taken out of `by_name`).
Result<InheritedClient> adoptClient(const v1::HandOverClient& rec, std::map<std::string, UniqueFd>& by_name) {
  auto take = [&](const char* what) {
    auto it = by_name.find(clientFdName(rec.id(), what));
    if (it == by_name.end()) return UniqueFd();
    UniqueFd fd = std::move(it->second);
    by_name.erase(it);
    return fd;
  };
  InheritedClient out;
  out.socket = take("socket");
  UniqueFd control = take("control");
  UniqueFd data = take("data");
  UniqueFd submit = take("submit");
  UniqueFd completion = take("completion");
  UniqueFd reader = take("reader");
  if (!out.socket.valid() || !control.valid() || !data.valid() || !submit.valid() || !completion.valid() ||
      !reader.valid()) {
    return makeError(FL_ERR_BAD_REQUEST, "some of its descriptors are missing");
  }
  if (rec.role() != FL_ROLE_PRODUCER && rec.role() != FL_ROLE_CONSUMER) {
    return makeError(FL_ERR_BAD_REQUEST, "its role is neither producer nor consumer");
  }
  ClientSegments::Adopted expect{rec.role(), rec.slot_count(), rec.slot_size(), rec.hugepages(), rec.id()};
  auto segments = ClientSegments::adopt(std::move(control), std::move(data), expect);
  if (!segments) return std::move(segments).error();
  auto s = std::make_shared<ClientSession>();
  s->id = rec.id();
  s->role = rec.role();
  s->stream = rec.stream();
  s->subscriber = rec.subscriber();
  s->pull = rec.pull();
  s->name = rec.name();
  s->pid = rec.pid();
  s->uid = rec.uid();
  s->gid = rec.gid();
  s->segments = std::move(segments.value());
  s->submit_doorbell = std::move(submit);
  s->completion_doorbell = std::move(completion);
  s->completion_reader = std::move(reader);
  s->ring_capacity = s->segments->geometry().ring_capacity;
  s->slots.resize(rec.slot_count());
  for (uint32_t slot : rec.held_slots()) {
    // Its frame's origin is this daemon's no more: the release only frees the slot.
    if (s->role == FL_ROLE_CONSUMER && slot < s->slots.size()) s->slots[slot].state = SlotState::kDelivered;
  }
  s->frames = rec.frames();
  s->bytes = rec.bytes();
  s->errors = rec.errors();
  out.session = std::move(s);
  return out;
}

}  // namespace

Result<std::vector<NamedFd>> packHandOver(int listen_fd, const std::string& socket_path,
                                          uint64_t next_client_id,
                                          const std::vector<DataAgent::HandedClient>& clients) {
  v1::HandOver state;
  state.set_format(kHandOverFormat);
  state.set_daemon_version(fl_version());
  state.set_next_client_id(next_client_id);
  state.set_socket_path(socket_path);
  std::vector<NamedFd> out;
  out.reserve(2 + clients.size() * 6);
  out.push_back(NamedFd{kHandOverStateName, UniqueFd()});  // filled last
  if (!addDup(out, kListenerName, listen_fd)) return makeError(FL_ERR_RESOURCES, "out of file descriptors");
  for (const auto& handed : clients) {
    const ClientSession& s = *handed.session;
    const bool ok = addDup(out, clientFdName(s.id, "socket"), s.socket.get()) &&
                    addDup(out, clientFdName(s.id, "control"), s.segments->controlFd()) &&
                    addDup(out, clientFdName(s.id, "data"), s.segments->dataFd()) &&
                    addDup(out, clientFdName(s.id, "submit"), s.submit_doorbell.get()) &&
                    addDup(out, clientFdName(s.id, "completion"), s.completion_doorbell.get()) &&
                    addDup(out, clientFdName(s.id, "reader"), s.completion_reader.get());
    if (!ok) return makeError(FL_ERR_RESOURCES, "out of file descriptors");
    describeClient(s, handed.held_slots, *state.add_clients());
  }
  auto memfd = stateMemfd(state.SerializeAsString());
  if (!memfd) return std::move(memfd).error();
  out.front().fd = std::move(memfd.value());
  return out;
}

Inherited unpackHandOver(std::vector<NamedFd> fds, const std::string& socket_path) {
  Inherited out;
  std::map<std::string, UniqueFd> by_name;
  for (auto& named : fds) by_name[named.name] = std::move(named.fd);  // a name given twice: the last
  auto state_fd = by_name.find(kHandOverStateName);
  if (state_fd == by_name.end()) return out;
  v1::HandOver state;
  auto bytes = readState(state_fd->second.get());
  if (!bytes || !state.ParseFromString(bytes.value())) {
    out.left.emplace_back("the hand-over state cannot be read: every client attaches again");
    return out;
  }
  if (state.format() == 0 || state.format() > kHandOverFormat) {
    out.left.push_back("the hand-over state is of format " + std::to_string(state.format()) +
                       ", newer than this framelinkd reads (" + std::to_string(kHandOverFormat) +
                       "): every client attaches again");
    return out;
  }
  if (state.socket_path() != socket_path) {
    out.left.push_back("the daemon before served " + state.socket_path() + ", this one " + socket_path +
                       ": every client attaches again");
    return out;
  }
  if (auto listener = by_name.find(kListenerName); listener != by_name.end()) {
    out.listener = std::move(listener->second);
  }
  out.next_client_id = state.next_client_id();
  for (const auto& rec : state.clients()) {
    auto client = adoptClient(rec, by_name);
    if (!client) {
      out.left.push_back("client " + std::to_string(rec.id()) + " (pid " + std::to_string(rec.pid()) +
                         ", stream '" + rec.stream() + "'): " + client.error().message);
      continue;
    }
    out.clients.push_back(std::move(client.value()));
  }
  return out;
}

}  // namespace framelink
