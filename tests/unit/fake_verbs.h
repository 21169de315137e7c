// An in-memory VerbsApi for unit tests of the rdma transport.
//
// Fake devices (name + IP) live on one fake fabric: rdma_cm ids bind,
// listen, resolve and connect by IP and port; an accepted connection links
// two fake QPs, and an RDMA_WRITE_WITH_IMM posted on one really copies the
// bytes of its SGEs (checked against the local MRs' lkeys) into the peer's
// memory (checked against the peer's MRs: rkey, bounds, remote-write
// access), consumes one of the peer's receive WRs and completes it with
// the immediate data and the byte count.  A SEND_WITH_IMM copies its bytes
// into the buffers of the peer's next receive WR (checked against the
// peer's MRs with local-write access; too small a buffer fails both sides
// as LOC_LEN_ERR / REM_INV_REQ_ERR would).  Completion channels, rdma_cm event
// channels and async event fds are eventfds, so epoll works as with real
// verbs.  Tests can pause delivery (WRs stay on the send queue), inject a
// completion error or an asynchronous event, and read counters.  Type-2
// memory windows (fake_verbs_mw.cpp) are bound and invalidated by
// IBV_WR_BIND_MW / IBV_WR_LOCAL_INV on one QP, as rxe does them: a WRITE
// under a window's rkey lands only from the QP's peer and inside the bound
// range, else it fails REM_ACCESS_ERR and nothing is written.  Misuse that
// real verbs would punish (destroying an id that still has a QP, a CQ with
// unacked events, more WRs than the queue holds) is recorded in errors().
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "transport/rdma/verbs_api.h"

namespace framelink::transport::rdma::testing {

class FakeVerbs final : public VerbsApi {
 public:
  struct DeviceSpec {
    std::string name;
    std::string ip;
    ibv_port_state port_state = IBV_PORT_ACTIVE;
    uint32_t max_inline_data = 512;  // a QP asking for more is refused, as a real device does
  };
  explicit FakeVerbs(std::vector<DeviceSpec> devices);
  ~FakeVerbs() override;

  // ---- test controls
  void pauseDelivery(bool paused);
  // The next send WR that executes completes with `status`; its QP goes to
  // ERR (flushing the rest).
  void injectSendError(ibv_wc_status status);
  // An asynchronous event on `device` (QP events need `qp`; they also move
  // it to ERR, as the adapter would).
  void injectAsyncEvent(const std::string& device, ibv_event_type type, ibv_qp* qp = nullptr);
  // Connect requests from `dialer_ip` are accepted, but their dialer never
  // answers (as a peer that sends a request and stalls): no ESTABLISHED on
  // either side; destroying the listener's id then rejects the dialer.
  void stallDialersFrom(const std::string& dialer_ip, bool stall);

  struct Stats {
    uint64_t post_send_calls = 0;
    uint64_t send_wrs = 0;
    uint64_t signalled_wrs = 0;
    uint64_t inline_wrs = 0;  // IBV_SEND_INLINE: bytes taken at post time, no lkey
    uint64_t post_recv_calls = 0;
    uint64_t recv_wrs = 0;
    uint64_t cm_events = 0;
    uint64_t cm_events_acked = 0;
    uint64_t cm_event_reads = 0;  // rdma_get_cm_event calls, with an event or not
    uint64_t cq_event_reads = 0;  // ibv_get_cq_event calls, with an event or not
    uint64_t live_qps = 0;
    uint64_t live_ids = 0;
    uint64_t live_cqs = 0;
    uint64_t live_mrs = 0;
    uint64_t live_mws = 0;
    uint64_t reads = 0;          // IBV_WR_RDMA_READ executed
    uint64_t binds = 0;          // IBV_WR_BIND_MW executed
    uint64_t invalidations = 0;  // IBV_WR_LOCAL_INV executed
  };
  Stats stats() const;
  std::vector<std::string> errors() const;
  // ---- a hostile peer's adapter (the receive path's fuzzer)
  // The first live QP on `device`; null when there is none.
  ibv_qp* qpOnDevice(const std::string& device) const;
  // What `qp`'s connected peer would write with an RDMA_WRITE (`imm`
  // empty) or RDMA_WRITE_WITH_IMM of `bytes` at `remote_addr` under `rkey`,
  // bypassing the peer's send queue (no completion on its side): checked
  // against `qp`'s memory as any WRITE is (a window bound on `qp` or an MR
  // with remote write, the whole range inside it).  The bytes land and the
  // immediate consumes `qp`'s next receive WR; returns the status the
  // sender would see, nothing written unless IBV_WC_SUCCESS.  With an
  // immediate and no receive WR posted: IBV_WC_RNR_RETRY_EXC_ERR, nothing
  // written.
  ibv_wc_status peerWrite(ibv_qp* qp, uint32_t rkey, uint64_t remote_addr, const std::vector<uint8_t>& bytes,
                          std::optional<uint32_t> imm);
  // Consumes `qp`'s next receive WR and completes it with `wc` as given
  // (any status, opcode, flags, byte count, immediate); wr_id and qp_num
  // are the WR's and the QP's.  False when no receive WR is posted.
  bool injectRecvCompletion(ibv_qp* qp, ibv_wc wc);

  // IBV_QPS_* of a live QP (IBV_QPS_UNKNOWN when it is gone).
  ibv_qp_state qpState(const ibv_qp* qp) const;
  // The SGEs of the last send WR handed to ibv_post_send, as posted.
  std::vector<ibv_sge> lastSendSges() const;

  // ---- VerbsApi
  ibv_context** getDevices(int* count) override;
  void freeDevices(ibv_context** list) override;
  const char* deviceName(ibv_context* context) override;
  int queryDevice(ibv_context* context, ibv_device_attr* attr) override;
  int queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) override;
  int getAsyncEvent(ibv_context* context, ibv_async_event* event) override;
  void ackAsyncEvent(ibv_async_event* event) override;
  ibv_pd* allocPd(ibv_context* context) override;
  int deallocPd(ibv_pd* pd) override;
  ibv_mr* regMr(ibv_pd* pd, void* addr, size_t length, int access) override;
  int deregMr(ibv_mr* mr) override;
  ibv_mw* allocMw(ibv_pd* pd, ibv_mw_type type) override;
  int deallocMw(ibv_mw* mw) override;
  ibv_comp_channel* createCompChannel(ibv_context* context) override;
  int destroyCompChannel(ibv_comp_channel* channel) override;
  ibv_cq* createCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                   int comp_vector) override;
  int destroyCq(ibv_cq* cq) override;
  int reqNotifyCq(ibv_cq* cq, int solicited_only) override;
  int getCqEvent(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) override;
  void ackCqEvents(ibv_cq* cq, unsigned int count) override;
  int pollCq(ibv_cq* cq, int entries, ibv_wc* wc) override;
  int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) override;
  int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) override;
  int modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) override;
  rdma_event_channel* createEventChannel() override;
  void destroyEventChannel(rdma_event_channel* channel) override;
  int createId(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) override;
  int destroyId(rdma_cm_id* id) override;
  int migrateId(rdma_cm_id* id, rdma_event_channel* channel) override;
  int bindAddr(rdma_cm_id* id, sockaddr* addr) override;
  int listen(rdma_cm_id* id, int backlog) override;
  uint16_t getSrcPort(rdma_cm_id* id) override;
  int resolveAddr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int timeout_ms) override;
  int resolveRoute(rdma_cm_id* id, int timeout_ms) override;
  int setAckTimeout(rdma_cm_id* id, uint8_t timeout) override;
  int createQp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) override;
  void destroyQp(rdma_cm_id* id) override;
  int connect(rdma_cm_id* id, rdma_conn_param* param) override;
  int accept(rdma_cm_id* id, rdma_conn_param* param) override;
  int reject(rdma_cm_id* id, const void* private_data, uint8_t length) override;
  int disconnect(rdma_cm_id* id) override;
  int getCmEvent(rdma_event_channel* channel, rdma_cm_event** event) override;
  int ackCmEvent(rdma_cm_event* event) override;

 private:
  struct Device;
  struct Mr;
  struct Mw;
  struct CompChannel;
  struct Cq;
  struct Qp;
  struct EventChannel;
  struct Id;
  struct SendWr {
    uint64_t wr_id;
    ibv_wr_opcode opcode;  // RDMA_WRITE(_WITH_IMM), RDMA_READ, SEND_WITH_IMM, BIND_MW or LOCAL_INV
    bool signalled;
    uint32_t imm;
    uint64_t remote_addr;
    uint32_t rkey;
    std::vector<ibv_sge> sges;
    // IBV_SEND_INLINE: the bytes as they were at post time (sges point here).
    std::vector<uint8_t> inline_bytes;
    ibv_mw* mw = nullptr;  // BIND_MW: the window; rkey its new key
    uint32_t mw_rkey = 0;  // BIND_MW: the window's key when the bind was posted
    ibv_mw_bind_info bind{};
  };
  struct RecvWr {
    uint64_t wr_id;
    std::vector<ibv_sge> sges;  // where a SEND lands
  };
  // The MR with `lkey` on `pd` that holds [addr, addr + length) with at
  // least `access`, or null.
  Mr* findMr(uint32_t lkey, ibv_pd* pd, uint64_t addr, uint64_t length, int access) const;

  Device* deviceOf(const ibv_context* ctx) const;
  Device* deviceByIp(const std::string& ip) const;
  void pushWc(Cq* cq, const ibv_wc& wc);
  void queueCmEvent(Id* id, rdma_cm_event_type type, int status, Id* listen_id = nullptr,
                    const void* private_data = nullptr, uint8_t private_data_len = 0);
  void flushQp(Qp* qp);
  // Executes what waits on `qp`'s send queue, in order, until it is empty,
  // delivery is paused or the peer has no receive WR for the next one.
  void deliver(Qp* qp);
  // The status `wr` from `q` completes with as far as memory keys go: its
  // SGEs under local lkeys, a WRITE's target under the peer's rkey.
  ibv_wc_status checkKeys(const Qp* q, const SendWr& wr, uint64_t total, bool is_send) const;
  // The same for an RDMA_READ: its SGEs under local lkeys with local write,
  // its source under the peer's rkey with remote read.
  ibv_wc_status checkReadKeys(const Qp* q, const SendWr& wr, uint64_t total) const;
  // Consumes the peer's next receive WR for `wr` (`total` bytes) and lands
  // the bytes; false (nothing done) when it has none posted.
  bool executeAtPeer(Qp* peer, const SendWr& wr, uint64_t total, bool is_send, ibv_wc* wc);
  // A SEND lands in the receive WR's buffers, which must hold it and lie in
  // memory registered for local write; else both sides fail.
  void landSend(Qp* peer, const SendWr& wr, const RecvWr& recv, uint64_t total, ibv_wc* rwc, ibv_wc* wc);
  // fake_verbs_mw.cpp: a BIND_MW or LOCAL_INV from `q`, executed in the
  // send queue's order; the status it completes with.
  ibv_wc_status executeWindowWr(Qp* q, const SendWr& wr);
  // The window whose current rkey is `rkey`, bound on `qp` around
  // [addr, addr + length) with `access` (remote write or read), or null.
  const Mw* findWindow(uint32_t rkey, const Qp* qp, uint64_t addr, uint64_t length,
                       int access = IBV_ACCESS_REMOTE_WRITE) const;
  // Parses a BIND_MW / LOCAL_INV WR for the send queue; false: EINVAL.
  static bool windowWr(const ibv_send_wr* wr, SendWr* out);
  void disconnectLocked(Id* id);
  void error(std::string what);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::map<const void*, std::unique_ptr<Mr>> mrs_;
  std::map<const void*, std::unique_ptr<Mw>> mws_;
  std::map<const void*, std::unique_ptr<CompChannel>> comp_channels_;
  std::map<const void*, std::unique_ptr<Cq>> cqs_;
  std::map<const void*, std::unique_ptr<Qp>> qps_;
  std::map<const void*, std::unique_ptr<EventChannel>> event_channels_;
  std::map<const void*, std::unique_ptr<Id>> ids_;
  std::map<const void*, std::vector<uint8_t>> event_private_data_;
  std::map<std::pair<std::string, uint16_t>, Id*> listeners_;
  std::vector<std::unique_ptr<ibv_pd>> pds_;
  bool paused_ = false;
  std::vector<std::string> stalled_dialers_;
  std::optional<ibv_wc_status> inject_;
  uint32_t next_key_ = 0x100;
  uint32_t next_qp_num_ = 0x10;
  uint16_t next_port_ = 20000;
  Stats stats_;
  std::vector<ibv_sge> last_send_sges_;
  std::vector<std::string> errors_;
};

}  // namespace framelink::transport::rdma::testing
