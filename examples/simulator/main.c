/* lupin-sim: flags, start-up, signals.
 *
 * Every knob is a --flag in one table, so --help can print each with its
 * default and nothing is configured any other way. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

enum flag_kind { F_INT, F_DOUBLE, F_STRING, F_U64, F_BOOL, F_SIZE };

typedef struct flag {
  const char *name;
  enum flag_kind kind;
  size_t offset; /* into sim_config */
  const char *help;
} flag;

#define OFF(field) offsetof(sim_config, field)

/* --lora, --slow-endpoints and --instant are handled by hand (lists, a preset). */
static const flag flags[] = {
    {"host", F_STRING, OFF(host), "address to listen on (IPv4, IPv6; :: = both families)"},
    {"port", F_INT, OFF(port), "port of endpoint 0; endpoint i listens on port+i"},
    {"endpoints", F_INT, OFF(endpoints), "number of simulated vLLM endpoints"},
    {"model", F_STRING, OFF(model), "served model name"},
    {"max-loras", F_INT, OFF(max_loras), "distinct LoRA adapters allowed in the running batch"},
    {"max-num-seqs", F_INT, OFF(max_num_seqs), "running requests per endpoint; others wait"},
    {"block-size", F_INT, OFF(block_size), "tokens per KV-cache block"},
    {"num-gpu-blocks", F_INT, OFF(num_gpu_blocks), "KV-cache capacity in blocks, per endpoint"},
    {"max-model-len", F_INT, OFF(max_model_len), "prompt + output tokens allowed per request"},
    {"default-max-tokens", F_INT, OFF(default_max_tokens),
     "output tokens when a request has no max_tokens"},
    {"prefill-overhead-ms", F_DOUBLE, OFF(prefill_overhead_ms),
     "fixed part of the time to first token"},
    {"prefill-ms-per-token", F_DOUBLE, OFF(prefill_ms_per_token),
     "prefill time per uncached prompt token"},
    {"prefill-serial", F_BOOL, OFF(prefill_serial),
     "an endpoint's prefills run one after another, so TTFT grows with concurrent prompts"},
    {"itl-ms", F_DOUBLE, OFF(itl_ms), "inter-token latency (0: all tokens at once)"},
    {"itl-ms-per-seq", F_DOUBLE, OFF(itl_ms_per_seq),
     "decode step time added per running request: TPOT grows with the batch (no effect with"
     " --itl-ms 0)"},
    {"seed", F_U64, OFF(seed), "seed of generated text and failure injection"},
    {"error-rate", F_DOUBLE, OFF(error_rate), "fraction of generation requests answered 500"},
    {"drop-rate", F_DOUBLE, OFF(drop_rate),
     "fraction of generation requests whose connection is dropped mid-response"},
    {"slow-factor", F_DOUBLE, OFF(slow_factor), "latency multiplier of --slow-endpoints"},
    {"max-body-bytes", F_SIZE, OFF(max_body_bytes), "request body limit (413 above)"},
    {"log-requests", F_BOOL, OFF(log_requests), "log each generation request to stderr"},
    {"engine", F_STRING, OFF(engine),
     "whose /metrics names to serve: vllm, sglang, tgi, triton (TensorRT-LLM backend),"
     " trtllm-serve"},
    {"kv-hash-seed", F_STRING, OFF(kv_hash_seed),
     "seed of the KV-cache block hashes: a number (every endpoint the same), or random (each"
     " endpoint its own, drawn again on restart)"},
    {"kv-events-port", F_INT, OFF(kv_events_port),
     "publish vLLM's KV-cache events: endpoint i binds a ZMQ PUB on port+i (0: off)"},
    {"kv-replay-port", F_INT, OFF(kv_replay_port),
     "answer vLLM's replay requests: endpoint i binds a ZMQ ROUTER on port+i (0: off)"},
    {"kv-buffer-steps", F_INT, OFF(kv_buffer_steps), "event batches kept for replay"},
    {"kv-events-shape", F_STRING, OFF(kv_events_shape),
     "events as positional arrays (vLLM <= 0.23), as maps with \"type\" (map, vLLM >= 0.26),"
     " the batch a map too (map-batch): array, map, map-batch"},
    {"kv-hash-encoding", F_STRING, OFF(kv_hash_encoding),
     "block hashes as uint64 (vLLM's default) or 32-byte bins (int, bytes)"},
    {"kv-events-drop-rate", F_DOUBLE, OFF(kv_events_drop_rate),
     "fraction of event batches not sent (their sequence number still advances)"},
};

static void config_defaults(sim_config *c) {
  memset(c, 0, sizeof *c);
  c->host = "127.0.0.1";
  c->port = 8001;
  c->endpoints = 4;
  c->model = "meta-llama/Llama-3.1-8B-Instruct";
  c->max_loras = 1;
  c->max_num_seqs = 16;
  c->block_size = 16;
  c->num_gpu_blocks = 2048;
  c->max_model_len = 32768;
  c->default_max_tokens = 16;
  c->prefill_overhead_ms = 2;
  c->prefill_ms_per_token = 0.02;
  c->itl_ms = 10;
  c->slow_factor = 10;
  c->max_body_bytes = 16u << 20;
  c->engine = "vllm";
  c->kv_hash_seed = "random";
  c->kv_seed_random = true;
  c->kv_buffer_steps = 10000;
  c->kv_events_shape = "array";
  c->kv_hash_encoding = "int";
}

static void flag_value(const sim_config *c, const flag *f, char *buf, size_t n) {
  const char *p = (const char *)c + f->offset;
  switch (f->kind) {
  case F_INT:
    snprintf(buf, n, "%d", *(const int *)p);
    break;
  case F_DOUBLE:
    snprintf(buf, n, "%g", *(const double *)p);
    break;
  case F_STRING:
    snprintf(buf, n, "%s", *(const char *const *)p);
    break;
  case F_U64:
    snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p);
    break;
  case F_BOOL:
    snprintf(buf, n, "%s", *(const bool *)p ? "true" : "false");
    break;
  case F_SIZE:
    snprintf(buf, n, "%zu", *(const size_t *)p);
    break;
  }
}

static void usage(FILE *out) {
  sim_config d;
  config_defaults(&d);
  fprintf(out, "usage: lupin-sim [--flag value ...]\n"
               "Serves N simulated vLLM endpoints (OpenAI API, vLLM /metrics) on N ports.\n\n");
  char v[128];
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
    flag_value(&d, &flags[i], v, sizeof v);
    fprintf(out, "  --%-22s %s (default %s)\n", flags[i].name, flags[i].help, v);
  }
  fprintf(out, "  --%-22s %s (default %s)\n", "lora", "LoRA adapters served, comma-separated",
          "none");
  fprintf(out, "  --%-22s %s (default %s)\n", "slow-endpoints",
          "endpoint indices that run --slow-factor slower, comma-separated", "none");
  fprintf(out, "  --%-22s %s\n", "instant",
          "all latencies 0 (prefill and inter-token): for gateway benchmarks");
  fprintf(out, "  --%-22s %s\n", "help, -h", "this text");
  fprintf(out, "  --%-22s %s\n", "version, -V", "print the version");
  fprintf(out, "\nexit status: 0 stopped by SIGINT/SIGTERM, 1 could not listen (HTTP or ZMQ), 2 bad"
               " flags.\n");
}

static int set_flag(sim_config *c, const flag *f, const char *v) {
  char *p = (char *)c + f->offset, *end = NULL;
  errno = 0;
  switch (f->kind) {
  case F_INT:
    *(int *)p = (int)strtol(v, &end, 10);
    break;
  case F_DOUBLE:
    *(double *)p = strtod(v, &end);
    break;
  case F_STRING:
    *(const char **)p = v;
    return 0;
  case F_U64:
    *(uint64_t *)p = strtoull(v, &end, 10);
    break;
  case F_SIZE:
    *(size_t *)p = (size_t)strtoull(v, &end, 10);
    break;
  case F_BOOL:
    if (strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "1") && strcmp(v, "0")) return -1;
    *(bool *)p = !strcmp(v, "true") || !strcmp(v, "1");
    return 0;
  }
  return errno || end == v || *end ? -1 : 0;
}

/* Splits "a,b,c" into a NULL-terminated array of copies; empty items dropped. */
static char **split_list(const char *s, int *n) {
  char *copy = strdup(s), *save = NULL;
  char **items = calloc(strlen(s) / 2 + 2, sizeof *items);
  *n = 0;
  for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
    items[(*n)++] = strdup(t);
  free(copy);
  return items;
}

static int set_slow(sim_config *c, const char *list) {
  int n = 0;
  char **items = split_list(list, &n);
  int rc = 0;
  for (int i = 0; i < n; i++) {
    char *end;
    long k = strtol(items[i], &end, 10);
    if (*end || k < 0 || k >= c->endpoints) {
      fprintf(stderr, "lupin-sim: --slow-endpoints: '%s' is not an endpoint index (0..%d)\n",
              items[i], c->endpoints - 1);
      rc = -1;
    } else {
      c->slow[k] = true;
    }
    free(items[i]);
  }
  free(items);
  return rc;
}

/* Whether [a, a+n) and [b, b+n) share a port. */
static bool overlap(int a, int b, int n) { return a < b + n && b < a + n; }

static const char *validate_kv(sim_config *c) {
  char *end = NULL;
  c->kv_seed_random = !strcmp(c->kv_hash_seed, "random");
  if (!c->kv_seed_random) {
    errno = 0;
    c->kv_seed = strtoull(c->kv_hash_seed, &end, 10);
    if (errno || end == c->kv_hash_seed || *end || c->kv_hash_seed[0] == '-')
      return "--kv-hash-seed must be a number or random";
  }
  c->kv_batch_map = !strcmp(c->kv_events_shape, "map-batch");
  c->kv_shape_map = c->kv_batch_map || !strcmp(c->kv_events_shape, "map");
  if (!c->kv_shape_map && strcmp(c->kv_events_shape, "array"))
    return "--kv-events-shape must be array, map or map-batch";
  c->kv_hash_bytes = !strcmp(c->kv_hash_encoding, "bytes");
  if (!c->kv_hash_bytes && strcmp(c->kv_hash_encoding, "int"))
    return "--kv-hash-encoding must be int or bytes";
  if (c->kv_events_port < 0 || c->kv_events_port + c->endpoints - 1 > 65535)
    return "--kv-events-port out of range";
  if (c->kv_replay_port < 0 || c->kv_replay_port + c->endpoints - 1 > 65535)
    return "--kv-replay-port out of range";
  if (c->kv_replay_port && !c->kv_events_port) return "--kv-replay-port needs --kv-events-port";
  if (c->kv_buffer_steps < 1) return "--kv-buffer-steps must be at least 1";
  if (c->kv_events_drop_rate < 0 || c->kv_events_drop_rate > 1)
    return "--kv-events-drop-rate must be in [0,1]";
  int n = c->endpoints;
  if (c->kv_events_port &&
      (overlap(c->kv_events_port, c->port, n) ||
       (c->kv_replay_port && overlap(c->kv_events_port, c->kv_replay_port, n))))
    return "--kv-events-port: its ports overlap --port's or --kv-replay-port's";
  if (c->kv_replay_port && overlap(c->kv_replay_port, c->port, n))
    return "--kv-replay-port: its ports overlap --port's";
  return NULL;
}

static int validate(sim_config *c) {
  const char *bad = NULL;
  if (c->endpoints < 1 || c->endpoints > 1024)
    bad = "--endpoints must be 1..1024";
  else if (c->port < 1 || c->port + c->endpoints - 1 > 65535)
    bad = "--port out of range";
  else if (c->max_num_seqs < 1)
    bad = "--max-num-seqs must be at least 1";
  else if (c->block_size < 1)
    bad = "--block-size must be at least 1";
  else if (c->num_gpu_blocks < 1)
    bad = "--num-gpu-blocks must be at least 1";
  else if (c->max_loras < 1)
    bad = "--max-loras must be at least 1";
  else if (c->nloras > MAX_LORAS)
    bad = "--lora: too many adapters (at most 256)";
  else if (c->default_max_tokens < 1)
    bad = "--default-max-tokens must be at least 1";
  else if (c->max_model_len < 2)
    bad = "--max-model-len must be at least 2";
  else if (c->error_rate < 0 || c->error_rate > 1)
    bad = "--error-rate must be in [0,1]";
  else if (c->drop_rate < 0 || c->drop_rate > 1)
    bad = "--drop-rate must be in [0,1]";
  else if (c->prefill_overhead_ms < 0 || c->prefill_ms_per_token < 0 || c->itl_ms < 0)
    bad = "latencies must not be negative";
  else if (!(c->itl_ms_per_seq >= 0) || !isfinite(c->itl_ms_per_seq)) /* nan, inf too */
    bad = "--itl-ms-per-seq must be a finite number of milliseconds, at least 0";
  else if (c->slow_factor <= 0)
    bad = "--slow-factor must be positive";
  else if (!metrics_engine_known(c->engine))
    bad = "--engine must be one of vllm, sglang, tgi, triton, trtllm-serve";
  else
    bad = validate_kv(c);
  if (bad) fprintf(stderr, "lupin-sim: %s\n", bad);
  return bad ? -1 : 0;
}

static const flag *find_flag(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0) return &flags[i];
  return NULL;
}

/* One "--name value" or "--name=value"; returns the next argv index or -1. */
static int parse_one(sim_config *c, int argc, char **argv, int i, const char **slow) {
  const char *a = argv[i] + 2, *eq = strchr(a, '=');
  size_t len = eq ? (size_t)(eq - a) : strlen(a);
  if (len == 7 && !strncmp(a, "instant", 7) && !eq) {
    c->prefill_overhead_ms = c->prefill_ms_per_token = c->itl_ms = c->itl_ms_per_seq = 0;
    return i + 1;
  }
  const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
  int next = eq ? i + 1 : i + 2;
  const flag *f = find_flag(a, len);
  if (f && f->kind == F_BOOL && !eq && (!v || strncmp(v, "--", 2) == 0)) {
    v = "true"; /* a bare boolean flag switches it on */
    next = i + 1;
  }
  bool known =
      f || (len == 4 && !strncmp(a, "lora", 4)) || (len == 14 && !strncmp(a, "slow-endpoints", 14));
  if (!known) {
    fprintf(stderr, "lupin-sim: unknown flag --%.*s (see --help)\n", (int)len, a);
    return -1;
  }
  if (!v) {
    fprintf(stderr, "lupin-sim: --%.*s needs a value\n", (int)len, a);
    return -1;
  }
  if (!f && len == 4) {
    for (int k = 0; k < c->nloras; k++)
      free(c->loras[k]);
    free(c->loras);
    c->loras = split_list(v, &c->nloras);
  } else if (!f) {
    *slow = v;
  } else if (set_flag(c, f, v) < 0) {
    fprintf(stderr, "lupin-sim: --%s: bad value '%s'\n", f->name, v);
    return -1;
  }
  return next;
}

int config_parse(sim_config *c, int argc, char **argv) {
  config_defaults(c);
  const char *slow = "";
  for (int i = 1; i < argc;) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 1;
    }
    if (!strcmp(argv[i], "--version") || !strcmp(argv[i], "-V")) {
      printf("lupin-sim %s\n", SIM_VERSION);
      return 1;
    }
    if (strncmp(argv[i], "--", 2) != 0) {
      fprintf(stderr, "lupin-sim: unexpected argument '%s' (see --help)\n", argv[i]);
      return -1;
    }
    if ((i = parse_one(c, argc, argv, i, &slow)) < 0) return -1;
  }
  if (validate(c) < 0) return -1;
  c->slow = calloc((size_t)c->endpoints, sizeof *c->slow);
  return set_slow(c, slow);
}

void config_free(sim_config *c) {
  for (int k = 0; k < c->nloras; k++)
    free(c->loras[k]);
  free(c->loras);
  free(c->slow);
}

/* ---- running ------------------------------------------------------------------ */

uint64_t endpoint_kv_seed(const sim *s) {
  if (!s->cfg.kv_seed_random) return s->cfg.kv_seed;
  uint64_t seed;
  if (uv_random(NULL, NULL, &seed, sizeof seed, 0, NULL) < 0) /* not seen on Linux */
    seed = uv_hrtime() * 0x9e3779b97f4a7c15ULL ^ (uint64_t)uv_os_getpid();
  return seed;
}

static void sim_stop(sim *s) {
  if (s->stopping) return;
  s->stopping = true;
  for (int i = 0; i < s->cfg.endpoints; i++) {
    server_close(&s->eps[i]);
    engine_close(&s->eps[i]);
  }
  kvev_stop(s);
  uv_close((uv_handle_t *)&s->sigint, NULL);
  uv_close((uv_handle_t *)&s->sigterm, NULL);
}

static void on_signal(uv_signal_t *h, int signum) {
  (void)signum;
  sim_stop(h->data);
}

static int sim_start(sim *s) {
  s->eps = calloc((size_t)s->cfg.endpoints, sizeof *s->eps);
  for (int i = 0; i < s->cfg.endpoints; i++) {
    endpoint *ep = &s->eps[i];
    ep->sim = s;
    ep->index = i;
    ep->port = s->cfg.port + i;
    const char *h = s->cfg.host; /* IPv6 in brackets, as a URL has it */
    snprintf(ep->addr, sizeof ep->addr, strchr(h, ':') && h[0] != '[' ? "[%s]:%d" : "%s:%d", h,
             ep->port);
    ep->kv = kv_new(s->cfg.num_gpu_blocks, s->cfg.block_size);
    ep->kv_seed = endpoint_kv_seed(s);
    ep->rng = s->cfg.seed * 1000003u + (uint64_t)i;
    ep->slowness = s->cfg.slow[i] ? s->cfg.slow_factor : 1.0;
    metrics_init(&ep->m);
    int rc = server_listen(ep);
    if (rc < 0) {
      fprintf(stderr, "lupin-sim: endpoint %d: cannot listen on %s: %s\n", i, ep->addr,
              uv_strerror(rc));
      return -1;
    }
  }
  if (kvev_start(s) < 0) return -1;
  for (int i = 0; i < s->cfg.endpoints; i++) {
    printf("endpoint %d listening on %s\n", s->eps[i].index, s->eps[i].addr);
    if (s->cfg.kv_events_port)
      printf("endpoint %d publishing KV events on port %d\n", i, s->cfg.kv_events_port + i);
    if (s->cfg.kv_replay_port)
      printf("endpoint %d answering KV replay on port %d\n", i, s->cfg.kv_replay_port + i);
  }
  fflush(stdout);
  uv_signal_init(s->loop, &s->sigint);
  uv_signal_init(s->loop, &s->sigterm);
  s->sigint.data = s->sigterm.data = s;
  uv_signal_start(&s->sigint, on_signal, SIGINT);
  uv_signal_start(&s->sigterm, on_signal, SIGTERM);
  return 0;
}

static void sim_free(sim *s) {
  kvev_free(s);
  for (int i = 0; s->eps && i < s->cfg.endpoints; i++) {
    kv_free(s->eps[i].kv);
    metrics_free(&s->eps[i].m);
  }
  free(s->eps);
  config_free(&s->cfg);
}

int main(int argc, char **argv) {
  sim s;
  memset(&s, 0, sizeof s);
  int rc = config_parse(&s.cfg, argc, argv);
  if (rc != 0) {
    config_free(&s.cfg);
    return rc > 0 ? 0 : 2;
  }
  signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not a death */
  s.loop = uv_default_loop();
  if (sim_start(&s) < 0) {
    s.stopping = true;
    for (int i = 0; i < s.cfg.endpoints; i++)
      server_close(&s.eps[i]);
    kvev_stop(&s);
    uv_run(s.loop, UV_RUN_DEFAULT);
    uv_loop_close(s.loop);
    sim_free(&s);
    return 1;
  }
  uv_run(s.loop, UV_RUN_DEFAULT);
  uv_loop_close(s.loop);
  sim_free(&s);
  printf("lupin-sim: stopped\n");
  return 0;
}
