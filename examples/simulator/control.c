/* The simulator's own routes, for specs and benchmarks (not vLLM's):
 *
 *   POST /sim/reset            clears this endpoint's prefix cache, as vLLM's
 *                              /reset_prefix_cache does: AllBlocksCleared is published.
 *   POST /sim/reset?restart=1  an engine restart instead: the cache is emptied
 *                              silently, the event sequence starts again at 0, the
 *                              replay buffer is empty and (with --kv-hash-seed
 *                              random) the engine draws a new hash seed.
 *   POST /sim/oracle           a completion or chat body: for every endpoint of this
 *                              process, how many leading tokens of that prompt its
 *                              cache holds now (full blocks), and its queue. The
 *                              cache is only looked at: LRU order does not change.
 *   POST /sim/speed?factor=F   sets this endpoint's latency multiplier (what
 *                              --slow-endpoints gave it) for every prefill started
 *                              and decode step scheduled from now: a model server
 *                              slowing down or recovering while a router watches.
 *   GET /sim/speed             the multiplier now.
 *
 * /sim/reset leaves the speed alone: it is the cache's reset, not the engine's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "sim.h"

/* The value of name=value (or a bare name: "") in the query string, its length
 * in *vlen; NULL when the name is absent. */
static const char *query_value(const char *query, const char *name, size_t *vlen) {
  size_t n = strlen(name);
  for (const char *q = query; q && *q;) {
    if (*q == '?' || *q == '&') q++;
    size_t len = strcspn(q, "&");
    if (len >= n && !strncmp(q, name, n) && (len == n || q[n] == '=')) {
      const char *v = len == n ? q + n : q + n + 1;
      *vlen = (size_t)(q + len - v);
      return v;
    }
    q += len;
  }
  return NULL;
}

/* Whether name=1|true (or a bare name) is in the query string. */
static bool query_flag(const char *query, const char *name) {
  size_t vl = 0;
  const char *v = query_value(query, name, &vl);
  if (!v) return false;
  return vl == 0 || (vl == 1 && *v == '1') || (vl == 4 && !strncmp(v, "true", 4));
}

static void reply_json(http_reply *out, json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT);
  out->status = 200;
  sb_adds(&out->body, s);
  free(s);
  json_decref(o);
}

/* What a route is given, one shape for all so one table routes them. */
typedef struct control_req {
  endpoint *ep;
  const char *method;
  const char *query; /* from the '?' on, or "" */
  const char *body;
  size_t len;
} control_req;

static void reset(const control_req *rq, http_reply *out) {
  endpoint *ep = rq->ep;
  const char *query = rq->query;
  bool restart = query_flag(query, "restart");
  if (restart) {
    kvev_restart(ep);
    kv_reset(ep->kv, false);
    ep->kv_seed = endpoint_kv_seed(ep->sim);
  } else {
    kv_reset(ep->kv, true);
  }
  reply_json(out, json_pack("{s:s, s:b, s:I}", "endpoint", ep->addr, "restarted", restart,
                            "next_seq", (json_int_t)kvev_next_seq(ep)));
}

static void oracle(const control_req *rq, http_reply *out) {
  endpoint *ep = rq->ep;
  const char *body = rq->body;
  size_t len = rq->len;
  const sim_config *cfg = &ep->sim->cfg;
  json_t *root = json_loadb(body, len, 0, NULL);
  enum job_kind kind = json_object_get(root, "messages") ? JOB_CHAT : JOB_COMPLETION;
  json_decref(root);
  job *j = openai_parse(ep, kind, body, len, out); /* validated as the generation routes do */
  if (!j) return;
  int nblocks = j->prompt.n / cfg->block_size;
  uint64_t *hashes = malloc(((size_t)nblocks + 1) * sizeof *hashes);
  if (!hashes) abort();
  json_t *eps = json_array();
  for (int i = 0; i < cfg->endpoints; i++) {
    endpoint *e = &ep->sim->eps[i];
    kv_hash_blocks(e->kv_seed, j->lora >= 0 ? cfg->loras[j->lora] : NULL, j->salt, j->prompt.ids,
                   nblocks, cfg->block_size, hashes);
    int hit = kv_match(e->kv, hashes, nblocks);
    json_array_append_new(eps, json_pack("{s:s, s:i, s:i, s:i, s:i}", "endpoint", e->addr, "port",
                                         e->port, "cached_tokens", hit * cfg->block_size, "running",
                                         e->running.count, "waiting", e->waiting.count));
  }
  free(hashes);
  reply_json(out, json_pack("{s:i, s:i, s:o}", "prompt_tokens", j->prompt_tokens, "block_size",
                            cfg->block_size, "endpoints", eps));
  job_free(j);
}

#define SPEED_MAX 1000.0 /* a thousand times slower is a hung engine already */

/* The factor of POST /sim/speed, or a 400 naming it and the range. */
static bool speed_factor(const char *query, double *out, http_reply *err) {
  size_t vl = 0;
  const char *v = query_value(query, "factor", &vl);
  if (!v) {
    openai_error(err, 400, "invalid_request_error", "factor", NULL,
                 "Missing required parameter 'factor': a number greater than 0 and at most %g,"
                 " e.g. POST /sim/speed?factor=2",
                 SPEED_MAX);
    return false;
  }
  char buf[64];
  size_t n = vl < sizeof buf - 1 ? vl : sizeof buf - 1;
  for (size_t i = 0; i < n; i++) /* echoed in the message: printable ASCII only */
    buf[i] = v[i] > ' ' && v[i] < 0x7f ? v[i] : '?';
  buf[n] = 0;
  char *end = NULL;
  double f = vl && vl < sizeof buf ? strtod(buf, &end) : NAN;
  if (!end || *end || !isfinite(f) || f <= 0 || f > SPEED_MAX) {
    openai_error(err, 400, "invalid_request_error", "factor", NULL,
                 "'factor' must be a number greater than 0 and at most %g, got '%s%s'", SPEED_MAX,
                 buf, vl > n ? "..." : "");
    return false;
  }
  *out = f;
  return true;
}

static void speed(const control_req *rq, http_reply *out) {
  endpoint *ep = rq->ep;
  double f;
  if (!strcmp(rq->method, "POST")) {
    if (!speed_factor(rq->query, &f, out)) return;
    ep->slowness = f;
  }
  reply_json(out, json_pack("{s:s, s:f}", "endpoint", ep->addr, "factor", ep->slowness));
}

typedef struct control_route {
  const char *path;
  const char *allow; /* the methods answered, as an Allow header lists them */
  void (*serve)(const control_req *rq, http_reply *out);
} control_route;

static const control_route routes[] = {
    {"/sim/reset", "POST", reset},
    {"/sim/oracle", "POST", oracle},
    {"/sim/speed", "GET, POST", speed},
};

static const control_route *find_route(const char *path, size_t len) {
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
    if (strlen(routes[i].path) == len && !strncmp(routes[i].path, path, len)) return &routes[i];
  return NULL;
}

const char *control_route_allow(const char *path, size_t len) {
  const control_route *r = find_route(path, len);
  return r ? r->allow : NULL;
}

void control_serve(endpoint *ep, const char *method, const char *path, size_t plen,
                   const char *query, const char *body, size_t len, http_reply *out) {
  const control_route *r = find_route(path, plen);
  control_req rq = {ep, method, query, body, len};
  if (r) r->serve(&rq, out);
}
