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
 *                              cache is only looked at: LRU order does not change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "sim.h"

/* Whether name=1|true (or a bare name) is in the query string. */
static bool query_flag(const char *query, const char *name) {
  size_t n = strlen(name);
  for (const char *q = query; q && *q;) {
    if (*q == '?' || *q == '&') q++;
    size_t len = strcspn(q, "&");
    if (len >= n && !strncmp(q, name, n)) {
      const char *v = q + n;
      if (v == q + len) return true;
      if (*v == '=') {
        v++;
        size_t vl = (size_t)(q + len - v);
        return (vl == 1 && *v == '1') || (vl == 4 && !strncmp(v, "true", 4));
      }
    }
    q += len;
  }
  return false;
}

static void reply_json(http_reply *out, json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT);
  out->status = 200;
  sb_adds(&out->body, s);
  free(s);
  json_decref(o);
}

static void reset(endpoint *ep, const char *query, http_reply *out) {
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

static void oracle(endpoint *ep, const char *body, size_t len, http_reply *out) {
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

static const char *const paths[] = {"/sim/reset", "/sim/oracle"};

bool control_route_known(const char *path, size_t len) {
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
    if (strlen(paths[i]) == len && !strncmp(paths[i], path, len)) return true;
  return false;
}

void control_serve(endpoint *ep, const char *path, size_t plen, const char *query, const char *body,
                   size_t len, http_reply *out) {
  if (plen == 10 && !strncmp(path, "/sim/reset", 10))
    reset(ep, query, out);
  else
    oracle(ep, body, len, out);
}
