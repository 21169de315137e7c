#include "transport/rdma/verbs_api.h"

#include <arpa/inet.h>

namespace framelink::transport::rdma {
namespace {

class RealVerbs final : public VerbsApi {
 public:
  ibv_context** getDevices(int* count) override { return rdma_get_devices(count); }
  void freeDevices(ibv_context** list) override { rdma_free_devices(list); }
  const char* deviceName(ibv_context* context) override { return ibv_get_device_name(context->device); }
  int queryDevice(ibv_context* context, ibv_device_attr* attr) override {
    return ibv_query_device(context, attr);
  }
  int queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) override {
    return ibv_query_port(context, port, attr);
  }
  int getAsyncEvent(ibv_context* context, ibv_async_event* event) override {
    return ibv_get_async_event(context, event);
  }
  void ackAsyncEvent(ibv_async_event* event) override { ibv_ack_async_event(event); }

  ibv_pd* allocPd(ibv_context* context) override { return ibv_alloc_pd(context); }
  int deallocPd(ibv_pd* pd) override { return ibv_dealloc_pd(pd); }
  ibv_mr* regMr(ibv_pd* pd, void* addr, size_t length, int access) override {
    return ibv_reg_mr(pd, addr, length, access);
  }
  int deregMr(ibv_mr* mr) override { return ibv_dereg_mr(mr); }
  ibv_mw* allocMw(ibv_pd* pd, ibv_mw_type type) override { return ibv_alloc_mw(pd, type); }
  int deallocMw(ibv_mw* mw) override { return ibv_dealloc_mw(mw); }

  ibv_comp_channel* createCompChannel(ibv_context* context) override {
    return ibv_create_comp_channel(context);
  }
  int destroyCompChannel(ibv_comp_channel* channel) override { return ibv_destroy_comp_channel(channel); }
  ibv_cq* createCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                   int comp_vector) override {
    return ibv_create_cq(context, cqe, cq_context, channel, comp_vector);
  }
  int destroyCq(ibv_cq* cq) override { return ibv_destroy_cq(cq); }
  int reqNotifyCq(ibv_cq* cq, int solicited_only) override { return ibv_req_notify_cq(cq, solicited_only); }
  int getCqEvent(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) override {
    return ibv_get_cq_event(channel, cq, cq_context);
  }
  void ackCqEvents(ibv_cq* cq, unsigned int count) override { ibv_ack_cq_events(cq, count); }
  int pollCq(ibv_cq* cq, int entries, ibv_wc* wc) override { return ibv_poll_cq(cq, entries, wc); }

  int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) override {
    return ibv_post_send(qp, wr, bad_wr);
  }
  int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) override {
    return ibv_post_recv(qp, wr, bad_wr);
  }
  int modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) override {
    return ibv_modify_qp(qp, attr, attr_mask);
  }

  rdma_event_channel* createEventChannel() override { return rdma_create_event_channel(); }
  void destroyEventChannel(rdma_event_channel* channel) override { rdma_destroy_event_channel(channel); }
  int createId(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) override {
    return rdma_create_id(channel, id, context, ps);
  }
  int destroyId(rdma_cm_id* id) override { return rdma_destroy_id(id); }
  int migrateId(rdma_cm_id* id, rdma_event_channel* channel) override { return rdma_migrate_id(id, channel); }
  int bindAddr(rdma_cm_id* id, sockaddr* addr) override { return rdma_bind_addr(id, addr); }
  int listen(rdma_cm_id* id, int backlog) override { return rdma_listen(id, backlog); }
  uint16_t getSrcPort(rdma_cm_id* id) override { return ntohs(rdma_get_src_port(id)); }
  int resolveAddr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int timeout_ms) override {
    return rdma_resolve_addr(id, src, dst, timeout_ms);
  }
  int resolveRoute(rdma_cm_id* id, int timeout_ms) override { return rdma_resolve_route(id, timeout_ms); }
  int setAckTimeout(rdma_cm_id* id, uint8_t timeout) override {
    return rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout);
  }
  int createQp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) override {
    return rdma_create_qp(id, pd, attr);
  }
  void destroyQp(rdma_cm_id* id) override { rdma_destroy_qp(id); }
  int connect(rdma_cm_id* id, rdma_conn_param* param) override { return rdma_connect(id, param); }
  int accept(rdma_cm_id* id, rdma_conn_param* param) override { return rdma_accept(id, param); }
  int reject(rdma_cm_id* id, const void* private_data, uint8_t length) override {
    return rdma_reject(id, private_data, length);
  }
  int disconnect(rdma_cm_id* id) override { return rdma_disconnect(id); }
  int getCmEvent(rdma_event_channel* channel, rdma_cm_event** event) override {
    return rdma_get_cm_event(channel, event);
  }
  int ackCmEvent(rdma_cm_event* event) override { return rdma_ack_cm_event(event); }
};

}  // namespace

std::shared_ptr<VerbsApi> realVerbs() {
  static const std::shared_ptr<VerbsApi> kInstance = std::make_shared<RealVerbs>();
  return kInstance;
}

}  // namespace framelink::transport::rdma
