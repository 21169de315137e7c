// The seam between the rdma transport and libibverbs / librdmacm: one method
// per library call the transport makes, nothing more.  realVerbs() forwards
// each one 1:1; tests/unit/fake_verbs.h implements them in memory, so the
// QP state machine, batching, selective signalling and completion error
// handling are unit-tested on machines without an RDMA device.
//
// Every method returns exactly what the wrapped call returns and leaves
// errno as that call leaves it (rdma_* calls: -1 and errno; ibv_post_*,
// ibv_req_notify_cq, ibv_modify_qp: the errno value itself).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <memory>

namespace framelink::transport::rdma {

class VerbsApi {
 public:
  virtual ~VerbsApi() = default;

  // ---- devices.  The contexts of rdma_get_devices(), not ibv_open_device():
  // a PD must live on the very context the rdma_cm ids use, or
  // rdma_create_qp() refuses it.
  virtual ibv_context** getDevices(int* count) = 0;          // rdma_get_devices
  virtual void freeDevices(ibv_context** list) = 0;          // rdma_free_devices
  virtual const char* deviceName(ibv_context* context) = 0;  // ibv_get_device_name(context->device)
  virtual int queryDevice(ibv_context* context, ibv_device_attr* attr) = 0;
  virtual int queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) = 0;
  virtual int getAsyncEvent(ibv_context* context, ibv_async_event* event) = 0;
  virtual void ackAsyncEvent(ibv_async_event* event) = 0;

  // ---- memory
  virtual ibv_pd* allocPd(ibv_context* context) = 0;
  virtual int deallocPd(ibv_pd* pd) = 0;
  virtual ibv_mr* regMr(ibv_pd* pd, void* addr, size_t length, int access) = 0;
  virtual int deregMr(ibv_mr* mr) = 0;
  // Type-2 memory windows: bound and invalidated by work requests on one
  // QP's send queue (IBV_WR_BIND_MW, IBV_WR_LOCAL_INV through postSend).
  virtual ibv_mw* allocMw(ibv_pd* pd, ibv_mw_type type) = 0;
  virtual int deallocMw(ibv_mw* mw) = 0;

  // ---- completion queues
  virtual ibv_comp_channel* createCompChannel(ibv_context* context) = 0;
  virtual int destroyCompChannel(ibv_comp_channel* channel) = 0;
  virtual ibv_cq* createCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                           int comp_vector) = 0;
  virtual int destroyCq(ibv_cq* cq) = 0;
  virtual int reqNotifyCq(ibv_cq* cq, int solicited_only) = 0;
  virtual int getCqEvent(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = 0;
  virtual void ackCqEvents(ibv_cq* cq, unsigned int count) = 0;
  virtual int pollCq(ibv_cq* cq, int entries, ibv_wc* wc) = 0;

  // ---- queue pairs
  virtual int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = 0;
  virtual int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) = 0;
  virtual int modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = 0;

  // ---- rdma_cm
  virtual rdma_event_channel* createEventChannel() = 0;
  virtual void destroyEventChannel(rdma_event_channel* channel) = 0;
  virtual int createId(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) = 0;
  virtual int destroyId(rdma_cm_id* id) = 0;
  virtual int migrateId(rdma_cm_id* id, rdma_event_channel* channel) = 0;
  virtual int bindAddr(rdma_cm_id* id, sockaddr* addr) = 0;
  virtual int listen(rdma_cm_id* id, int backlog) = 0;
  virtual uint16_t getSrcPort(rdma_cm_id* id) = 0;  // rdma_get_src_port, converted to host order
  virtual int resolveAddr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int timeout_ms) = 0;
  virtual int resolveRoute(rdma_cm_id* id, int timeout_ms) = 0;
  // rdma_set_option(RDMA_OPTION_IB, RDMA_OPTION_ID_ACK_TIMEOUT): the QP's
  // local ACK timeout, 4.096 us x 2^timeout; before rdma_connect / rdma_accept.
  virtual int setAckTimeout(rdma_cm_id* id, uint8_t timeout) = 0;
  virtual int createQp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) = 0;
  virtual void destroyQp(rdma_cm_id* id) = 0;
  virtual int connect(rdma_cm_id* id, rdma_conn_param* param) = 0;
  virtual int accept(rdma_cm_id* id, rdma_conn_param* param) = 0;
  virtual int reject(rdma_cm_id* id, const void* private_data, uint8_t length) = 0;
  virtual int disconnect(rdma_cm_id* id) = 0;
  virtual int getCmEvent(rdma_event_channel* channel, rdma_cm_event** event) = 0;
  virtual int ackCmEvent(rdma_cm_event* event) = 0;
};

// The 1:1 libibverbs / librdmacm implementation (a process-wide instance).
std::shared_ptr<VerbsApi> realVerbs();

}  // namespace framelink::transport::rdma
