/* gRPC health checking (grpc.health.v1.Health/Check), which the EPP's
 * chart probes and the endpoint picker protocol names: "liveness" serves
 * while the process answers; "readiness" and the ext_proc service's own
 * name (and "", the server's) serve when /readyz would say ready (the
 * pool read, an endpoint healthy with fresh metrics) and the gateway is
 * not draining. */
#include "epp/epp.h"
#include "grpc/health/v1/health.pb-c.h"

#include <string.h>

typedef Grpc__Health__V1__HealthCheckResponse__ServingStatus serving_status;

/* The status of service, or -1: no such service. */
static int status_of(lupin_gateway *gw, const char *service) {
  if (!strcmp(service, "liveness"))
    return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  if (strcmp(service, "readiness") && strcmp(service, GW_EXT_PROC_SERVICE) && *service) return -1;
  return gw_epp_ready(gw) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                          : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static void open_check(gw_rpc *r) { (void)r; }

static void check(gw_rpc *r, const uint8_t *data, size_t len) {
  Grpc__Health__V1__HealthCheckRequest *q =
      grpc__health__v1__health_check_request__unpack(NULL, len, data);
  if (!q) {
    gw_rpc_finish(r, GRPC_STATUS_INVALID_ARGUMENT, "not a grpc.health.v1.HealthCheckRequest");
    return;
  }
  int status = status_of(gw_rpc_gateway(r), q->service ? q->service : "");
  grpc__health__v1__health_check_request__free_unpacked(q, NULL);
  if (status < 0) {
    gw_rpc_finish(r, GRPC_STATUS_NOT_FOUND,
                  "unknown service: lupin epp knows liveness, readiness and " GW_EXT_PROC_SERVICE);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse a = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  a.status = (serving_status)status;
  uint8_t buf[16];
  size_t n = grpc__health__v1__health_check_response__pack(&a, buf);
  if (gw_rpc_send(r, buf, n))
    gw_rpc_finish(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  else
    gw_rpc_finish(r, GRPC_STATUS_OK, NULL);
}

/* A unary call: its one message is in, the answer has gone or is queued. */
static void half_closed(gw_rpc *r) {
  gw_rpc_finish(r, GRPC_STATUS_INVALID_ARGUMENT, "no grpc.health.v1.HealthCheckRequest sent");
}

static void gone(gw_rpc *r, int cancelled) { (void)r, (void)cancelled; }

const gw_rpc_service gw_health_service = {open_check, check, half_closed, gone};

int gw_epp_ready(lupin_gateway *gw) {
  char why[256];
  return !gw->draining && !gw_not_ready(gw, why, sizeof why);
}
