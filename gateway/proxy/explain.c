/* Explain records at the gateway (docs/explain.md): why a request went
 * where it went.
 *
 *   x-lupin-explain: 1 on a proxied request
 *     honoured with the admin token in x-lupin-admin-token (or anyone's when
 *     gateway.explainWithoutToken is 1): the response gains x-lupin-explain,
 *     a one-line summary, and x-lupin-explain-record, where the admin
 *     listener serves the full record once the request has ended.  Both
 *     request headers are consumed here and never forwarded.
 *   GET  /admin/explain        the ids of the records kept, newest first
 *   GET  /admin/explain/<id>   one record: the runtime's, plus the attempts
 *   POST /admin/explain        an OpenAI body (its headers as the request's)
 *                              scheduled against the live endpoints, decided
 *                              and explained, never forwarded
 *
 * The admin token travels in a header of its own, not Authorization: that
 * one belongs to the model servers (vLLM's --api-key) and is forwarded.
 * Records are kept in a ring of GW_EXPLAIN_RING: memory stays bounded
 * whoever asks, and an old record simply ages out. */
#include "proxy/proxy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One ring for the process (host/explain_ring.c): the leader makes it,
 * every worker keeps its records there, the admin API reads it. */
int gw_explain_open(lupin_gateway *gw, const lupin_gateway *leader) {
  gw->explain_ring = leader ? leader->explain_ring : lh_explain_ring_new(GW_EXPLAIN_RING);
  return gw->explain_ring ? 0 : -1;
}

void gw_explain_free(lupin_gateway *gw) {
  lh_explain_ring *r = gw->explain_ring;
  gw->explain_ring = NULL;
  if (!gw->worker) lh_explain_ring_free(r); /* the leader's: freed once every worker is gone */
}

/* --- the request header -------------------------------------------------- */

int gw_explain_header(const char *name) {
  return lh_name_is(name, "x-lupin-explain") || lh_name_is(name, "x-lupin-admin-token");
}

int gw_explain_wanted(lupin_gateway *gw, const gw_http_request *req) {
  const char *ask = lh_headers_get(&req->headers, "x-lupin-explain");
  if (!ask || strcmp(ask, "1")) return 0;
  if (gw->set.explain_without_token) return 1;
  const char *token = gw->opts.admin_token, *given;
  given = lh_headers_get(&req->headers, "x-lupin-admin-token");
  return token && *token && given && lh_same_secret(given, token) ? 1 : -1;
}

static const char *refusal(void) {
  return "refused: send the admin token in x-lupin-admin-token, or set "
         "gateway.explainWithoutToken to 1";
}

void gw_explain_scheduled(gw_exchange *x) {
  if (x->explain <= 0) return;
  const char *summary = lupin_request_explain(x->req, LUPIN_EXPLAIN_SUMMARY, NULL);
  x->explain_summary = strdup(summary ? summary : "unavailable: see the gateway's log");
  snprintf(x->explain_url, sizeof x->explain_url, "/admin/explain/%s", lupin_request_id(x->req));
}

size_t gw_explain_headers(const gw_exchange *x, lupin_header *out) {
  if (!x || !x->explain) return 0;
  if (x->explain < 0) {
    out[0] = (lupin_header){"x-lupin-explain", refusal()};
    return 1;
  }
  out[0] = (lupin_header){"x-lupin-explain", x->explain_summary ? x->explain_summary : ""};
  out[1] = (lupin_header){"x-lupin-explain-record", x->explain_url};
  return 2;
}

/* The runtime's record with the gateway's part: the answer and every attempt. */
void gw_explain_ended(gw_exchange *x, int status, const char *outcome) {
  if (x->explain <= 0) return;
  lh_buf b = {0};
  if (lh_explain_record(&b, x->req, status, outcome, (lupin_now() - x->started) * 1000,
                        x->attempt_log.data, x->attempt_log.len))
    return;
  if (b.data) lh_explain_keep(x->gw->explain_ring, lupin_request_id(x->req), b.data);
  free(x->explain_summary);
  x->explain_summary = NULL;
}

/* --- the admin routes ---------------------------------------------------- */

static void reply_json(gw_conn *c, int status, const char *json, size_t len) {
  lupin_header h = {"content-type", "application/json"};
  gw_conn_respond(c, status, &h, 1, json, len);
}

static void list(lupin_gateway *gw, gw_conn *c) {
  lh_buf b = {0};
  lh_explain_ids(&b, gw->explain_ring);
  reply_json(c, 200, b.data, b.len);
  lh_buf_free(&b);
}

static void one(lupin_gateway *gw, gw_conn *c, const char *id) {
  char *json = lh_explain_find(gw->explain_ring, id);
  if (json) {
    reply_json(c, 200, json, strlen(json));
    free(json);
    return;
  }
  char msg[512];
  snprintf(msg, sizeof msg,
           "no explain record for request %.200s: the gateway keeps the last %d explained "
           "requests, once they have ended (ask with x-lupin-explain: 1)",
           id, GW_EXPLAIN_RING);
  gw_conn_error(c, 404, msg, NULL, NULL, 0);
}

/* The headers of the admin request as the explained request's: minus its
 * credentials, which are the admin API's, not the request's. */
static size_t request_headers(const gw_http_request *req, lupin_header *out) {
  size_t n = 0;
  for (size_t i = 0; i < req->headers.n; i++) {
    const char *name = req->headers.v[i].name;
    if (strcasecmp(name, "authorization") && !gw_explain_header(name) && !lh_hop_by_hop(name))
      out[n++] = req->headers.v[i];
  }
  return n;
}

/* Decides one request against the live endpoints, for its record only:
 * the body checked as the public API checks it, its path its own (chat when
 * it has "messages"). */
static void decide(lupin_gateway *gw, gw_conn *c, gw_http_request *req) {
  char msg[1024];
  lupin_header h[LH_MAX_HEADERS]; /* server.c refuses more */
  char *subset_text = NULL;
  const char *subset[256];
  lupin_request_desc d = {.body = req->body.data ? req->body.data : "",
                          .body_len = req->body.len,
                          .headers = h,
                          .n_headers = request_headers(req, h),
                          .check_body = 1,
                          .flags = LUPIN_REQUEST_EXPLAIN | LUPIN_REQUEST_DRY_RUN};
  const char *hint = lh_headers_get(&req->headers, "x-gateway-destination-endpoint-subset");
  if (hint && !(subset_text = strdup(hint))) {
    gw_conn_error(c, 503, "the gateway could not allocate memory for this request: retry later",
                  NULL, NULL, 0);
    return;
  }
  if (subset_text) {
    d.subset = subset;
    for (char *save = NULL, *tok = strtok_r(subset_text, ", ", &save); tok && d.n_subset < 256;
         tok = strtok_r(NULL, ", ", &save))
      subset[d.n_subset++] = tok;
  }
  lupin_request *lr = lupin_request_begin(gw->rt, &d, msg, sizeof msg);
  free(subset_text);
  if (!lr) {
    gw_conn_error(c, 500, msg, NULL, NULL, 0);
    return;
  }
  lupin_result res;
  size_t len;
  const char *json = NULL;
  if (lupin_request_schedule(lr, &res) == 400) /* a bad body: the public API's answer */
    gw_conn_error(c, 400, res.message, res.param, NULL, 0);
  else if ((json = lupin_request_explain(lr, LUPIN_EXPLAIN_JSON, &len)))
    reply_json(c, 200, json, len);
  else
    gw_conn_error(c, 500, "the explain record could not be made: see the gateway's log", NULL, NULL,
                  0);
  lupin_request_end(lr, LUPIN_OK);
}

void gw_explain_admin(lupin_gateway *gw, gw_conn *c, gw_http_request *req, const char *path) {
  const char *rest = path + strlen("/admin/explain");
  if (!*rest && req->method == HTTP_POST)
    decide(gw, c, req);
  else if (req->method != HTTP_GET)
    gw_conn_error(c, 405,
                  "method not allowed: POST /admin/explain with a request body, GET "
                  "/admin/explain/<request id>",
                  NULL, NULL, 0);
  else if (!*rest || !strcmp(rest, "/"))
    list(gw, c);
  else if (rest[0] == '/')
    one(gw, c, rest + 1);
  else
    gw_conn_error(c, 404, "unknown admin route: GET /admin/explain/<request id>", NULL, NULL, 0);
}
