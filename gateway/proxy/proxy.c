/* The public API: one client request through the runtime and to an endpoint.
 *
 *   POST on every OpenAI-style route vLLM serves (the routes table below)
 *     check the body (in the runtime, per route) -> lupin_request_begin ->
 *     schedule -> forward the body (unchanged, but for the EPP's model-name
 *     rewrite) to the primary pick -> relay the response as
 *     it arrives, each piece to the runtime -> lupin_request_end, on every
 *     path, with its outcome
 *
 *     An attempt that fails before any byte reached the client is sent again
 *     only when that is provably harmless -- the request never left (connect
 *     failed, or a pooled connection was found closed before the write) --
 *     or the config allows it (retryNonIdempotent: the endpoint closed the
 *     connection after the request was written, without answering, and may
 *     have generated).  The next attempt goes to the next pick, then to the
 *     runtime's ranked fallbacks (lupin_request_fallbacks), under a retry
 *     budget.  Each attempt is reported to the endpoint's health (health.c),
 *     counted, logged at info when retried, and listed in the access log.
 *   POST on any other path
 *     the same, the config's parsers (requestHandler.parsers) deciding: a
 *     parser claiming a suffix of the path checks it, the fallback forwards
 *     it unread, else the runtime answers 400
 *   GET /v1/models
 *     every endpoint's list, merged
 *
 * Every error is answered in the OpenAI error shape. */
#include "proxy/proxy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

/* The P/D routing headers name hosts a sidecar connects to: only the
 * scheduler sets them, never the client (llm-d's PreRequest clears them). */
static const lh_name routing_names[] = {LH_NAME("x-prefiller-host-port"),
                                        LH_NAME("x-encoder-hosts-ports"),
                                        LH_NAME("x-data-parallel-host-port")};

int gw_routing_header(const char *name) {
  return lh_name_in(name, routing_names, sizeof routing_names / sizeof *routing_names);
}

/* Headers the EPP convention consumes at the gateway (REFERENCE.md), by
 * llm-d's names and GIE's older ones, and the routing headers.  Every one
 * starts with "x-": most of a request's headers are let through on their
 * first letter. */
static int consumed(const char *name) {
  static const lh_name names[] = {LH_NAME("x-gateway-inference-objective"),
                                  LH_NAME("x-gateway-inference-fairness-id"),
                                  LH_NAME("x-gateway-model-name-rewrite"),
                                  LH_NAME("x-llm-d-inference-objective"),
                                  LH_NAME("x-llm-d-inference-fairness-id"),
                                  LH_NAME("x-llm-d-model-name-rewrite"),
                                  LH_NAME("x-request-id")};
  if ((name[0] | 0x20) != 'x') return 0;
  return gw_routing_header(name) || lh_name_in(name, names, sizeof names / sizeof *names) ||
         !strncasecmp(name, "x-gateway-destination-endpoint", 30) || gw_explain_header(name);
}

static void count(lupin_gateway *gw, int status) {
  if (status >= 100 && status < 600) gw->stats.by_status[status]++;
}

/* The access log's lines wait in gw->access_log for the end of the loop's
 * iteration (gw_access_log_flush): one write for all the requests an
 * iteration ended, not one each, and a buffer reused, not one a line. */
enum { ACCESS_LOG_FLUSH_BYTES = 64 << 10 };

void gw_access_log_flush(lupin_gateway *gw) {
  lh_buf *b = &gw->access_log;
  if (!b->len) return;
  fwrite(b->data, 1, b->len, stdout);
  fflush(stdout);
  b->len = 0;
}

static void log_access(lupin_gateway *gw, const gw_exchange *x, const char *path, const char *id,
                       int status, const char *outcome) {
  if (gw->opts.log_level < LUPIN_LOG_INFO) return;
  lh_buf *b = &gw->access_log;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  lh_access a = {
      .ts = (double)now.tv_sec + now.tv_nsec / 1e9,
      .id = id,
      .path = path,
      .model = x && x->model ? x->model : "",
      .endpoint = x && x->ep ? x->ep->hostport : "",
      .status = status,
      .scheduling_us = x ? x->sched_us : 0,
      .total_ms = x ? (lupin_now() - x->started) * 1000 : 0,
      .outcome = outcome,
      .attempts = x ? x->attempt_log.data : NULL,
      .attempts_len = x ? x->attempt_log.len : 0,
  };
  lh_access_line(b, &a);
  if (b->len >= ACCESS_LOG_FLUSH_BYTES) gw_access_log_flush(gw);
}

/* --- ending an exchange -------------------------------------------------- */

/* The EPP's error code of a request that ended with outcome and status; -1
 * when it is no error (a success, or the client went away). */
static int error_code(const gw_exchange *x, lupin_outcome outcome, int status) {
  switch (outcome) {
  case LUPIN_CANCELLED:
    return -1;
  case LUPIN_NO_ENDPOINT:
    return GW_ERR_EXHAUSTED;
  case LUPIN_REJECTED: /* 429: shed under load, as the EPP's saturation detector does */
    return status == 429 ? GW_ERR_EXHAUSTED : GW_ERR_BAD_REQUEST;
  case LUPIN_PLUGIN_ERROR:
    return GW_ERR_INTERNAL;
  case LUPIN_INVALID_REQUEST:
    return GW_ERR_BAD_REQUEST;
  case LUPIN_QUEUE_TTL: /* flow control: the pool stayed saturated */
  case LUPIN_QUEUE_FULL:
  case LUPIN_SHED:
  case LUPIN_EVICTED:
    return GW_ERR_EXHAUSTED;
  default: /* scheduled: the endpoint's answer, or none */
    return x->objective && outcome == LUPIN_OK && status == 200 ? -1 : GW_ERR_MODEL_SERVER;
  }
}

/* The request's end in the EPP's per-model series (objective.c). */
static void objective_end(gw_exchange *x, lupin_outcome outcome, int status) {
  gw_objective *o = x->objective;
  if (o) o->running--;
  int code = error_code(x, outcome, status);
  if (code < 0) {
    if (o && outcome == LUPIN_OK) {
      lh_histogram_observe(&o->duration, LH_M_OBJ_DURATION, lupin_now() - x->started);
      lh_histogram_observe(&o->response_sizes, LH_M_OBJ_RESPONSE_SIZES, (double)x->response_bytes);
    }
    return;
  }
  if (!o) o = gw_objective_get(x->gw, x->requested ? x->requested : x->model, x->model);
  if (o) o->errors[code]++;
}

/* A request left the flow-control queue: its wait, by band and why. */
static void flow_left(gw_exchange *x, const char *why) {
  lupin_flow_place p;
  lupin_request_flow(x->req, &p);
  gw_flow_observe(x->gw, p.priority, why, p.waited);
  x->queued = 0;
}

/* Ended exchanges kept for the next (at most SPARE_EXCHANGES, sized as
 * upstream.c's spares), with the capacity of their connect-error and
 * attempt-log buffers: a request allocates no exchange in the steady state.
 * Under ASan a spare is poisoned: a callback left pointing at an ended
 * exchange is still reported, as when it was freed. */
enum { SPARE_EXCHANGES = 256, SPARE_LOG_BYTES = 4096 };

#if defined(__SANITIZE_ADDRESS__)
#define SPARE_POISON(x)   __asan_poison_memory_region((x), sizeof *(x))
#define SPARE_UNPOISON(x) __asan_unpoison_memory_region((x), sizeof *(x))
#else
#define SPARE_POISON(x)   ((void)(x))
#define SPARE_UNPOISON(x) ((void)(x))
#endif

static gw_exchange *exchange_new(lupin_gateway *gw) {
  gw_exchange *x = gw->spare_exchanges;
  if (!x) return calloc(1, sizeof *x);
  SPARE_UNPOISON(x);
  gw->spare_exchanges = x->next;
  gw->n_spare_exchanges--;
  *x = (gw_exchange){.connect_errors = {x->connect_errors.data, 0, x->connect_errors.cap},
                     .attempt_log = {x->attempt_log.data, 0, x->attempt_log.cap}};
  return x;
}

static void exchange_free(gw_exchange *x) {
  lh_buf_free(&x->connect_errors);
  lh_buf_free(&x->attempt_log);
  free(x);
}

static void exchange_recycle(lupin_gateway *gw, gw_exchange *x) {
  free(x->own_path);
  x->own_path = NULL;
  if (gw->n_spare_exchanges >= SPARE_EXCHANGES) {
    exchange_free(x);
    return;
  }
  if (x->connect_errors.cap > SPARE_LOG_BYTES) lh_buf_free(&x->connect_errors);
  if (x->attempt_log.cap > SPARE_LOG_BYTES) lh_buf_free(&x->attempt_log);
  x->next = gw->spare_exchanges;
  gw->spare_exchanges = x;
  gw->n_spare_exchanges++;
  SPARE_POISON(x);
}

void gw_proxy_free_spares(lupin_gateway *gw) {
  while (gw->spare_exchanges) {
    gw_exchange *x = gw->spare_exchanges;
    SPARE_UNPOISON(x);
    gw->spare_exchanges = x->next;
    exchange_free(x);
  }
  gw->n_spare_exchanges = 0;
}

static void end(gw_exchange *x, lupin_outcome outcome, int status) {
  lupin_gateway *gw = x->gw;
  if (x->front && x->front->ended) x->front->ended(x);
  if (x->conn) gw_conn_on_abort(x->conn, NULL, NULL);
  gw->stats.by_outcome[outcome & 15]++;
  if (x->queued) flow_left(x, "cancelled");
  count(gw, status);
  objective_end(x, outcome, status);
  /* an endpoint's own error status, relayed, is the request's outcome "ok"
   * for the plugins; the access log tells it apart */
  const char *name =
      outcome == LUPIN_OK && status >= 400 ? "endpoint_error" : lupin_outcome_name(outcome);
  log_access(gw, x, x->path, lupin_request_id(x->req), status, name);
  gw_explain_ended(x, status, name);
  lupin_request_end(x->req, outcome);
  /* a place freed: the workers holding requests send them now, not at their tick */
  if (lupin_runtime_flow_elsewhere(gw->rt)) gw_workers_post(gw, gw_flow_pump, NULL, NULL);
  if (x->prev)
    x->prev->next = x->next;
  else
    gw->exchanges = x->next;
  if (x->next) x->next->prev = x->prev;
  gw->n_exchanges--;
  if (x->ep) gw_endpoint_unref(x->ep);
  if (x->retrying) gw->n_retrying--;
  free(x->explain_summary);
  free(x->requested);
  exchange_recycle(gw, x);
  gw_check_drained(gw);
}

/* llm-d's x-llm-d-request-dropped-reason for a request refused before it
 * reached an endpoint, or evicted after (enableEviction), or NULL when the
 * refusal is no drop (a bad request, a plugin's error).  Upstream's words:
 * "saturated" is a pool with endpoints but no room for this one (429),
 * "no-endpoints" a pool with none to offer (503), so a queue's refusal in
 * an empty pool is the latter. */
const char *gw_drop_reason(const lupin_gateway *gw, lupin_outcome outcome, int status) {
  switch (outcome) {
  case LUPIN_NO_ENDPOINT:
    return GW_DROP_NO_ENDPOINTS;
  case LUPIN_REJECTED:
    return status == 429 ? GW_DROP_SATURATED : NULL;
  case LUPIN_QUEUE_TTL: /* 503: the pool had no endpoints (flow.lua) */
    return status == 503 ? GW_DROP_NO_ENDPOINTS : GW_DROP_TTL_EXPIRED;
  case LUPIN_QUEUE_FULL:
    return status == 503 ? GW_DROP_NO_ENDPOINTS : GW_DROP_SATURATED;
  case LUPIN_SHED: /* the drain's, or room made for a higher priority */
    return gw->draining ? GW_DROP_SHUTTING_DOWN : GW_DROP_SATURATED;
  case LUPIN_CANCELLED: /* only the drain answers a cancelled request */
    return status == 503 && gw->draining ? GW_DROP_SHUTTING_DOWN : NULL;
  case LUPIN_EVICTED: /* upstream's generic value, as its evictor sets */
    return GW_DROP_EVICTED;
  default:
    return NULL;
  }
}

static void fail_param(gw_exchange *x, int status, const char *message, const char *param,
                       lupin_outcome outcome) {
  lupin_header h[4] = {{"x-request-id", lupin_request_id(x->req)}};
  size_t n = 1;
  const char *drop = gw_drop_reason(x->gw, outcome, status);
  if (drop) h[n++] = (lupin_header){GW_DROP_HEADER, drop};
  n += gw_explain_headers(x, h + n);
  if (x->front)
    x->front->refused(x, status, message, param, h, n);
  else
    gw_conn_error(x->conn, status, message, param, h, n);
  x->conn = NULL;
  end(x, outcome, status);
}

void gw_exchange_end(gw_exchange *x, lupin_outcome outcome, int status) { end(x, outcome, status); }

static void fail(gw_exchange *x, int status, const char *message, lupin_outcome outcome) {
  fail_param(x, status, message, NULL, outcome);
}

/* The client went away: stop the upstream request too. */
static void attempt_log(gw_exchange *x, const char *reason, const char *detail);

static void on_client_abort(void *owner) {
  gw_exchange *x = owner;
  x->conn = NULL;
  if (x->up) {
    gw_upstream_cancel(x->up);
    attempt_log(x, "cancelled", NULL);
  }
  x->up = NULL;
  end(x, LUPIN_CANCELLED, 499);
}

/* The drain ran out of time: end what is still in flight. */
void gw_proxy_cancel_all(lupin_gateway *gw) {
  while (gw->exchanges) {
    gw_exchange *x = gw->exchanges;
    if (x->up) gw_upstream_cancel(x->up);
    x->up = NULL;
    if (x->front) {
      x->front->cancel(x);
      continue;
    }
    if (x->conn && !x->started_response) {
      fail(x, 503, "the gateway is shutting down: retry on another instance", LUPIN_CANCELLED);
      continue;
    }
    if (x->conn) gw_conn_abort(x->conn);
    x->conn = NULL;
    end(x, LUPIN_CANCELLED, x->status);
  }
}

/* --- the upstream response ----------------------------------------------- */

/* The endpoint that served the request (the EPP protocol's
 * x-gateway-destination-endpoint-served, which the data plane reports):
 * plugins see it among the response headers, the client gets it too. */
#define SERVED "x-gateway-destination-endpoint-served"

static void on_headers(void *ud, int status, const lh_headers *h, int64_t cl) {
  gw_exchange *x = ud;
  x->status = status;
  lupin_header seen[LH_MAX_HEADERS + 1]; /* upstream.c refuses more */
  size_t n_seen = 0;
  for (size_t i = 0; i < h->n; i++)
    if (!lh_name_is(h->v[i].name, SERVED)) seen[n_seen++] = h->v[i];
  seen[n_seen++] = (lupin_header){SERVED, x->ep->hostport};
  lupin_request_response_header(x->req, status, seen, n_seen);
  const lupin_header *extra;
  size_t n_extra = lupin_request_client_headers(x->req, &extra);
  if (n_extra > LH_MAX_HEADERS) n_extra = LH_MAX_HEADERS; /* scheduled() refused more */
  lupin_header out[2 * LH_MAX_HEADERS + 8];
  size_t n = 0;
  for (size_t i = 0; i < n_seen; i++)
    if (!lh_name_is(seen[i].name, "x-request-id")) out[n++] = seen[i];
  for (size_t i = 0; i < n_extra; i++)
    out[n++] = extra[i];
  out[n++] = (lupin_header){"x-request-id", lupin_request_id(x->req)};
  out[n++] = (lupin_header){"x-gateway-destination-endpoint", x->ep->hostport};
  n += gw_explain_headers(x, out + n);
  /* a streamed response: what each read from the endpoint brings (head,
   * chunks, end) leaves together when the read is handled (on_read_end) */
  x->streamed = cl < 0;
  if (x->streamed) gw_conn_cork(x->conn);
  gw_conn_start(x->conn, status, out, n, cl);
  x->started_response = 1;
}

static void on_read_end(void *ud) {
  gw_exchange *x = ud;
  if (x->conn) gw_conn_uncork(x->conn);
}

/* The client reads slower than the endpoint writes: stop reading upstream
 * until what is queued for the client has gone, so memory stays bounded. */
#define BACKLOG_LIMIT (1 << 20)

static void on_client_drained(void *owner) {
  gw_exchange *x = owner;
  if (x->up) gw_upstream_pause(x->up, 0);
}

static void on_body(void *ud, const char *data, size_t len) {
  gw_exchange *x = ud;
  x->response_bytes += len;
  lupin_request_response_chunk(x->req, data, len);
  /* the reads after the head's too: one read often holds several chunks and
   * the end, which would otherwise be a write each */
  if (x->streamed) gw_conn_cork(x->conn);
  gw_conn_write(x->conn, data, len);
  if (gw_conn_backlog(x->conn) > BACKLOG_LIMIT && x->up) {
    gw_upstream_pause(x->up, 1);
    gw_conn_on_drain(x->conn, on_client_drained, x);
  }
}

static void try_picks(gw_exchange *x, int any);
static const lupin_pick *target(gw_exchange *x, size_t i);

/* The access log's entry of an attempt (an explain record's too): the
 * endpoint, whether it was a pick or a ranked fallback, its status, or the
 * reason it failed (which is why the next attempt was made) and the detail. */
static void attempt_log(gw_exchange *x, const char *reason, const char *detail) {
  if (x->gw->opts.log_level < LUPIN_LOG_INFO && x->explain <= 0) return;
  double ms = (lupin_now() - x->attempt_started) * 1000;
  lh_buf *b = &x->attempt_log;
  lh_buf_str(b, b->len ? ",{\"endpoint\":" : "{\"endpoint\":");
  lh_buf_json(b, x->ep->hostport);
  lh_buf_str(b, ",\"name\":");
  lh_buf_json(b, x->ep->name);
  lh_buf_str(b, x->pick < x->result.n_picks ? ",\"via\":\"pick\"" : ",\"via\":\"fallback\"");
  if (reason) {
    lh_buf_str(b, ",\"reason\":\"");
    lh_buf_str(b, reason);
    lh_buf_str(b, "\"");
    if (detail) {
      lh_buf_str(b, ",\"detail\":");
      lh_buf_json(b, detail);
    }
  } else {
    lh_buf_str(b, ",\"status\":");
    lh_buf_fixed(b, x->status, 0);
  }
  lh_buf_str(b, ",\"ms\":");
  lh_buf_fixed(b, ms, 3);
  lh_buf_str(b, "}");
}

/* One finished attempt: the access log's entry, the endpoint's health. */
static void attempt_over(gw_exchange *x, gw_upstream_error e, const char *detail) {
  attempt_log(x, e == GW_UP_OK ? NULL : gw_failure_name(e), detail);
  gw_health_request(x->ep, e, x->status, x->reused, detail);
}

/* Envoy's retry budget: retries in flight at most retryBudgetPercent of the
 * requests in flight, or retryBudgetMin, whichever is more. */
static int budget_allows(gw_exchange *x) {
  lupin_gateway *gw = x->gw;
  if (x->retrying) return 1; /* already counted */
  uint64_t cap = gw->n_exchanges * gw->set.retry_budget_percent / 100;
  if (cap < gw->set.retry_budget_min) cap = gw->set.retry_budget_min;
  if (gw->n_retrying >= cap) return 0;
  x->retrying = 1;
  gw->n_retrying++;
  return 1;
}

/* Whether a failed attempt may be sent again, and where: 1 the next target,
 * 0 the same endpoint, -1 not at all (*why says why not). */
static int retry_plan(gw_exchange *x, gw_upstream_error e, const char **why) {
  switch (e) {
  case GW_UP_CONNECT:
  case GW_UP_CONNECT_TIMEOUT:
    return 1;
  case GW_UP_NOT_SENT: /* a fresh connection to the same endpoint, twice at most */
    return ++x->resends <= 2 ? 0 : 1;
  case GW_UP_CLOSED:
    if (x->replays < (int)x->gw->set.retry_non_idempotent) {
      x->replays++;
      return 1;
    }
    *why = "not sent again: the endpoint may have processed it (gateway.retryNonIdempotent "
           "allows replays)";
    return -1;
  default:
    *why = NULL;
    return -1;
  }
}

static void on_done(void *ud, gw_upstream_error e, const char *detail) {
  gw_exchange *x = ud;
  x->up = NULL;
  attempt_over(x, e, detail);
  if (e == GW_UP_OK) {
    lupin_request_response_complete(x->req);
    gw_conn_end(x->conn);
    x->conn = NULL;
    end(x, x->status >= 500 ? LUPIN_UPSTREAM_ERROR : LUPIN_OK, x->status);
    return;
  }
  int timeout = e == GW_UP_FIRST_BYTE_TIMEOUT || e == GW_UP_IDLE_TIMEOUT;
  lupin_outcome outcome = timeout ? LUPIN_TIMEOUT : LUPIN_UPSTREAM_ERROR;
  if (x->started_response) { /* too late for an error status: cut the response short */
    gw_log(x->gw, LUPIN_LOG_WARN, "request %s: %s failed mid-response: %s",
           lupin_request_id(x->req), x->ep->hostport, detail);
    gw_conn_abort(x->conn);
    x->conn = NULL;
    end(x, outcome, x->status);
    return;
  }
  lh_buf_printf(&x->connect_errors, "%s%s (%s)", x->connect_errors.len ? ", " : "", x->ep->hostport,
                detail);
  const char *why = NULL;
  int plan = retry_plan(x, e, &why);
  if (plan >= 0 && !budget_allows(x)) {
    x->gw->retries_denied++;
    plan = -1;
    why = "not sent again: the retry budget is spent (gateway.retryBudgetPercent)";
  }
  if (plan < 0) {
    char msg[768];
    snprintf(msg, sizeof msg, "endpoint %s (%s) failed: %s%s%s", x->ep->name, x->ep->hostport,
             detail, why ? "; " : "", why ? why : "");
    fail(x, timeout ? 504 : 502, msg, outcome);
    return;
  }
  x->ep->health.retries[e]++;
  gw_log(x->gw, LUPIN_LOG_INFO, "request %s: attempt %d to %s failed (%s: %s), sending it again",
         lupin_request_id(x->req), x->attempts, x->ep->hostport, gw_failure_name(e), detail);
  x->timed_out_connects += e == GW_UP_CONNECT_TIMEOUT;
  x->failed_connects++;
  if (plan == 0) {
    try_picks(x, 1);
    return;
  }
  x->pick++;
  int back = e == GW_UP_CLOSED && !target(x, x->pick); /* a replay with nowhere else to go */
  if (back) x->pick--;
  try_picks(x, back);
}

static const gw_upstream_cb proxy_cb = {on_headers, on_body, on_done, on_read_end};

/* The upstream request's headers: the client's, minus the connection's and
 * the ones the gateway consumes, with the plugins' and the destination. */
static size_t upstream_headers(gw_exchange *x, lupin_header *out) {
  const lh_headers *in = &x->http->headers;
  const lupin_result *r = &x->result;
  size_t n = 0;
  for (size_t i = 0; i < in->n; i++) {
    const char *name = in->v[i].name;
    int overridden = 0;
    for (size_t j = 0; j < r->n_headers && !overridden; j++)
      overridden = !strcasecmp(name, r->headers[j].name);
    if (!overridden && !consumed(name) && !lh_hop_by_hop(name)) out[n++] = in->v[i];
  }
  for (size_t j = 0; j < r->n_headers; j++)
    out[n++] = r->headers[j];
  out[n++] = (lupin_header){"x-request-id", lupin_request_id(x->req)};
  out[n++] = (lupin_header){"x-gateway-destination-endpoint", x->ep->hostport};
  return n;
}

static void all_picks_failed(gw_exchange *x) {
  char msg[1024];
  snprintf(msg, sizeof msg,
           "could not send the request to any endpoint the scheduler picked or ranked next: "
           "%s; check that the model servers are up",
           x->connect_errors.len ? x->connect_errors.data : "none reachable");
  int timeout = x->failed_connects && x->timed_out_connects == x->failed_connects;
  fail(x, timeout ? 504 : 502, msg, timeout ? LUPIN_TIMEOUT : LUPIN_UPSTREAM_ERROR);
}

/* Target i: the picks, then the runtime's ranked fallbacks, asked for when
 * first needed. */
static const lupin_pick *target(gw_exchange *x, size_t i) {
  if (i < x->result.n_picks) return &x->result.picks[i];
  if (!x->fallbacks_asked) {
    x->fallbacks_asked = 1;
    x->n_fallbacks = lupin_request_fallbacks(x->req, &x->fallbacks);
  }
  i -= x->result.n_picks;
  return i < x->n_fallbacks ? &x->fallbacks[i] : NULL;
}

static int start_attempt(gw_exchange *x, gw_endpoint *ep) {
  lupin_gateway *gw = x->gw;
  gw_endpoint_ref(ep);
  x->ep = ep;
  x->status = 0;
  lupin_header h[2 * LH_MAX_HEADERS + 2]; /* server.c and scheduled() refuse more */
  size_t n = upstream_headers(x, h);
  gw_timeouts t = {gw->set.connect_timeout_ms, gw->set.first_byte_timeout_ms,
                   gw->set.idle_timeout_ms};
  x->attempts++;
  x->attempt_started = lupin_now();
  x->up = gw_upstream_start(ep, "POST", x->http->url, h, n, x->http->body.data, x->http->body.len,
                            t, &proxy_cb, x);
  if (x->up) {
    x->reused = gw_upstream_reused(x->up);
    return 0;
  }
  gw_endpoint_unref(ep);
  x->ep = NULL;
  return -1;
}

/* From target x->pick on, the first endpoint still there and healthy (any:
 * target x->pick even when it is not: the scheduled pick, or the endpoint a
 * request is resent to). */
static void try_picks(gw_exchange *x, int any) {
  lupin_gateway *gw = x->gw;
  if (x->ep) gw_endpoint_unref(x->ep);
  x->ep = NULL;
  for (const lupin_pick *p; (p = target(x, x->pick)); x->pick++, any = 0) {
    gw_endpoint *ep = gw_endpoint_find(gw, p->name);
    if (!ep || (!any && ep->health.state != LH_HEALTHY)) continue; /* removed or ejected */
    if (!start_attempt(x, ep)) return;
  }
  all_picks_failed(x);
}

/* --- a scheduled request ------------------------------------------------- */

static void observe_scheduling(lupin_gateway *gw, double seconds) {
  lh_histogram_observe(&gw->stats.sched, LH_M_SCHEDULING, seconds);
  lh_histogram_observe(&gw->stats.sched_epp, LH_M_SCHEDULER_E2E, seconds);
}

/* A request scheduled: counted, sized and running in the EPP's series. */
static void objective_begin(gw_exchange *x) {
  gw_objective *o = x->objective =
      gw_objective_get(x->gw, x->requested ? x->requested : x->model, x->model);
  if (!o) return;
  o->requests++;
  o->running++;
  lh_histogram_observe(&o->request_sizes, LH_M_OBJ_REQUEST_SIZES, (double)x->http->body.len);
}

/* x-gateway-destination-endpoint-subset: "ip:port, ip:port" */
static size_t parse_subset(char *list, const char **out, size_t max) {
  size_t n = 0;
  for (char *save = NULL, *tok = strtok_r(list, ", ", &save); tok && n < max;
       tok = strtok_r(NULL, ", ", &save))
    out[n++] = tok;
  return n;
}

void gw_proxy_answered(lupin_gateway *gw, const char *path, const char *id, int status,
                       const char *outcome) {
  count(gw, status);
  log_access(gw, NULL, path, id, status, outcome);
}

/* Answers a request that never reached the runtime (bad request, route). */
static void answered(lupin_gateway *gw, gw_conn *c, const char *path, int status) {
  gw_proxy_answered(gw, path, gw_conn_request_id(c), status,
                    status < 300   ? "ok"
                    : status < 500 ? "bad_request"
                                   : "error");
}

static void reply_error(lupin_gateway *gw, gw_conn *c, const char *path, int status,
                        const char *msg, const char *param) {
  answered(gw, c, path, status);
  gw_conn_error(c, status, msg, param, NULL, 0);
}

static void scheduled(lupin_gateway *gw, gw_exchange *x, int status);

static void schedule(lupin_gateway *gw, gw_exchange *x) {
  double t0 = lupin_now();
  int status = lupin_request_schedule(x->req, &x->result);
  double dt = lupin_now() - t0;
  x->sched_us = dt * 1e6;
  observe_scheduling(gw, dt);
  if (status == LUPIN_QUEUED) { /* flow control holds it: gw_proxy_dispatched answers */
    x->queued = 1;
    return;
  }
  scheduled(gw, x, status);
}

/* The flow-control queue let a request go, or answered it (TTL, full, shed,
 * drain): on as if scheduling had just answered. */
void gw_proxy_dispatched(void *ud, lupin_request *req, const lupin_result *res) {
  gw_exchange *x = lupin_request_data(req);
  if (!x) return;
  x->result = *res;
  flow_left(x, res->status == 200 ? "dispatched" : lupin_outcome_name(res->outcome));
  scheduled(ud, x, res->status);
}

/* enableEviction: flow control takes back a sheddable request it let go.
 * Stopped at its endpoint; its client gets 429 and the reason if nothing
 * of the response went yet, else its response is cut short (lupin epp:
 * Envoy gets the immediate response, which resets its upstream request). */
void gw_proxy_evict(void *ud, lupin_request *req, const char *message) {
  gw_exchange *x = lupin_request_data(req);
  (void)ud;
  if (!x) return;
  gw_log(x->gw, LUPIN_LOG_INFO, "request %s: %s", lupin_request_id(req), message);
  if (x->up) {
    gw_upstream_cancel(x->up);
    attempt_log(x, "evicted", NULL);
    x->up = NULL;
  }
  if (x->front || (x->conn && !x->started_response)) {
    fail(x, 429, message, LUPIN_EVICTED);
    return;
  }
  if (x->conn) gw_conn_abort(x->conn);
  x->conn = NULL;
  end(x, LUPIN_EVICTED, x->status);
}

static void scheduled(lupin_gateway *gw, gw_exchange *x, int status) {
  gw_explain_scheduled(x);
  if (status == 200 && x->result.n_headers > LH_MAX_HEADERS) {
    fail(x, 500, "the plugins set more headers than the gateway forwards", LUPIN_PLUGIN_ERROR);
    return;
  }
  if (status == 200) {
    objective_begin(x);
    if (x->front)
      x->front->picked(x);
    else
      try_picks(x, 1);
    return;
  }
  lupin_outcome o = (lupin_outcome)x->result.outcome;
  const char *msg = x->result.message ? x->result.message : "scheduling failed";
  if (o == LUPIN_INVALID_REQUEST) {
    fail_param(x, status, msg, x->result.param, o);
    return;
  }
  if (status == 503 && gw->n_endpoints && !gw_healthy_endpoints(gw))
    msg = "no healthy endpoint: every endpoint is ejected after failures or has stale metrics "
          "(see /admin/endpoints); retry later";
  fail(x, status, msg, o);
}

/* The EPP's model-name rewrite, by llm-d's header or GIE's: the runtime
 * schedules the request for that model (lupin_request_model gives it back
 * when the body was read), and the body forwarded names it.  Returns the
 * name the body had (malloc'd), NULL when nothing was rewritten. */
static char *rewrite_model(gw_http_request *http, const char *model) {
  const char *to = lh_headers_get(&http->headers, "x-llm-d-model-name-rewrite");
  if (!to) to = lh_headers_get(&http->headers, "x-gateway-model-name-rewrite");
  char *was = NULL;
  if (to && *to && model && !strcmp(model, to))
    lh_model_rewrite(&http->body, lh_headers_get(&http->headers, "content-type"), to, &was);
  return was;
}

/* Begins the runtime's request of an exchange and the exchange: NULL with
 * the status and message to answer when it could not. */
static gw_exchange *exchange_begin(lupin_gateway *gw, const gw_exchange_desc *e, int *status,
                                   const char **why) {
  char msg[1024];
  char *subset_text = NULL;
  const char *subset[256];
  gw_http_request *http = e->http;
  int explain = gw_explain_wanted(gw, http);
  lupin_request_desc d = {.path = e->path,
                          .body = http->body.data,
                          .body_len = http->body.len,
                          .headers = http->headers.v,
                          .n_headers = http->headers.n,
                          .check_body = !e->no_body_check,
                          .flags = explain > 0 ? LUPIN_REQUEST_EXPLAIN : 0};
  lupin_header shown[LH_MAX_HEADERS]; /* server.c refuses more */
  if (explain) {                      /* the admin token is not the plugins' to see */
    d.headers = shown;
    d.n_headers = 0;
    for (size_t i = 0; i < http->headers.n && d.n_headers < LH_MAX_HEADERS; i++)
      if (strcasecmp(http->headers.v[i].name, "x-lupin-admin-token"))
        shown[d.n_headers++] = http->headers.v[i];
  }
  const char *hint = e->subset;
  if (!hint) hint = lh_headers_get(&http->headers, "x-gateway-destination-endpoint-subset");
  *status = 503;
  *why = "the gateway could not allocate memory for this request: retry later";
  if (hint && !(subset_text = strdup(hint))) return NULL; /* not scheduled past the subset */
  if (subset_text) {
    d.subset = subset;
    d.n_subset = parse_subset(subset_text, subset, 256);
  }
  lupin_request *req = lupin_request_begin(gw->rt, &d, msg, sizeof msg);
  free(subset_text);
  *status = 500;
  *why = "internal error while beginning the request";
  if (!req) {
    gw_log(gw, LUPIN_LOG_ERROR, "beginning a request: %s", msg);
    return NULL;
  }
  const char *model = lupin_request_model(req);
  char *requested = rewrite_model(http, model);
  gw_exchange *x = exchange_new(gw);
  if (!x) {
    free(requested);
    lupin_request_end(req, LUPIN_CANCELLED);
    gw_log(gw, LUPIN_LOG_ERROR, "beginning a request: out of memory");
    return NULL;
  }
  x->gw = gw;
  x->http = http;
  x->req = req;
  x->model = model;
  x->requested = requested;
  x->stream = lupin_request_stream(req);
  x->started = http->started;
  x->path = e->path;
  x->explain = explain;
  x->front = e->front;
  x->front_data = e->front_data;
  x->next = gw->exchanges;
  if (gw->exchanges) gw->exchanges->prev = x;
  gw->exchanges = x;
  gw->n_exchanges++;
  lupin_request_set_data(req, x);
  return x;
}

gw_exchange *gw_exchange_begin(lupin_gateway *gw, const gw_exchange_desc *e, int *status,
                               const char **why) {
  gw_exchange *x = exchange_begin(gw, e, status, why);
  if (!x) count(gw, *status);
  return x;
}

void gw_exchange_schedule(gw_exchange *x) { schedule(x->gw, x); }

/* path: a route of gw->routes, or (listed 0) a path of the request's, which
 * the exchange keeps a copy of: the runtime's parsers decide (the config's
 * fallback forwards it unread, else a 400 names the path). */
static void proxy_post(lupin_gateway *gw, gw_conn *c, gw_http_request *http, const char *path,
                       int listed) {
  int status;
  const char *why;
  char *copy = listed ? NULL : strdup(path);
  if (!listed && !copy) {
    reply_error(gw, c, path, 503, "out of memory for this request: retry later", NULL);
    return;
  }
  gw_exchange_desc e = {.http = http, .path = copy ? copy : path};
  gw_exchange *x = exchange_begin(gw, &e, &status, &why);
  if (!x) {
    reply_error(gw, c, path, status, why, NULL);
    free(copy);
    return;
  }
  x->own_path = copy;
  x->conn = c;
  gw_conn_on_abort(c, on_client_abort, x);
  schedule(gw, x);
}

/* --- GET /v1/models ------------------------------------------------------ */

typedef struct models_call models_call;
typedef struct {
  lupin_gateway *gw;
  gw_conn *conn;
  size_t n, pending;
  models_call *calls;
} models_fan;

struct models_call {
  models_fan *fan;
  gw_upstream *up;
  int status;
  lh_buf body;
};

static void fan_free(models_fan *f) {
  for (size_t i = 0; i < f->n; i++)
    lh_buf_free(&f->calls[i].body);
  free(f->calls);
  free(f);
}

static void models_headers(void *ud, int status, const lh_headers *h, int64_t cl) {
  (void)h;
  (void)cl;
  ((models_call *)ud)->status = status;
}

static void models_body(void *ud, const char *data, size_t len) {
  models_call *m = ud;
  if (m->body.len < 16 << 20) lh_buf_append(&m->body, data, len);
}

static void models_done(void *ud, gw_upstream_error e, const char *detail) {
  (void)detail;
  models_call *m = ud;
  models_fan *f = m->fan;
  m->up = NULL;
  if (e || m->status != 200) lh_buf_free(&m->body);
  if (--f->pending) return;
  gw_conn_on_abort(f->conn, NULL, NULL);
  lh_buf ok[f->n];
  size_t k = 0;
  for (size_t i = 0; i < f->n; i++)
    if (f->calls[i].body.len) ok[k++] = f->calls[i].body;
  char *json = k ? gw_models_merge(ok, k) : NULL;
  if (json) {
    lupin_header h[] = {{"content-type", "application/json"},
                        {"x-request-id", gw_conn_request_id(f->conn)}};
    answered(f->gw, f->conn, "/v1/models", 200);
    gw_conn_respond(f->conn, 200, h, 2, json, strlen(json));
  } else {
    reply_error(f->gw, f->conn, "/v1/models", 502, "no endpoint answered GET /v1/models", NULL);
  }
  free(json);
  fan_free(f);
}

static const gw_upstream_cb models_cb = {models_headers, models_body, models_done, NULL};

static void models_abort(void *owner) {
  models_fan *f = owner;
  for (size_t i = 0; i < f->n; i++)
    gw_upstream_cancel(f->calls[i].up);
  fan_free(f);
}

static void models(lupin_gateway *gw, gw_conn *c) {
  if (!gw->n_endpoints) {
    reply_error(gw, c, "/v1/models", 503,
                "no endpoints in the pool: add some to the config or the endpoints "
                "file",
                NULL);
    return;
  }
  models_fan *f = calloc(1, sizeof *f);
  if (!f || !(f->calls = calloc(gw->n_endpoints, sizeof *f->calls))) {
    free(f);
    reply_error(gw, c, "/v1/models", 503,
                "the gateway could not allocate memory for this request: retry later", NULL);
    return;
  }
  f->gw = gw;
  f->conn = c;
  gw_timeouts t = {gw->set.connect_timeout_ms, gw->set.scrape_timeout_ms,
                   gw->set.scrape_timeout_ms};
  lupin_header accept = {"accept", "application/json"};
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next) {
    models_call *m = &f->calls[f->n++];
    m->fan = f;
    f->pending++;
    m->up = gw_upstream_start(ep, "GET", "/v1/models", &accept, 1, NULL, 0, t, &models_cb, m);
    if (!m->up) f->pending--;
  }
  if (!f->pending) {
    fan_free(f);
    reply_error(gw, c, "/v1/models", 502, "no endpoint answered GET /v1/models", NULL);
    return;
  }
  gw_conn_on_abort(c, models_abort, f);
}

/* --- routing ------------------------------------------------------------- */

/* The POST routes proxied: the runtime's, one row each in
 * lua/lupin/runtime/openai.lua (the model, the fields a body needs, its
 * prompt), so a new route is that row alone.  Read once at start: the
 * runtime's Lua modules do not change under a reload. */
typedef struct route_list {
  lupin_gateway *gw;
  int failed;
} route_list;

static void add_route(void *ud, const char *path) {
  route_list *l = ud;
  lupin_gateway *gw = l->gw;
  char **more = l->failed ? NULL : realloc(gw->routes, (gw->n_routes + 1) * sizeof *more);
  char *copy = more ? strdup(path) : NULL;
  if (more) gw->routes = more;
  if (!copy) {
    l->failed = 1;
    return;
  }
  gw->routes[gw->n_routes++] = copy;
}

int gw_proxy_routes_open(lupin_gateway *gw, char *err, size_t errlen) {
  route_list l = {gw, 0};
  lupin_runtime_routes(gw->rt, add_route, &l);
  if (l.failed || !gw->n_routes) {
    lh_errf(err, errlen, "%s", l.failed ? "out of memory" : "the runtime names no API route");
    return -1;
  }
  return 0;
}

void gw_proxy_routes_free(lupin_gateway *gw) {
  for (size_t i = 0; i < gw->n_routes; i++)
    free(gw->routes[i]);
  free(gw->routes);
  gw->routes = NULL;
  gw->n_routes = 0;
}

static void not_allowed(lupin_gateway *gw, gw_conn *c, const char *path, const char *method) {
  char msg[64];
  snprintf(msg, sizeof msg, "method not allowed: use %s", method);
  lupin_header allow = {"allow", method};
  answered(gw, c, path, 405);
  gw_conn_error(c, 405, msg, NULL, &allow, 1);
}

static void unknown_route(lupin_gateway *gw, gw_conn *c, gw_http_request *req, const char *path) {
  lh_buf msg = {0};
  lh_buf_printf(&msg, "unknown route %s %.300s: this gateway serves POST ",
                http_method_str(req->method), path);
  for (size_t i = 0; i < gw->n_routes; i++)
    lh_buf_printf(&msg, "%s%s", i ? ", " : "", gw->routes[i]);
  lh_buf_printf(&msg, ", POST on other paths as the config's parsers say, and GET /v1/models");
  reply_error(gw, c, path, 404, msg.data ? msg.data : "unknown route", NULL);
  lh_buf_free(&msg);
}

void gw_proxy_handle(void *ud, gw_conn *c, gw_http_request *req) {
  lupin_gateway *gw = ud;
  char path[512]; /* the URL up to its query, cut at 511 bytes */
  size_t len = strcspn(req->url, "?");
  if (len >= sizeof path) len = sizeof path - 1;
  memcpy(path, req->url, len);
  path[len] = 0;
  for (size_t i = 0; i < gw->n_routes; i++) {
    if (strcmp(path, gw->routes[i])) continue;
    if (req->method == HTTP_POST)
      proxy_post(gw, c, req, gw->routes[i], 1);
    else
      not_allowed(gw, c, path, "POST");
    return;
  }
  if (!strcmp(path, "/v1/models")) {
    if (req->method == HTTP_GET)
      models(gw, c);
    else
      not_allowed(gw, c, path, "GET");
    return;
  }
  if (req->method == HTTP_POST) /* the config's parsers decide, as the EPP's do */
    proxy_post(gw, c, req, path, 0);
  else
    unknown_route(gw, c, req, path);
}
