/* proxy.h -- the OpenAI routes of lupin serve: the proxied request and its
 * retries and the model-name rewrite (proxy.c), flow control's view
 * (flow.c), /v1/models merged (models.c), the EPP's per-model series
 * (objective.c) and explain records (explain.c). */
#ifndef LUPIN_GW_PROXY_H
#define LUPIN_GW_PROXY_H

#include "endpoints/endpoints.h"

/* Merges /v1/models answers (models.c); returns a malloc'd JSON text. */
char *gw_models_merge(const lh_buf *bodies, size_t n);

/* --- the EPP's per-model request series (objective.c) --------------------- */

/* Per model name (model_name; target_model_name is the same: lupin does not
 * rewrite models), what the EPP's llm_d_epp_request_* families count. */
enum {
  GW_ERR_BAD_REQUEST,  /* "BadRequest": the body or a plugin refused the request */
  GW_ERR_EXHAUSTED,    /* "InferencePoolResourceExhausted": no endpoint, or shed */
  GW_ERR_INTERNAL,     /* "Internal": a plugin failed */
  GW_ERR_MODEL_SERVER, /* "ModelServerError": not 200 from the endpoint, or none */
  GW_ERRS
};
extern const char *const gw_error_codes[GW_ERRS];

#define GW_MAX_MODELS 100 /* series kept per model name; more share "<other>" */

typedef struct gw_objective {
  char *model;  /* as the client named it */
  char *target; /* as it was sent (the model-name rewrite's) */
  uint64_t requests, errors[GW_ERRS];
  uint64_t running;
  lh_histogram duration, request_sizes, response_sizes;
  struct gw_objective *next;
} gw_objective;

/* The series of model sent as target (NULL: model); created on first use,
 * "<other>" past GW_MAX_MODELS. */
gw_objective *gw_objective_get(lupin_gateway *gw, const char *model, const char *target);
void gw_objectives_free(lupin_gateway *gw);

/* --- the public API (proxy.c) and the admin listener (admin.c) ------------ */

/* The API routes, the runtime's (lupin_runtime_routes), read at start. */
int gw_proxy_routes_open(lupin_gateway *gw, char *err, size_t errlen);
void gw_proxy_routes_free(lupin_gateway *gw);
void gw_proxy_handle(void *gw, gw_conn *c, gw_http_request *req);
void gw_proxy_cancel_all(lupin_gateway *gw);
/* Frees the ended exchanges kept for reuse (at the loop's end). */
void gw_proxy_free_spares(lupin_gateway *gw);
/* The P/D routing headers (x-prefiller-host-port, ...): only the scheduler
 * sets them, a client's never reach an endpoint. */
int gw_routing_header(const char *name);
/* Counts and logs a request answered (or ended) before the runtime saw it. */
void gw_proxy_answered(lupin_gateway *gw, const char *path, const char *id, int status,
                       const char *outcome);
/* llm-d's header naming why a request was dropped (docs/flow-control.md),
 * and the reasons lupin gives: its pkg/common/error values. */
#define GW_DROP_HEADER        "x-llm-d-request-dropped-reason"
#define GW_DROP_SATURATED     "rejected-saturated"
#define GW_DROP_NO_ENDPOINTS  "rejected-no-endpoints"
#define GW_DROP_TTL_EXPIRED   "rejected-ttl-expired"
#define GW_DROP_SHUTTING_DOWN "rejected-shutting-down"
#define GW_DROP_EVICTED       "evicted"
/* The reason for a request the runtime refused (or evicted) with outcome
 * and status, or NULL when that refusal is no drop (a bad request, a
 * plugin's error). */
const char *gw_drop_reason(const lupin_gateway *gw, lupin_outcome outcome, int status);
/* Writes the access log's waiting lines (each loop iteration, and at the end). */
void gw_access_log_flush(lupin_gateway *gw);
/* The runtime's dispatch callback: a queued request's final result. */
void gw_proxy_dispatched(void *gw, lupin_request *req, const lupin_result *res);
/* The runtime's eviction callback (enableEviction): ends a request sent. */
void gw_proxy_evict(void *gw, lupin_request *req, const char *message);

/* --- flow control's view (flow.c, docs/flow-control.md) ------------------- */

/* How long a request waited in the queue of band priority, by how it left
 * ("dispatched", "queue_ttl", "shed", "cancelled"). */
void gw_flow_observe(lupin_gateway *gw, int priority, const char *outcome, double waited);
void gw_flow_metrics(lupin_gateway *gw, lh_expo *e);
/* GET /admin/flows */
void gw_flow_admin(lupin_gateway *gw, gw_conn *c);
/* A gw_task_fn: the worker's queue tries its gate again (another's request ended). */
void gw_flow_pump(lupin_gateway *gw, void *arg);
void gw_flow_free(lupin_gateway *gw);

/* --- explain records (explain.c, docs/explain.md) ------------------------- */

#define GW_EXPLAIN_RING 64 /* records kept for GET /admin/explain/<id> */

/* The request headers explain.c consumes: never forwarded. */
int gw_explain_header(const char *name);
/* Whether a proxied request asks for a record: 0 no, 1 yes and allowed,
 * -1 asked without the admin token (answered with a refusal header). */
int gw_explain_wanted(lupin_gateway *gw, const gw_http_request *req);
/* After scheduling: the summary header of an explained request. */
void gw_explain_scheduled(gw_exchange *x);
/* The response headers of an exchange's record (at most 2); x may be NULL. */
size_t gw_explain_headers(const gw_exchange *x, lupin_header *out);
/* At the end of an exchange: keeps its record, with the attempts. */
void gw_explain_ended(gw_exchange *x, int status, const char *outcome);
/* GET /admin/explain[/<id>], POST /admin/explain. */
void gw_explain_admin(lupin_gateway *gw, gw_conn *c, gw_http_request *req, const char *path);
/* The ring of records: the leader's own (leader NULL), or the leader's. */
int gw_explain_open(lupin_gateway *gw, const lupin_gateway *leader);
void gw_explain_free(lupin_gateway *gw);

/* --- exchanges of another front (epp/): the pick goes back, not upstream -- */

/* What a front other than the HTTP proxy does at an exchange's turns; the
 * proxy's own exchanges have none (front NULL). */
typedef struct gw_front {
  /* scheduled: x->result holds the picks; the front answers, then ends x */
  void (*picked)(gw_exchange *x);
  /* refused (x->result says why): the OpenAI error the client gets, with
   * the headers h; gw_exchange_end follows at once */
  void (*refused)(gw_exchange *x, int status, const char *message, const char *param,
                  const lupin_header *h, size_t n);
  /* the drain ran out of time: the front stops and ends x */
  void (*cancel)(gw_exchange *x);
  /* optional: x ends (any way) and is freed after this returns */
  void (*ended)(gw_exchange *x);
} gw_front;

typedef struct gw_exchange_desc {
  gw_http_request *http; /* the front's, kept until the exchange ends */
  const char *path;      /* a route of gw->routes, or any path with no_body_check */
  int no_body_check;     /* scheduled with no body read (a request without one) */
  const char *subset;    /* "ip:port, ip:port": the data plane's hint; NULL: the header's */
  const gw_front *front;
  void *front_data;
} gw_exchange_desc;

/* Begins an exchange (a runtime request) for a front; NULL with the status
 * and message to answer when it could not. */
gw_exchange *gw_exchange_begin(lupin_gateway *gw, const gw_exchange_desc *e, int *status,
                               const char **why);
/* Schedules it: the front's picked or refused follows, now or (flow
 * control) later. */
void gw_exchange_schedule(gw_exchange *x);
/* Ends it with the request's outcome and the status the client got; x is
 * gone after. */
void gw_exchange_end(gw_exchange *x, lupin_outcome outcome, int status);

/* The linked list of live exchanges, for /admin/requests. */
struct gw_exchange {
  lupin_gateway *gw;
  gw_conn *conn;
  gw_http_request *http;
  lupin_request *req;
  lupin_result result;
  size_t pick;
  gw_endpoint *ep;
  gw_upstream *up;
  const char *model;       /* the model scheduled for (the model-name rewrite's): the core's */
  char *requested;         /* the body's, when a rewrite replaced it */
  gw_objective *objective; /* set once scheduled: counted as running */
  uint64_t response_bytes;
  int stream;
  double started;
  double sched_us;
  int status;
  int started_response; /* headers sent to the client */
  int streamed;         /* the response has no length: each read's pieces leave in one write */
  int failed_connects, timed_out_connects;
  lh_buf connect_errors;
  /* attempts: picks first, then the runtime's ranked fallbacks */
  const lupin_pick *fallbacks;
  size_t n_fallbacks;
  int fallbacks_asked;
  int attempts, replays, resends;
  int retrying; /* counted in gw->n_retrying */
  int reused;   /* the current attempt's connection came from the pool */
  double attempt_started;
  lh_buf attempt_log; /* the access log's "attempts" entries */
  int explain;        /* gw_explain_wanted's answer */
  char *explain_summary;
  char explain_url[300];
  const char *path;
  char *own_path;        /* path's copy when it is no listed route */
  int queued;            /* waiting in the runtime's flow-control queue */
  const gw_front *front; /* NULL: the HTTP proxy's */
  void *front_data;
  gw_exchange *prev, *next;
};

#endif
