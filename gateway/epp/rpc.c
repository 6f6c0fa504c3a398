/* The gRPC server of lupin epp, on gRPC's C core: calls taken, messages
 * read and queued for sending, statuses, all on the leader's loop.  gRPC
 * reports every completion on one queue; a thread of ours waits on it and
 * hands each completion to the loop (an async handle), so the services and
 * the runtime never run on gRPC's threads.
 *
 * A call has at most one batch of each kind in flight (gRPC's rule): one
 * receive, one send, and the close it waits for from the start.  Sends
 * queue behind the one in flight.  A call is freed when its close has come
 * and none of its batches is still out. */
#include "epp/epp.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include <stdlib.h>
#include <string.h>

/* A batch's tag crosses to the completion thread inside gRPC, whose locks
 * (abseil's, not built with ThreadSanitizer) TSan cannot see: the handoff
 * is told to it, so what the loop wrote before a batch stays checked. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define HANDOFF(tag) __tsan_release(tag)
#define TAKEN(tag)   __tsan_acquire(tag)
#else
#define HANDOFF(tag) ((void)(tag))
#define TAKEN(tag)   ((void)(tag))
#endif

enum { OP_NEW, OP_RECV, OP_SEND, OP_CLOSE, OP_SHUTDOWN };

/* A batch's tag: what completed, for which call. */
typedef struct gw_op {
  int kind, ok;
  void *owner; /* the call, or the listen of OP_NEW */
  struct gw_op *next;
} gw_op;

typedef struct out_msg {
  struct out_msg *next;
  grpc_byte_buffer *bb;
} out_msg;

struct gw_rpc {
  gw_epp *epp;
  grpc_call *call;
  const gw_rpc_service *svc;
  void *data;
  gw_op recv_op, send_op, close_op;
  grpc_byte_buffer *recv_bb, *sending_bb;
  grpc_metadata_array md;
  grpc_call_details details; /* a call of no registered method */
  gpr_timespec deadline;
  int cancelled, pending, closed, finishing, status_sent, sent_metadata, sending;
  grpc_status_code code;
  grpc_slice status_details;
  out_msg *out_head, *out_tail;
  gw_rpc *prev, *next;
};

/* A request for the next call of one method (NULL: any other method). */
typedef struct gw_listen {
  void *method;
  const gw_rpc_service *svc;
  gw_op op;
  gw_rpc *rpc; /* filled by gRPC when the call comes */
} gw_listen;

enum { LISTEN_EXT_PROC, LISTEN_HEALTH, LISTEN_OTHER, LISTENS };

struct gw_epp {
  lupin_gateway *gw;
  grpc_server *server;
  grpc_completion_queue *cq;
  uv_thread_t thread;
  int thread_started, started, closing, shut_down, cq_down;
  uv_async_t *async;
  uv_mutex_t lock;
  gw_op *head, *tail; /* completions for the loop, under lock */
  gw_listen listens[LISTENS];
  gw_op shutdown_op;
  gw_rpc *rpcs;
  size_t n_rpcs;
  char grpc_addr[96], health_addr[96];
};

static const gw_rpc_service unimplemented_service;

/* --- the completion thread ------------------------------------------------- */

static void completions(void *arg) {
  gw_epp *e = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(e->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    gw_op *op = ev.tag;
    TAKEN(op);
    op->ok = ev.success;
    op->next = NULL;
    uv_mutex_lock(&e->lock);
    if (e->tail)
      e->tail->next = op;
    else
      e->head = op;
    e->tail = op;
    uv_mutex_unlock(&e->lock);
    uv_async_send(e->async);
  }
}

/* --- a call's batches --------------------------------------------------------- */

static void release(gw_rpc *r) {
  if (!r->closed || r->pending) return;
  gw_epp *e = r->epp;
  if (r->prev)
    r->prev->next = r->next;
  else
    e->rpcs = r->next;
  if (r->next) r->next->prev = r->prev;
  e->n_rpcs--;
  for (out_msg *m = r->out_head, *next; m; m = next) {
    next = m->next;
    grpc_byte_buffer_destroy(m->bb);
    free(m);
  }
  grpc_slice_unref(r->status_details);
  grpc_metadata_array_destroy(&r->md);
  grpc_call_details_destroy(&r->details);
  grpc_call_unref(r->call);
  free(r);
  gw_check_drained(e->gw);
}

static int batch(gw_rpc *r, const grpc_op *ops, size_t n, gw_op *tag) {
  HANDOFF(tag);
  if (grpc_call_start_batch(r->call, ops, n, tag, NULL) != GRPC_CALL_OK) return -1;
  r->pending++;
  return 0;
}

static void receive(gw_rpc *r) {
  grpc_op op = {.op = GRPC_OP_RECV_MESSAGE};
  op.data.recv_message.recv_message = &r->recv_bb;
  r->recv_bb = NULL;
  batch(r, &op, 1, &r->recv_op);
}

/* The next queued message, else the status once finishing. */
static void send_next(gw_rpc *r) {
  if (r->sending || r->closed || r->status_sent) return;
  grpc_op ops[2];
  size_t n = 0;
  if (!r->sent_metadata) {
    ops[n] = (grpc_op){.op = GRPC_OP_SEND_INITIAL_METADATA};
    n++;
  }
  if (r->out_head) {
    out_msg *m = r->out_head;
    r->out_head = m->next;
    if (!r->out_head) r->out_tail = NULL;
    r->sending_bb = m->bb;
    free(m);
    ops[n] = (grpc_op){.op = GRPC_OP_SEND_MESSAGE};
    ops[n].data.send_message.send_message = r->sending_bb;
    n++;
  } else if (r->finishing) {
    ops[n] = (grpc_op){.op = GRPC_OP_SEND_STATUS_FROM_SERVER};
    ops[n].data.send_status_from_server.status = r->code;
    ops[n].data.send_status_from_server.status_details = &r->status_details;
    n++;
    r->status_sent = 1;
  } else {
    return;
  }
  if (batch(r, ops, n, &r->send_op)) {
    if (r->sending_bb) grpc_byte_buffer_destroy(r->sending_bb);
    r->sending_bb = NULL;
    return;
  }
  r->sent_metadata = 1;
  r->sending = 1;
}

int gw_rpc_send(gw_rpc *r, const uint8_t *data, size_t len) {
  if (r->closed || r->finishing) return 0;
  out_msg *m = malloc(sizeof *m);
  if (!m) return -1;
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)data, len);
  m->bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  m->next = NULL;
  if (r->out_tail)
    r->out_tail->next = m;
  else
    r->out_head = m;
  r->out_tail = m;
  send_next(r);
  return 0;
}

void gw_rpc_finish(gw_rpc *r, grpc_status_code code, const char *details) {
  if (r->finishing || r->closed) return;
  r->finishing = 1;
  r->code = code;
  r->status_details = grpc_slice_from_copied_string(details ? details : "");
  send_next(r);
}

lupin_gateway *gw_rpc_gateway(const gw_rpc *r) { return r->epp->gw; }
void *gw_rpc_data(const gw_rpc *r) { return r->data; }
void gw_rpc_set_data(gw_rpc *r, void *data) { r->data = data; }

/* --- taking calls ------------------------------------------------------------ */

static gw_rpc *rpc_new(gw_epp *e, const gw_rpc_service *svc) {
  gw_rpc *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->epp = e;
  r->svc = svc;
  r->recv_op = (gw_op){OP_RECV, 0, r, NULL};
  r->send_op = (gw_op){OP_SEND, 0, r, NULL};
  r->close_op = (gw_op){OP_CLOSE, 0, r, NULL};
  r->status_details = grpc_empty_slice();
  grpc_metadata_array_init(&r->md);
  grpc_call_details_init(&r->details);
  return r;
}

static void rpc_drop(gw_rpc *r) {
  grpc_metadata_array_destroy(&r->md);
  grpc_call_details_destroy(&r->details);
  free(r);
}

/* Asks gRPC for the next call of l's method. */
static void listen_arm(gw_epp *e, gw_listen *l) {
  if (e->closing) return;
  gw_rpc *r = l->rpc = rpc_new(e, l->svc);
  if (!r) {
    gw_log(e->gw, LUPIN_LOG_ERROR, "epp: out of memory: no more gRPC calls taken");
    return;
  }
  HANDOFF(&l->op);
  grpc_call_error rc =
      l->method ? grpc_server_request_registered_call(e->server, l->method, &r->call, &r->deadline,
                                                      &r->md, NULL, e->cq, e->cq, &l->op)
                : grpc_server_request_call(e->server, &r->call, &r->details, &r->md, e->cq, e->cq,
                                           &l->op);
  if (rc != GRPC_CALL_OK) {
    l->rpc = NULL;
    rpc_drop(r);
  }
}

static void call_taken(gw_epp *e, gw_listen *l, int ok) {
  gw_rpc *r = l->rpc;
  l->rpc = NULL;
  if (!ok || !r) { /* the server is shutting down */
    if (r) rpc_drop(r);
    return;
  }
  r->next = e->rpcs;
  if (e->rpcs) e->rpcs->prev = r;
  e->rpcs = r;
  e->n_rpcs++;
  listen_arm(e, l);
  grpc_op op = {.op = GRPC_OP_RECV_CLOSE_ON_SERVER};
  op.data.recv_close_on_server.cancelled = &r->cancelled;
  if (batch(r, &op, 1, &r->close_op)) { /* nothing started: drop it */
    grpc_call_cancel_with_status(r->call, GRPC_STATUS_INTERNAL, "lupin epp could not start it",
                                 NULL);
    r->closed = 1;
    release(r);
    return;
  }
  r->svc->open(r);
  if (!r->finishing && !r->closed) receive(r);
}

/* --- completions on the loop ---------------------------------------------- */

static void received(gw_rpc *r, int ok) {
  grpc_byte_buffer *bb = r->recv_bb;
  r->recv_bb = NULL;
  if (!ok || r->closed || r->finishing) {
    if (bb) grpc_byte_buffer_destroy(bb);
    return;
  }
  if (!bb) { /* the client's last message, or a cancel: the close op says which */
    if (!grpc_call_failed_before_recv_message(r->call)) r->svc->half_closed(r);
    return;
  }
  grpc_byte_buffer_reader rd;
  grpc_slice s = grpc_empty_slice();
  if (grpc_byte_buffer_reader_init(&rd, bb)) {
    s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
  }
  grpc_byte_buffer_destroy(bb);
  r->svc->message(r, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
  grpc_slice_unref(s);
  if (!r->finishing && !r->closed) receive(r);
}

static void sent(gw_rpc *r, int ok) {
  r->sending = 0;
  if (r->sending_bb) grpc_byte_buffer_destroy(r->sending_bb);
  r->sending_bb = NULL;
  if (ok) send_next(r);
}

static void completed(gw_epp *e, gw_op *op) {
  if (op->kind == OP_NEW) {
    call_taken(e, op->owner, op->ok);
    return;
  }
  if (op->kind == OP_SHUTDOWN) {
    e->shut_down = 1;
    return;
  }
  gw_rpc *r = op->owner;
  r->pending--;
  if (op->kind == OP_RECV)
    received(r, op->ok);
  else if (op->kind == OP_SEND)
    sent(r, op->ok);
  else {
    r->closed = 1;
    r->svc->gone(r, r->cancelled || !r->status_sent);
  }
  release(r);
}

static void stop_thread(gw_epp *e) {
  if (e->cq_down || !e->shut_down || e->n_rpcs) return;
  e->cq_down = 1;
  grpc_completion_queue_shutdown(e->cq);
  uv_close((uv_handle_t *)e->async, NULL); /* freed with e, after the loop */
}

static void on_completions(uv_async_t *a) {
  gw_epp *e = a->data;
  uv_mutex_lock(&e->lock);
  gw_op *op = e->head;
  e->head = e->tail = NULL;
  uv_mutex_unlock(&e->lock);
  while (op) {
    gw_op *next = op->next;
    completed(e, op);
    op = next;
  }
  stop_thread(e);
}

/* --- the server's life ----------------------------------------------------- */

static int bind_port(gw_epp *e, const char *addr, char *bound, const char *role, char *err,
                     size_t errlen) {
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(e->server, addr, creds);
  grpc_server_credentials_release(creds);
  if (!port) {
    lh_errf(err, errlen, "cannot listen on %s (%s): the address is in use or not this host's", addr,
            role);
    return -1;
  }
  const char *colon = strrchr(addr, ':');
  int host_len = colon ? (int)(colon - addr) : (int)strlen(addr);
  snprintf(bound, 96, "%.*s:%d", host_len, addr, port);
  return 0;
}

static void open_listens(gw_epp *e) {
  static const struct {
    const char *method;
    const gw_rpc_service *svc;
  } methods[LISTENS] = {{GW_EXT_PROC_METHOD, &gw_ext_proc_service},
                        {GW_HEALTH_CHECK_METHOD, &gw_health_service},
                        {NULL, &unimplemented_service}};
  for (int i = 0; i < LISTENS; i++) {
    gw_listen *l = &e->listens[i];
    l->svc = methods[i].svc;
    l->op = (gw_op){OP_NEW, 0, l, NULL};
    if (methods[i].method)
      l->method =
          grpc_server_register_method(e->server, methods[i].method, NULL, GRPC_SRM_PAYLOAD_NONE, 0);
  }
}

int gw_epp_open(lupin_gateway *gw, const char *grpc_addr, const char *health_addr, char *err,
                size_t errlen) {
  gw_epp *e = calloc(1, sizeof *e);
  uv_async_t *async = malloc(sizeof *async);
  if (!e || !async) {
    free(e);
    free(async);
    lh_errf(err, errlen, "out of memory");
    return -1;
  }
  grpc_init();
  gw->epp = e;
  e->gw = gw;
  e->async = async;
  uv_mutex_init(&e->lock);
  uv_async_init(gw->loop, e->async, on_completions);
  e->async->data = e;
  /* requests are read whole by Envoy's chunks; a body chunk may be large */
  grpc_arg args[] = {
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = 64 << 20}}};
  grpc_channel_args ca = {1, args};
  e->server = grpc_server_create(&ca, NULL);
  e->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(e->server, e->cq, NULL);
  open_listens(e);
  /* one address for both (a port given twice) serves both services there */
  size_t len = strlen(grpc_addr);
  int shared = !strcmp(grpc_addr, health_addr) && !(len > 2 && !strcmp(grpc_addr + len - 2, ":0"));
  if (bind_port(e, grpc_addr, e->grpc_addr, "grpc", err, errlen) ||
      (!shared && bind_port(e, health_addr, e->health_addr, "grpc health", err, errlen)))
    return -1;
  if (shared) memcpy(e->health_addr, e->grpc_addr, sizeof e->health_addr);
  grpc_server_start(e->server);
  e->started = 1;
  if (uv_thread_create(&e->thread, completions, e)) {
    lh_errf(err, errlen, "cannot start the gRPC completion thread");
    return -1;
  }
  e->thread_started = 1;
  for (int i = 0; i < LISTENS; i++)
    listen_arm(e, &e->listens[i]);
  return 0;
}

void gw_epp_addresses(const lupin_gateway *gw, char *grpc, char *health, size_t len) {
  snprintf(grpc, len, "%s", gw->epp ? gw->epp->grpc_addr : "?");
  snprintf(health, len, "%s", gw->epp ? gw->epp->health_addr : "?");
}

void gw_epp_close(lupin_gateway *gw) {
  gw_epp *e = gw->epp;
  if (!e || e->closing) return;
  e->closing = 1;
  e->shutdown_op = (gw_op){OP_SHUTDOWN, 0, NULL, NULL};
  HANDOFF(&e->shutdown_op);
  if (e->started) grpc_server_shutdown_and_notify(e->server, e->cq, &e->shutdown_op);
  if (!e->thread_started) e->shut_down = 1; /* a failed open: no thread reports it */
}

void gw_epp_cancel_all(lupin_gateway *gw) {
  gw_epp *e = gw->epp;
  if (!e) return;
  gw_epp_close(gw);
  if (e->started) grpc_server_cancel_all_calls(e->server);
}

size_t gw_epp_calls(const lupin_gateway *gw) { return gw->epp ? gw->epp->n_rpcs : 0; }

void gw_epp_free(lupin_gateway *gw) {
  gw_epp *e = gw->epp;
  if (!e) return;
  if (!e->cq_down) { /* the loop ended before the queue drained (a failed open) */
    if (e->started && !e->closing) gw_epp_close(gw);
    if (e->started) grpc_server_cancel_all_calls(e->server);
    grpc_completion_queue_shutdown(e->cq);
  }
  if (e->thread_started) uv_thread_join(&e->thread);
  if (!e->thread_started) /* no thread drained it: drain here */
    while (grpc_completion_queue_next(e->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
      ;
  for (int i = 0; i < LISTENS; i++)
    if (e->listens[i].rpc) rpc_drop(e->listens[i].rpc);
  grpc_server_destroy(e->server);
  grpc_completion_queue_destroy(e->cq);
  if (!uv_is_closing((uv_handle_t *)e->async)) {
    uv_close((uv_handle_t *)e->async, NULL);
    uv_run(gw->loop, UV_RUN_NOWAIT);
  }
  free(e->async);
  uv_mutex_destroy(&e->lock);
  free(e);
  gw->epp = NULL;
  grpc_shutdown();
}

/* --- any other method ------------------------------------------------------- */

static void unimplemented_open(gw_rpc *r) {
  gw_rpc_finish(r, GRPC_STATUS_UNIMPLEMENTED,
                "lupin epp serves envoy.service.ext_proc.v3.ExternalProcessor/Process and "
                "grpc.health.v1.Health/Check only");
}
static void unimplemented_message(gw_rpc *r, const uint8_t *d, size_t n) {
  (void)r, (void)d, (void)n;
}
static void unimplemented_end(gw_rpc *r) { (void)r; }
static void unimplemented_gone(gw_rpc *r, int c) { (void)r, (void)c; }
static const gw_rpc_service unimplemented_service = {unimplemented_open, unimplemented_message,
                                                     unimplemented_end, unimplemented_gone};
