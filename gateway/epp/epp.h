/* epp.h -- lupin epp, the endpoint picker protocol's front of the gateway
 * (docs/epp.md): Envoy's external processing gRPC stream in, the pick out,
 * as every Gateway API implementation with the Inference Extension calls
 * it.  The gRPC server and its calls on the loop (rpc.c), the ext_proc
 * stream of one HTTP request (ext_proc.c), gRPC health (grpc_health.c).
 *
 * gRPC's C core runs its own threads; one of them (rpc.c) waits on the
 * completion queue and hands each completion to the leader's loop, where
 * everything else runs: the runtime is the loop's alone. */
#ifndef LUPIN_GW_EPP_H
#define LUPIN_GW_EPP_H

#include "proxy/proxy.h"

#include <grpc/grpc.h>

/* --- the server (rpc.c) --------------------------------------------------- */

typedef struct gw_epp gw_epp;
typedef struct gw_rpc gw_rpc;

/* Binds the ext_proc and health addresses (host:port, port 0: any free one)
 * and starts taking calls on gw's loop.  -1 with err. */
int gw_epp_open(lupin_gateway *gw, const char *grpc_addr, const char *health_addr, char *err,
                size_t errlen);
/* "host:port" as bound, for the start-up line. */
void gw_epp_addresses(const lupin_gateway *gw, char *grpc, char *health, size_t len);
/* Takes no new calls; those in progress go on (a drain). */
void gw_epp_close(lupin_gateway *gw);
/* Cancels every call still in progress (the drain ran out of time). */
void gw_epp_cancel_all(lupin_gateway *gw);
/* Calls in progress. */
size_t gw_epp_calls(const lupin_gateway *gw);
/* After the loop has ended: joins the completion thread, frees it all. */
void gw_epp_free(lupin_gateway *gw);
/* Whether the runtime may be asked to pick: the readiness of the health
 * service (readiness, the ext_proc service's name). */
int gw_epp_ready(lupin_gateway *gw);

/* --- one call, seen by its service ---------------------------------------- */

/* A service's side of a call: each runs on the loop, for a call of its
 * method.  gone is the last, exactly once: after it r must not be used. */
typedef struct gw_rpc_service {
  void (*open)(gw_rpc *r);
  void (*message)(gw_rpc *r, const uint8_t *data, size_t len);
  void (*half_closed)(gw_rpc *r); /* the client sent its last message */
  void (*gone)(gw_rpc *r, int cancelled);
} gw_rpc_service;

lupin_gateway *gw_rpc_gateway(const gw_rpc *r);
void *gw_rpc_data(const gw_rpc *r);
void gw_rpc_set_data(gw_rpc *r, void *data);
/* Queues a message (the bytes are copied); sent in order.  -1: no memory. */
int gw_rpc_send(gw_rpc *r, const uint8_t *data, size_t len);
/* Ends the call with a status once the queued messages have gone. */
void gw_rpc_finish(gw_rpc *r, grpc_status_code code, const char *details);

/* --- the services ----------------------------------------------------------- */

extern const gw_rpc_service gw_ext_proc_service; /* ext_proc.c */
extern const gw_rpc_service gw_health_service;   /* grpc_health.c */

#define GW_EXT_PROC_METHOD     "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
#define GW_EXT_PROC_SERVICE    "envoy.service.ext_proc.v3.ExternalProcessor"
#define GW_HEALTH_CHECK_METHOD "/grpc.health.v1.Health/Check"

#endif
