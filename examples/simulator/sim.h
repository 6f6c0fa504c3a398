/* lupin-sim: simulated vLLM endpoints for the gateway's specs, demo and benchmarks.
 *
 * One process, one libuv loop, one `sim` object owning N endpoints (one per port).
 * Each endpoint is a little model server: an HTTP listener (server.c), OpenAI
 * request/response shapes (openai.c), a continuous-batching engine with a
 * waiting queue and per-request timers (engine.c), a prefix cache of hashed
 * blocks of token ids (kvcache.c, tokens.c) that can publish vLLM's KV-cache
 * events over ZMQ (kvevents.c), vLLM-named Prometheus metrics (metrics.c) and
 * the simulator's own /sim/ routes (control.c). */
#ifndef LUPIN_SIM_H
#define LUPIN_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* ---- configuration (main.c) ---------------------------------------------- */

#define MAX_LORAS 256 /* adapters per simulator: bounds the per-scan "seen" sets */

typedef struct sim_config {
  const char *host;
  int port; /* endpoint i listens on port + i */
  int endpoints;
  const char *model;
  char **loras; /* adapter names served besides the base model */
  int nloras;
  int max_loras; /* distinct adapters allowed in the running batch */
  int max_num_seqs;
  int block_size;
  int num_gpu_blocks;
  int max_model_len;
  int default_max_tokens;
  double prefill_overhead_ms;
  double prefill_ms_per_token;
  bool prefill_serial; /* prefills of one endpoint queue behind each other */
  double itl_ms;
  double itl_ms_per_seq; /* a decode step's extra time per running request: TPOT grows with load */
  uint64_t seed;
  double error_rate;
  double drop_rate;
  bool *slow; /* slow[i]: endpoint i runs slow_factor times slower */
  double slow_factor;
  size_t max_body_bytes;
  bool log_requests;
  const char *engine; /* whose /metrics names to serve: vllm, sglang, tgi, triton, trtllm-serve */
  /* KV-cache events (kvevents.c) */
  const char *kv_hash_seed;     /* "random" or a number, as given */
  bool kv_seed_random;          /* each endpoint (engine) draws its own seed, again on restart */
  uint64_t kv_seed;             /* the seed of every endpoint otherwise */
  int kv_events_port;           /* endpoint i publishes on port + i; 0 off */
  int kv_replay_port;           /* endpoint i answers replay requests on port + i; 0 off */
  int kv_buffer_steps;          /* batches kept for replay */
  double kv_events_drop_rate;   /* batches not sent (their sequence number still advances) */
  const char *kv_events_shape;  /* "array" or "map" */
  const char *kv_hash_encoding; /* "int" or "bytes" */
  bool kv_shape_map, kv_batch_map, kv_hash_bytes;
} sim_config;

int config_parse(sim_config *cfg, int argc, char **argv); /* 0 ok, 1 help shown, -1 error */
void config_free(sim_config *cfg);

/* ---- a growable string ----------------------------------------------------- */

typedef struct strbuf {
  char *data;
  size_t len, cap;
} strbuf;

void sb_add(strbuf *sb, const char *s, size_t n);
void sb_adds(strbuf *sb, const char *s);
void sb_printf(strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(strbuf *sb);

/* ---- randomness: splitmix64, so a seed reproduces every decision ---------- */

uint64_t rng_next(uint64_t *state);
double rng_unit(uint64_t *state); /* uniform in [0,1) */
double wall_seconds(void);        /* unix time, for timestamps in responses and metrics */

/* ---- token ids (tokens.c) --------------------------------------------------- */

#define VOCAB_SIZE 32000

struct json_t;
struct http_reply;

/* The engine's unit: a prompt as token ids. */
typedef struct token_ids {
  uint32_t *ids;
  int n, cap;
} token_ids;

void tok_push(token_ids *t, uint32_t id);
/* Appends the ids of a text: one per 4 bytes (the last 1-4), hashed, % VOCAB_SIZE. */
void tok_text(token_ids *t, const char *text, size_t len);
void tok_free(token_ids *t);
/* A completion body's `prompt`, each of vLLM's shapes, one token_ids per prompt
 * (a string or a list of ids is one; a list of strings or of id lists, one each). */
bool tok_completion_prompts(struct json_t *body, token_ids **out, int *n, struct http_reply *err);
/* The same as one prompt (the prompts' ids one after another): what the engine serves. */
bool tok_completion_prompt(struct json_t *body, token_ids *out, struct http_reply *err);
/* A chat body's `messages` through the chat template (add_generation_prompt,
 * continue_final_message honoured), as text and as token ids. */
bool tok_chat_text(struct json_t *body, strbuf *text, struct http_reply *err);
bool tok_chat_prompt(struct json_t *body, token_ids *out, struct http_reply *err);

/* ---- prefix cache (kvcache.c) --------------------------------------------- */

typedef struct kvcache kvcache;

/* What the cache tells its publisher (kvevents.c), as it happens. */
typedef struct kv_listener {
  void *ctx;
  /* Full blocks newly cached: n hashes, their parent's hash (NULL for a
   * prompt's first block), n * block_size token ids; lora -1 for the base model. */
  void (*stored)(void *ctx, const uint64_t *hashes, int n, const uint64_t *parent,
                 const uint32_t *tokens, int lora);
  void (*removed)(void *ctx, uint64_t hash); /* a cached block evicted */
  void (*cleared)(void *ctx);                /* every cached block forgotten */
} kv_listener;

/* The chained hashes of `nblocks` full blocks of `ids`: each covers its
 * parent's hash (the first's parent is derived from `seed`), its token ids and
 * the adapter's name, the first one also `salt`. */
void kv_hash_blocks(uint64_t seed, const char *lora, const char *salt, const uint32_t *ids,
                    int nblocks, int block_size, uint64_t *out);

kvcache *kv_new(int capacity, int block_size);
void kv_listen(kvcache *kv, const kv_listener *l); /* NULL: stop telling */
void kv_free(kvcache *kv);
int kv_capacity(const kvcache *kv);
int kv_in_use(const kvcache *kv); /* blocks referenced by a live request */
int kv_free_count(const kvcache *kv);
/* Leading blocks of `hashes` already cached (prefix semantics: stops at the first miss). */
int kv_match(const kvcache *kv, const uint64_t *hashes, int n);
/* Takes a reference on each hashed block (reusing cached ones, evicting LRU free
 * blocks for the rest); writes block ids to `out`; returns how many it got.
 * `tokens` holds the n blocks' token ids (for the listener), `lora` the adapter. */
int kv_acquire(kvcache *kv, const uint64_t *hashes, const uint32_t *tokens, int n, int lora,
               int *out);
/* One unhashed block (partial or decode block); -1 when none is free. */
int kv_acquire_anon(kvcache *kv);
/* Drops references, last block first, so a prompt's end is evicted before its start. */
void kv_release(kvcache *kv, const int *blocks, int n);
/* Forgets every cached block (running requests keep theirs, unhashed);
 * `announce`: the listener hears it (AllBlocksCleared). */
void kv_reset(kvcache *kv, bool announce);

/* ---- metrics (metrics.c) --------------------------------------------------- */

#define HIST_MAX_BUCKETS 24

typedef struct histogram {
  const double *bounds;
  int nbounds;
  uint64_t counts[HIST_MAX_BUCKETS + 1];
  double sum;
  uint64_t count;
} histogram;

void hist_init(histogram *h, const double *bounds, int nbounds);
void hist_observe(histogram *h, double v);

/* vLLM's lora_requests_info is a labelled gauge: each label set it ever had
 * stays exported with the value it had last, and the current one has the
 * latest timestamp. The simulator keeps the last few old ones the same way. */
#define LORA_SERIES_KEPT 8
typedef struct lora_series {
  char *labels;
  double ts;
} lora_series;

typedef struct counters {
  uint64_t requests; /* completion requests received (lupin_sim_requests_total) */
  uint64_t success;  /* finished with a full response */
  uint64_t injected_errors;
  uint64_t injected_drops;
  uint64_t prompt_tokens;
  uint64_t generation_tokens;
  uint64_t prefix_queries; /* tokens */
  uint64_t prefix_hits;    /* tokens */
  histogram ttft;
  histogram itl;
  double lora_updated;  /* unix time of the last change of the LoRA sets */
  lora_series lora_now; /* the label set /metrics showed last */
  lora_series lora_old[LORA_SERIES_KEPT];
  int nlora_old;
} counters;

struct endpoint;
void metrics_init(counters *c);
void metrics_free(counters *c);
void metrics_render(struct endpoint *ep, strbuf *out);
bool metrics_engine_known(const char *engine);

/* ---- the engine (engine.c) -------------------------------------------------- */

enum job_kind { JOB_COMPLETION, JOB_CHAT };
enum job_state { JOB_WAITING, JOB_RUNNING, JOB_FINISHED };

struct conn;

/* One generation request, from parse to its last byte. */
typedef struct job {
  struct endpoint *ep;
  struct conn *conn; /* NULL once the client is gone */
  struct job *prev, *next;
  enum job_kind kind;
  enum job_state state;
  bool stream, include_usage;
  char *model; /* as requested: the base model or an adapter */
  int lora;    /* adapter index, -1 for the base model */
  char *id;
  int prompt_tokens;
  int max_tokens;
  int n; /* choices: sampled together, one engine sequence (their tokens differ by seed) */
  int generated;
  int cached_tokens;
  int drop_at;      /* token count after which the connection is dropped; -1 never */
  token_ids prompt; /* the prompt's token ids (prompt_tokens: their count, at least 1) */
  char *salt;       /* cache_salt, or NULL */
  uint64_t *hashes; /* its full blocks' hashes, computed at admission with the endpoint's seed */
  int nhashes;
  int *blocks;
  int nblocks, cap_blocks;
  uint64_t text_seed;
  uint64_t t_arrival, t_last; /* uv_hrtime, ns */
  uint64_t created;           /* unix seconds, for the response */
  strbuf text;                /* accumulated output of a non-streaming job */
  uv_timer_t timer;
} job;

typedef struct job_list {
  job *head, *tail;
  int count;
} job_list;

void engine_submit(struct endpoint *ep, job *j);
void engine_cancel(job *j); /* the client left: free its slot and blocks */
void engine_close(struct endpoint *ep);
void job_free(job *j); /* closes its timer; memory goes in the close callback */

/* ---- OpenAI shapes (openai.c) ------------------------------------------------ */

typedef struct http_reply {
  int status;
  strbuf body;
} http_reply;

const char *openai_type_name(const struct json_t *v); /* "an array", "a string", ... */
/* A 400 naming the parameter: "'param' must be <want>, got <type of v>". Returns false. */
bool openai_bad_type(http_reply *err, const char *param, const char *want, const struct json_t *v);

/* Parses and validates a completion or chat body. Returns a job, or NULL with
 * `err` holding the status and OpenAI error JSON. */
job *openai_parse(struct endpoint *ep, enum job_kind kind, const char *body, size_t len,
                  http_reply *err);
void openai_error(http_reply *r, int status, const char *type, const char *param, const char *code,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void openai_models(const struct endpoint *ep, strbuf *out);
/* Token text: a word per token, a pure function of the job's seed and index. */
const char *openai_token(const job *j, int index);
void openai_stream_tokens(job *j, int from, int to, bool finished); /* SSE chunks */
void openai_finish(job *j); /* the full response, or the stream's tail */

/* ---- the routes that generate no tokens (routes.c) ---------------------------- */

bool aux_route_known(const char *path, size_t len);
/* Answers POST path (embeddings, pooling, score, rerank, tokenize, ...): the
 * status and JSON in out, the model served appended to model on success. */
void aux_serve(struct endpoint *ep, const char *path, size_t plen, const char *content_type,
               const char *body, size_t len, http_reply *out, strbuf *model);

/* ---- the simulator's own routes (control.c) -------------------------------- */

/* The methods a /sim/ route answers, as an Allow header lists them ("POST",
 * "GET, POST"), or NULL when path is not one of them. */
const char *control_route_allow(const char *path, size_t len);
/* POST /sim/reset[?restart=1], POST /sim/oracle, GET|POST /sim/speed[?factor=F]
 * (a method the route allows): the status and JSON in out. */
void control_serve(struct endpoint *ep, const char *method, const char *path, size_t plen,
                   const char *query, const char *body, size_t len, http_reply *out);

/* ---- KV-cache events (kvevents.c) ---------------------------------------------- */

typedef struct kv_publisher kv_publisher;
struct sim;

/* Binds every endpoint's PUB (and ROUTER) socket; -1 with a message on stderr. */
int kvev_start(struct sim *s);
void kvev_stop(struct sim *s); /* closes the loop handles (sockets stay until kvev_free) */
void kvev_free(struct sim *s);
/* An engine restart: pending events lost, sequence back to 0, replay buffer empty. */
void kvev_restart(struct endpoint *ep);
uint64_t kvev_next_seq(const struct endpoint *ep);
void kvev_metrics(const struct endpoint *ep, strbuf *out);

/* ---- HTTP (server.c) ------------------------------------------------------- */

int server_listen(struct endpoint *ep);
void server_close(struct endpoint *ep);
/* Response plumbing for openai.c: headers, an SSE chunk, the end, an abrupt drop. */
void conn_stream_begin(struct conn *c);
void conn_stream_chunk(struct conn *c, const char *data, size_t len);
void conn_stream_end(struct conn *c, const char *data, size_t len); /* a last chunk, then the end */
void conn_reply(struct conn *c, int status, const char *content_type, const char *body, size_t len);
void conn_drop(struct conn *c);

/* ---- the simulator ----------------------------------------------------------- */

typedef struct endpoint {
  struct sim *sim;
  int index;
  int port;
  char addr[64]; /* host:port, as the gateway names it */
  uv_tcp_t listener;
  bool listening;
  kvcache *kv;
  uint64_t kv_seed;  /* this engine's hash seed (--kv-hash-seed) */
  kv_publisher *pub; /* NULL without --kv-events-port */
  job_list waiting, running;
  counters m;
  uint64_t rng;             /* per-endpoint stream for failure injection */
  uint64_t seq;             /* request ids */
  uint64_t prefill_free_at; /* loop time (ms) the last queued prefill ends (--prefill-serial) */
  double slowness;          /* latency multiplier: --slow-factor or 1, then POST /sim/speed */
  struct conn *conns;       /* open connections, closed on shutdown */
} endpoint;

typedef struct sim {
  sim_config cfg;
  uv_loop_t *loop;
  endpoint *eps;
  uv_signal_t sigint, sigterm;
  bool stopping;
  void *zmq;        /* the ZMQ context, with --kv-events-port */
  uv_check_t flush; /* publishes each endpoint's events once per loop turn */
  bool flushing;
} sim;

/* What multiplies this endpoint's prefill and decode times now. */
double endpoint_slowness(const endpoint *ep);
/* A new hash seed for an engine: --kv-hash-seed's number, or a random one. */
uint64_t endpoint_kv_seed(const sim *s);

#endif
