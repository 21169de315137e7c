// The simulated world of sim_world.h: the daemons (their real data agents),
// the applications attached to them, the links between them, and what the
// world remembers of every frame to check the promises against.  Events and
// links are in sim_world.cpp; settling after each event and the checks of
// every completion and delivery, and the healing at the end, in
// world_checks.cpp.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/agent_clock.h"
#include "agent/data_agent.h"
#include "agent/session_writer.h"
#include "attach/client_session.h"
#include "attach/segment.h"
#include "config/config.h"
#include "framelink/framelink.h"
#include "metrics/metrics.h"
#include "sim_link_end.h"
#include "sim_world.h"
#include "transport/loopback/loopback_transport.h"

namespace framelink::sim {

using transport::loopback::LoopbackLink;
using transport::loopback::LoopbackPair;

constexpr uint32_t kSlots = 32;       // a quarter window (8) is more than one release, so ACKs are held back
constexpr uint32_t kFewSlots = 2;     // a drop stream's slow subscriber (kSlots for everyone else)
constexpr uint64_t kSlotSize = 1024;  // four slots a page: 32 slots fault in few pages
constexpr uint64_t kSmallSlotSize = 256;  // a second consumer with small slots
constexpr size_t kMaxRounds = 200;
constexpr uint32_t kCreditTimeoutMs = 2000;
constexpr uint32_t kAckTimeoutMs = 3000;
// Odd seeds hold ACKs and credits back for coalescing this long (even
// seeds: none, every release goes at the end of its round).
constexpr uint32_t kAckDelayUs = 100;
// d1 is the daemon of the consumers; d0 (and d2) dial it and send.  In a
// two-receiver world one more daemon (the last) receives too: every sender
// routes the stream to both, and each frame goes to each.
constexpr int kFirstReceiver = 1;
const char* const kStream = "cam";

// A broken invariant or a stuck world: ends the schedule.
struct Broken {
  std::string what;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  bool chance(unsigned percent) { return below(100) < percent; }

 private:
  uint64_t state_;
};

inline uint8_t patternByte(uint64_t frame, uint64_t i) {
  return static_cast<uint8_t>((frame * 0x9E37 + i * 13) >> 3);
}

// What one agent writes on one session, as it writes it (the writer runs
// on the agent's thread: no thread hand-off, the same order every run).
class Capture {
 public:
  explicit Capture(std::function<void()> cancel) : cancel_(std::move(cancel)) {
    writer_ = std::make_shared<SessionWriter>(
        [this](const v1::PeerMessage& m, bool) {
          messages_.push_back(m);
          return true;
        },
        SessionWriter::Inline{});
  }
  ~Capture() { writer_->close(); }

  PeerSession session() const { return PeerSession{writer_, cancel_}; }

  std::vector<v1::PeerMessage> take() { return std::exchange(messages_, {}); }

 private:
  std::function<void()> cancel_;
  std::vector<v1::PeerMessage> messages_;
  std::shared_ptr<SessionWriter> writer_;
};

// One simulated application attached to a daemon.
struct App {
  uint64_t id = 0;
  uint32_t role = FL_ROLE_PRODUCER;
  int daemon = 0;
  uint64_t instance = 0;  // of its daemon when it attached
  uint64_t slot_size = kSlotSize;
  bool alive = true;
  bool subscriber = false;  // consumer: every frame of the stream (else a queue group member)
  std::shared_ptr<ClientSession> session;
  std::vector<uint64_t> in_slot = std::vector<uint64_t>(kSlots, 0);    // frame per slot (0: free)
  std::vector<uint64_t> in_length = std::vector<uint64_t>(kSlots, 0);  // consumer: of the frame in each slot
  std::map<int, uint64_t> last_plain;  // consumer: the last frame in order, per sender
  // Consumer: its end of the attach socket, where lent segments arrive, and
  // the lend ids it was sent (the producers' client ids).
  UniqueFd lend_socket;
  std::map<uint64_t, bool> lent;
  uint64_t gaps = 0;  // subscriber of a drop stream: the frames its gap notices said it missed
};

struct Daemon {
  std::string id;
  uint64_t instance = 0;
  Config config;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<DataAgent> agent;
};

struct Link {
  uint64_t id = 0;
  int sender = 0;                 // the dialing daemon
  int receiver = kFirstReceiver;  // the listening one
  bool up = true;
  // The dialer ended its session and dialed again; the listener has not
  // noticed yet (a half-open connection, until its keepalive ends it).
  bool dialer_gone = false;
  LoopbackPair pair;
  std::shared_ptr<SimLinkEnd> end[2];   // wrap pair.a and pair.b, which the link keeps alive
  std::unique_ptr<Capture> capture[2];  // what each end's agent writes
  std::deque<std::shared_ptr<v1::PeerMessage>> in_flight[2];  // written by end i, not yet read
  bool cancelled = false;
  uint64_t stream_id = 0;  // the sender's stream, as its last StreamOpen on the session said (0: none yet)
};

// A consumer's release of a frame: on which daemon, and which instance of it.
struct Release {
  int daemon = 0;
  uint64_t instance = 0;
};

struct FrameRecord {
  uint64_t producer = 0;
  int sender = 0;
  bool outcome_known = false;
  int status = 0;
  std::vector<Release> released_on;          // where a consumer released it
  std::vector<uint64_t> instance_at_submit;  // of each daemon, when it was submitted
  std::map<uint64_t, int> receptions_on;     // by each daemon instance's readers, all told
  // Ended FAILED: the receiving daemons whose route may have failed it (not
  // released on their live instance then).  The others may still release it.
  std::vector<int> may_have_failed;
  std::map<int, int> member_receptions;           // by each daemon's queue group
  std::map<uint64_t, int> subscriber_receptions;  // by each subscriber
  bool reader_died_holding = false;               // a reader was killed holding it: it may fail
  // A consumer it landed in was killed (holding it or not) while a subscriber on that daemon had
  // not got it yet: that subscriber never can (the lend was of the lander's slot), and the frame
  // may fail FL_ERR_NO_CONSUMER, as one that no reader's free slot came for in time.
  bool lander_went_first = false;
  std::set<uint64_t> got_by;  // the consumers (and subscribers) it reached, by app id
  int held = 0;               // live readers holding it now: its ACK waits for each
  // A reader on the sender's own daemon got it beside the receiver's: its
  // completion waits for that reader too, so the peer's outcome may have
  // been decided long before the completion says it.
  bool read_beside = false;
  int landings = 0;              // times the frame crossed a data link (a resend after a NACK crosses again)
  uint64_t first_landed_ns = 0;  // its ACK deadline is at least ack_timeout after this
  uint64_t submitted_ns = 0;     // no route of it times out before credit_timeout after this
};

class World {
 public:
  World(const SimOptions& options, SimResult& result);
  ~World();
  void run();

 private:
  // ---------------------------------------------------------------- events
  void oneEvent();
  void boot(int d);
  void attach(int d, uint32_t role, uint64_t slot_size, bool subscriber = false);
  size_t countApps(uint32_t role, int daemon = -1) const;
  std::vector<int> senders() const;
  bool isReceiver(int d) const;
  // One of the receiving daemons (with one, no draw: single-receiver
  // schedules stay as they were).
  int pickReceiver();
  // The daemon at one end of a link: 0 the sender, 1 the receiver.
  static int daemonAt(const Link& link, int end) { return end == 0 ? link.sender : link.receiver; }
  App* pickApp(uint32_t role);
  void killApp(uint32_t role);
  void markLanderGone(const App& app);
  void submit();
  void submitFrom(App& producer);
  void consume(uint64_t n);
  void release(App& c, uint32_t slot);

  // ---------------------------------------------------------------- links
  std::vector<Link*> upLinks();
  Link* liveLink(int sender, int receiver);
  void replaceLink(Link& old);
  void linkUp(int sender, int receiver);
  // Every sender has a live link to every receiver (one dialed where none is).
  void linkEveryPair();
  void breakLink(Link& link, const std::string& why);
  void deliverControl(Link& link, int from, size_t n);
  void deliverData(Link& link, uint64_t n, bool damage);
  void crash(int d);
  void countLanding(uint64_t frame);

  // ---------------------------------------------------------------- doubt (world_doubt.cpp)
  void doubtEvent(uint64_t r);
  void tick();
  void keepaliveEnds();
  void healthyPeriod();
  void requireReleasedDelivered(const char* when);
  bool releasedOnLive(const FrameRecord& rec, int receiver) const;
  // Released on the live instance of every receiving daemon: each route has
  // delivered it (and is owed its ACK).
  bool releasedOnEveryLiveReceiver(const FrameRecord& rec) const;
  bool owed(const FrameRecord& rec) const;
  void checkTimeout(uint64_t frame, const FrameRecord& rec, int status) const;

  // ---------------------------------------------------------------- adversary (world_adversary.cpp)
  void forge();
  // Pull: answers to reads come late (after the stream closed, or moved to
  // a newer link) or twice.  False when the link offers no occasion for it.
  bool forgeRead(Link& link, uint64_t kind);
  // The sender lies that it closed its stream on the link (with reads out),
  // and opens it again at once.
  void closeAndReopen(Link& link);
  // A frame of `sender` released on the live `receiver` waits for its ACK:
  // what the receiver remembers of the stream must not be forgotten now.
  bool ackOwed(int sender, int receiver) const;

  // ---------------------------------------------------------------- settling (world_checks.cpp)
  void settle();
  void readCompletions();
  void onProducerCompletion(App& p, const fl_completion_desc& d);
  static bool unknownOutcome(int status) { return status == FL_ERR_DAEMON_GONE || status == FL_ERR_TIMEOUT; }
  void endFrame(uint64_t frame, int status);
  void onDelivery(App& c, const fl_completion_desc& d);
  // The frame in the consumer's slot still holds the sender's bytes (checked
  // when it is delivered and again when it is released: nothing may land in
  // a slot while a consumer holds its frame).
  void checkIntact(App& c, uint32_t slot, uint64_t frame, uint64_t length, const char* when);
  // Where a frame the daemon lent `c` is: the producer's slot, after its
  // lend message was read from the socket.
  const uint8_t* lentPayload(App& c, const fl_slot_header& h);

  // ---------------------------------------------------------------- the end (world_checks.cpp)
  void heal();
  void drain(bool release_held);
  void requireEveryFrameEnded(const char* when);

  // ---------------------------------------------------------------- trace
  void note(const std::string& event);
  static std::string describe(const v1::PeerMessage& m);

 public:
  bool tracing_ = false;

 private:
  const SimOptions& options_;
  SimResult& result_;
  Rng rng_;
  ManualClock clock_;
  bool damage_on_ = false;
  bool drop_ = false;          // the stream is in drop_streams on every daemon
  bool pull_ = false;          // the stream is in pull_streams on every daemon
  bool named_routes_ = false;  // the senders route the stream by name (to every receiver)
  bool healthy_ = false;       // the links are healed and every message moves: ACKs owe no TIMEOUT
  std::vector<Daemon> daemons_;
  std::vector<int> receivers_;  // d1, and in a two-receiver world the last daemon
  std::map<uint64_t, int> daemon_of_instance_;
  std::vector<std::unique_ptr<App>> apps_;
  std::vector<std::unique_ptr<Link>> links_;
  std::map<uint64_t, FrameRecord> frames_;
  uint64_t next_instance_ = 0, next_app_ = 0, next_link_ = 0, next_frame_ = 0;
};

}  // namespace framelink::sim
