/* lupin's side: the same requests through the embedding API (core/lupin.h)
 * with examples/configs/epp-default.json -- begin, schedule, response header,
 * three chunks, complete, end -- and where its time goes.
 *
 * The breakdown comes from the runtime's own per-plugin call times
 * (lupin_runtime_plugin_stats, counted over the timed lifecycles only):
 *   prefix-cache-scorer prepare + pre_request = body decode, prompt, block
 *   hashes, index match and record, and the plugin's Lua around them;
 *   the three scorers' score + max-score-picker's pick = scoring.
 * The runtime does not time the parts of prepare, so two are measured apart
 * and the rest stays with the plugin ("prefix"):
 *   decode: lupin.json.decode (simdjson in C, core/json.cpp) of the same
 *     body in the same Lua state, in a loop (lupin__eval) -- a warm figure,
 *     lower than a decode inside a request;
 *   index: the C hashing and index work, as the native side's instrumented
 *     pass times it on the same stream (same functions, same index states).
 * Everything the plugin timers do not cover is "runtime": the C<->Lua calls,
 * the body copied into a Lua string, the request table and ctxs, the engine's
 * loops and weighting, the response hooks, finish, and garbage collection. */
#include "../../core/internal.h"
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lupin_side {
  workload *w;
  lupin_runtime *rt;
  char (*names)[16];
  /* plugin ns at the mark, by category */
  double mark_prepare, mark_record, mark_scoring;
};

static void die(const char *what, const char *err) {
  fprintf(stderr, "bench-core: %s: %s\n", what, err);
  exit(1);
}

lupin_side *lupin_side_new(workload *w, const char *config) {
  char err[2048];
  lupin_side *ls = calloc(1, sizeof *ls);
  ls->w = w;
  ls->rt = lupin_runtime_new(&(lupin_options){.log_level = LUPIN_LOG_WARN, .seed = SEED}, err,
                             sizeof err);
  if (!ls->rt || lupin_runtime_load(ls->rt, config, err, sizeof err)) die(config, err);
  ls->names = malloc(w->n_endpoints * sizeof *ls->names);
  for (int i = 0; i < w->n_endpoints; i++) {
    char addr[32];
    snprintf(ls->names[i], sizeof ls->names[i], "ep%d", i);
    snprintf(addr, sizeof addr, "10.0.%d.%d", i / 250, i % 250 + 1);
    if (lupin_endpoint_upsert(ls->rt, &(lupin_endpoint_desc){ls->names[i], addr, 8000, NULL, 0},
                              err, sizeof err))
      die("upsert", err);
  }
  lupin_side_push_metrics(ls);
  return ls;
}

void lupin_side_push_metrics(lupin_side *ls) {
  workload *w = ls->w;
  for (int j = 0; j < w->n_changed; j++) {
    int e = w->changed[j];
    /* with its cache block size, as vLLM reports it: 16 tokens, the
     * native side's 64 characters (autoTune reads it; an endpoint that
     * reports none makes the plugin look at every other one) */
    lupin_endpoint_set_metrics(ls->rt, ls->names[e],
                               &(lupin_metrics){.waiting_queue_size = w->queue[e],
                                                .kv_cache_usage = w->kv[e],
                                                .cache_block_size = 16});
  }
}

static lupin_request *begin(lupin_side *ls) {
  char err[256];
  lupin_request_desc d = {
      .path = "/v1/completions", .body = ls->w->body, .body_len = ls->w->body_len};
  lupin_request *req = lupin_request_begin(ls->rt, &d, err, sizeof err);
  if (!req) die("begin", err);
  return req;
}

int lupin_side_lifecycle(lupin_side *ls) {
  static const lupin_header ct = {"content-type", "text/event-stream"};
  static const char chunk[] = "data: {\"choices\":[{\"text\":\" token\"}]}\n\n";
  lupin_request *req = begin(ls);
  lupin_result res;
  if (lupin_request_schedule(req, &res) != 200) die("schedule", res.message);
  /* endpoint names are "ep<index>" */
  int pick = atoi(res.picks[0].name + 2);
  lupin_request_response_header(req, 200, &ct, 1);
  for (int i = 0; i < 3; i++)
    lupin_request_response_chunk(req, chunk, sizeof chunk - 1);
  lupin_request_response_complete(req);
  lupin_request_end(req, LUPIN_OK);
  return pick;
}

typedef struct sums {
  double prepare, record, scoring;
} sums;

static void add_stat(void *ud, const lupin_plugin_stat *s) {
  sums *t = ud;
  if (!strcmp(s->type, "prefix-cache-scorer") && !strcmp(s->point, "prepare"))
    t->prepare += s->nanoseconds;
  else if (!strcmp(s->type, "prefix-cache-scorer") && !strcmp(s->point, "pre_request"))
    t->record += s->nanoseconds;
  else if (!strcmp(s->point, "score") || !strcmp(s->point, "pick"))
    t->scoring += s->nanoseconds;
}

/* LUPIN_BENCH_PROFILE=<jit.p mode> (e.g. "Fl", "v") profiles the timed
 * lifecycles with LuaJIT's sampling profiler inside the runtime; the report
 * goes to LUPIN_BENCH_PROFILE_OUT (default /tmp/bench-core.jitp).
 * LUPIN_BENCH_JITV=<file> logs the JIT's traces and aborts (jit.v) there. */
static void profile(lupin_side *ls, int start) {
  const char *jitv = getenv("LUPIN_BENCH_JITV"); /* a file: jit.v's trace log */
  if (jitv && *jitv && start) {
    char code[512], err[512];
    snprintf(code, sizeof code, "require('jit.v').start([==[%s]==]) return ''", jitv);
    char *r = lupin__eval(ls->rt, code, err, sizeof err);
    if (!r) die("jit.v", err);
    free(r);
  }
  const char *mode = getenv("LUPIN_BENCH_PROFILE");
  if (!mode || !*mode) return;
  const char *out = getenv("LUPIN_BENCH_PROFILE_OUT");
  char code[512], err[512];
  snprintf(code, sizeof code,
           start ? "require('jit.p').start([==[%s]==], [==[%s]==]) return ''"
                 : "require('jit.p').stop() return ''",
           mode, out ? out : "/tmp/bench-core.jitp");
  char *r = lupin__eval(ls->rt, code, err, sizeof err);
  if (!r) die("jit.p", err);
  free(r);
}

/* Counts LuaJIT's trace aborts from start to stop (jit.attach): the timed
 * lifecycles are the steady state, where the request path should compile
 * without any (docs/performance.md, "Compiled paths").  -1 under
 * LUPIN_BENCH_JITV: LuaJIT keeps one handler per event, and jit.v's log,
 * which lists the aborts, has it. */
static int count_aborts(lupin_side *ls, int start) {
  const char *jitv = getenv("LUPIN_BENCH_JITV");
  if (jitv && *jitv) return -1;
  char err[512];
  char *r = lupin__eval(
      ls->rt,
      start ? "local jit, n = require 'jit', { 0 }\n"
              "local function on(what) if what == 'abort' then n[1] = n[1] + 1 end end\n"
              "jit.attach(on, 'trace')\n"
              "package.loaded['bench.aborts'] = { on = on, n = n }\n"
              "return ''"
            : "local a = package.loaded['bench.aborts']\n"
              "require('jit').attach(a.on)\n"
              "return tostring(a.n[1])",
      err, sizeof err);
  if (!r) die("jit.attach", err);
  int n = atoi(r);
  free(r);
  return n;
}

void lupin_side_mark(lupin_side *ls) {
  profile(ls, 1);
  count_aborts(ls, 1);
  sums t = {0};
  lupin_runtime_plugin_stats(ls->rt, add_stat, &t);
  ls->mark_prepare = t.prepare;
  ls->mark_record = t.record;
  ls->mark_scoring = t.scoring;
}

/* ns per body decode (lupin.json, as a request decodes it) of the current
 * body, in the runtime's Lua state. */
static double decode_ns(lupin_side *ls) {
  workload *w = ls->w;
  int reps = w->body_len > 100000 ? 200 : w->body_len > 10000 ? 2000 : 20000;
  size_t cap = w->body_len + 512;
  char *code = malloc(cap), err[512];
  snprintf(code, cap,
           "local cjson, now = require 'cjson.safe', require('lupin.runtime.capi').now\n"
           "local json = require 'lupin.runtime.json'\n"
           "local s = [==[%.*s]==]\n"
           "local t0, p = now(), 0\n"
           "for _ = 1, %d do p = p + #json.decode(s, cjson).prompt end\n"
           "return tostring((now() - t0) / %d * 1e9)",
           (int)w->body_len, w->body, reps, reps);
  char *out = lupin__eval(ls->rt, code, err, sizeof err);
  if (!out) die("eval", err);
  double ns = atof(out);
  free(out);
  free(code);
  return ns;
}

void lupin_side_breakdown(lupin_side *ls, int n, double total_ns, double index_ns, breakdown *out) {
  profile(ls, 0);
  out->aborts = count_aborts(ls, 0);
  sums t = {0};
  lupin_runtime_plugin_stats(ls->rt, add_stat, &t);
  double prefix = t.prepare - ls->mark_prepare + (t.record - ls->mark_record);
  out->decode = decode_ns(ls) * n;
  out->index = index_ns;
  out->prefix = prefix - out->decode - out->index;
  out->scoring = t.scoring - ls->mark_scoring;
  out->runtime = total_ns - prefix - out->scoring;
}

static uint64_t lua_memory_after_gc(lupin_runtime *rt) {
  char report[64];
  lupin_runtime_check_leaks(rt, report, sizeof report); /* runs a full GC */
  lupin_stats s;
  lupin_runtime_stats(rt, &s);
  return s.lua_memory;
}

double lupin_side_heap_per_request(lupin_side *ls, int in_flight) {
  lupin_request **reqs = malloc(in_flight * sizeof *reqs);
  uint64_t before = lua_memory_after_gc(ls->rt);
  for (int i = 0; i < in_flight; i++) {
    lupin_result res;
    workload_next(ls->w);
    lupin_side_push_metrics(ls);
    reqs[i] = begin(ls);
    lupin_request_schedule(reqs[i], &res);
  }
  uint64_t during = lua_memory_after_gc(ls->rt);
  for (int i = 0; i < in_flight; i++)
    lupin_request_end(reqs[i], LUPIN_OK);
  free(reqs);
  return (double)(during - before) / in_flight;
}

void lupin_side_free(lupin_side *ls) {
  lupin_runtime_free(ls->rt);
  free(ls->names);
  free(ls);
}
