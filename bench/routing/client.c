/* bench-routing-client: the routing benchmark's load generator (bench/routing).
 *
 * One seeded workload of conversations.  G groups share a prefix of
 * --shared-tokens (a system prompt, a document; 0: no sharing), Q
 * conversations per group; each conversation adds its own --context-tokens,
 * then T turns: turn k re-sends everything before it (questions and fixed
 * synthetic answers) and a new question, and is sent only once turn k-1 has
 * completed.  With --loras a,b,... group g's requests name adapter g mod n as
 * their model.  The families of bench/routing/run.sh are settings of these.
 *
 * Arrivals: open-loop Poisson at --rate per second; --burst ON,OFF (ms) sends
 * at that rate during ON and nothing during OFF; --concurrency C is a closed
 * loop instead (C requests in flight, the next one sent when one completes).
 * The request sequence and arrival times are a pure function of --seed and the
 * sizes, so every routing config sees the same load.
 *
 * Each request is a streamed POST /v1/completions on its own connection (so
 * the gateway sees independent clients), carrying `x-bench-group` (read only
 * by the oracle picker).  With --oracle host:port (a lupin-sim), each request
 * first asks the simulator which endpoint's cache holds the most of its
 * prompt now (POST /sim/oracle, knowledge no router has) and names that
 * endpoint in x-gateway-destination-endpoint-subset: the resident oracle.  TTFT is taken at the
 * first SSE `data:` line of the response body, with the monotonic clock; latency at the end of the
 * response.
 *
 * With --class (repeated) the workload is one of latency objectives instead:
 * --requests single-turn requests, each drawn into a class by its share, its
 * prompt one of the class's shared prefixes plus a tail of its own, its
 * max_tokens drawn from the class's range, sent with the class's objectives
 * as llm-d's headers (x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms,
 * x-gateway-inference-objective).  Each request's TPOT is taken between its
 * first and last token lines (`data:` lines but [DONE]); it met its class's
 * objectives when it completed with TTFT and TPOT within them (a 429, shed by
 * the gateway, did not, and is counted apart).
 *
 * Prints one line per request on --out (id group conv turn status ttft_ms
 * latency_ms endpoint, then with --class: class tpot_ms met) and a summary
 * on stdout as key=value pairs (with --class also per class: NAME_requests,
 * NAME_met, NAME_shed, NAME_ttft_p50_ms, ..., NAME_tpot_p90_ms), including
 * `bound_hit`: the best prefix-cache hit rate any routing could reach on this
 * sequence with caches that never evict (each request's longest run of
 * leading full blocks seen before in any request of the same model, capped as
 * vLLM caps a lookup).
 *
 * Built on libuv and http_parser, as the gateway and the simulator are.
 */
#define _GNU_SOURCE /* memmem */
#include <arpa/inet.h>
#include <http_parser.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One objective class of --class NAME:key=value,...: its share of the
 * requests, its objectives (ms; tpot 0: none), the priority header, and the
 * shape of its prompts and outputs. */
typedef struct {
  char name[32];
  double share;
  double ttft_ms, tpot_ms;
  char objective[32]; /* x-gateway-inference-objective; "": not sent */
  int prefixes, prefix_tokens;
  int tail_min, tail_max; /* tokens after the shared prefix */
  int out_min, out_max;   /* max_tokens */
} slo_class;
#define MAX_CLASSES 8

typedef struct {
  const char *host;
  int port;
  double rate;
  double burst_on_ms, burst_off_ms; /* 0, 0: plain Poisson */
  int concurrency;                  /* > 0: closed loop */
  int groups, questions, turns;
  int system_tokens, context_tokens, question_tokens, answer_tokens, max_tokens;
  int block_size;
  uint64_t seed;
  const char *model;
  char **loras;
  int nloras;
  const char *out;
  const char *oracle; /* host:port of a lupin-sim answering /sim/oracle */
  slo_class classes[MAX_CLASSES];
  int nclasses; /* > 0: the objectives workload of --requests requests */
  int requests;
} options;

typedef struct req {
  int id, group, conv, turn;
  int cls, max_tokens; /* its class (with --class), output tokens asked */
  const char *model;
  char *prompt;
  size_t prompt_len;
  double arrive_ms;      /* planned arrival, from the start */
  struct req *next_turn; /* the same conversation's next turn */
  int prev_done;         /* previous turn completed (or none) */
  int arrived, sent;
  /* the exchange */
  uv_tcp_t tcp;
  uv_connect_t conn;
  uv_write_t wr;
  char *wbuf;
  size_t wlen;
  http_parser parser;
  char hdr_field[64];
  size_t hdr_field_len;
  int hdr_is_endpoint;
  char endpoint[64];
  uint64_t t_sent, t_first, t_done;
  int status, complete, finished;
  /* token lines, for TPOT (with --class): the current line's start */
  char line[16];
  int line_len, ntok;
  uint64_t t_line, t_tok_first, t_tok_last;
} req;

static options opt = {.host = "127.0.0.1",
                      .port = 8080,
                      .rate = 10,
                      .groups = 32,
                      .questions = 10,
                      .turns = 1,
                      .system_tokens = 1000,
                      .question_tokens = 100,
                      .answer_tokens = 100,
                      .max_tokens = 32,
                      .block_size = 16,
                      .seed = 1,
                      .model = "meta-llama/Llama-3.1-8B-Instruct",
                      .out = NULL,
                      .requests = 400};

static req *reqs;
static int nreqs, nfinished, nsent, inflight;
static uv_loop_t *loop;
static uv_timer_t arrival_timer;
static int next_arrival; /* index into reqs, in arrival order */
static int next_closed;  /* closed loop: no request before this index is unsent */
static uint64_t t0;
static struct sockaddr_in target;
/* --target a,b,c: replicas behind a random L4 split (bench/replicas): each
 * request connects to one drawn from the seed and its index */
static struct sockaddr_in targets[16];
static int ntargets;
static char *target_list;

/* --- deterministic text ------------------------------------------------- */
static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return (splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

static const char *WORDS[] = {"the",    "river",  "lamp",   "stone",  "quiet",  "north",  "garden",
                              "signal", "amber",  "window", "harbor", "seven",  "paper",  "cloud",
                              "engine", "silver", "market", "winter", "bridge", "orchard"};

/* Appends about `chars` characters of words drawn from seed s (JSON-safe). */
static void words(char *dst, size_t *len, size_t chars, uint64_t s) {
  size_t start = *len;
  while (*len - start < chars) {
    const char *w = WORDS[splitmix(&s) % (sizeof WORDS / sizeof *WORDS)];
    size_t n = strlen(w);
    memcpy(dst + *len, w, n);
    dst[*len + n] = ' ';
    *len += n + 1;
  }
}

/* --- the workload ------------------------------------------------------- */
/* Time on the wall of the `on`-th millisecond of sending time: --burst
 * leaves OFF ms of silence after every ON ms. */
static double on_off(double t) {
  if (opt.burst_on_ms <= 0) return t;
  double period = floor(t / opt.burst_on_ms);
  return period * (opt.burst_on_ms + opt.burst_off_ms) + (t - period * opt.burst_on_ms);
}

static void build_prompt(req *r) {
  size_t sys_chars = (size_t)opt.system_tokens * 4, ctx_chars = (size_t)opt.context_tokens * 4,
         q_chars = (size_t)opt.question_tokens * 4, a_chars = (size_t)opt.answer_tokens * 4;
  size_t cap = sys_chars + ctx_chars + (size_t)r->turn * (q_chars + a_chars + 128) + 256;
  size_t n = 0;
  r->prompt = malloc(cap);
  if (sys_chars > 0) {
    n += (size_t)sprintf(r->prompt, "system prompt of group %d: ", r->group);
    words(r->prompt, &n, sys_chars, 1000003ULL * (uint64_t)(r->group + 1) + opt.seed);
  }
  if (ctx_chars > 0) {
    n += (size_t)sprintf(r->prompt + n, "context of conversation %d: ", r->conv);
    words(r->prompt, &n, ctx_chars, 15485863ULL * (uint64_t)(r->conv + 1) + opt.seed + 5);
  }
  for (int k = 1; k <= r->turn; k++) {
    n += (size_t)sprintf(r->prompt + n, "user %d: ", k);
    words(r->prompt, &n, q_chars, 7919ULL * (uint64_t)(r->conv * 64 + k + 1) + opt.seed + 17);
    if (k < r->turn) {
      n += (size_t)sprintf(r->prompt + n, "assistant: ");
      words(r->prompt, &n, a_chars, 104729ULL * (uint64_t)(r->conv * 64 + k + 1) + opt.seed + 29);
    }
  }
  n += (size_t)sprintf(r->prompt + n, "assistant:");
  r->prompt_len = n;
}

static void build_workload(void) {
  int nconv = opt.groups * opt.questions;
  nreqs = nconv * opt.turns;
  reqs = calloc((size_t)nreqs, sizeof *reqs);
  /* arrival order: every conversation id T times, shuffled; the k-th
   * appearance of a conversation is its turn k */
  int *order = malloc(sizeof(int) * (size_t)nreqs);
  for (int i = 0; i < nreqs; i++)
    order[i] = i % nconv;
  uint64_t s = opt.seed * 0x2545F4914F6CDD1DULL + 1;
  for (int i = nreqs - 1; i > 0; i--) {
    int j = (int)(splitmix(&s) % (uint64_t)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  int *turns_seen = calloc((size_t)nconv, sizeof(int));
  req **last = calloc((size_t)nconv, sizeof(req *));
  double t = 0;
  for (int i = 0; i < nreqs; i++) {
    req *r = &reqs[i];
    int conv = order[i];
    r->id = i;
    r->conv = conv;
    r->group = conv % opt.groups;
    r->turn = ++turns_seen[conv];
    r->model = opt.nloras ? opt.loras[r->group % opt.nloras] : opt.model;
    r->max_tokens = opt.max_tokens;
    build_prompt(r);
    t += -log(1.0 - uniform(&s)) * 1000.0 / opt.rate;
    r->arrive_ms = on_off(t);
    r->prev_done = last[conv] == NULL;
    if (last[conv]) last[conv]->next_turn = r;
    last[conv] = r;
  }
  free(order);
  free(turns_seen);
  free(last);
}

/* An integer in [lo, hi] drawn from s. */
static int draw(uint64_t *s, int lo, int hi) {
  return lo + (int)(splitmix(s) % (uint64_t)(hi - lo + 1));
}

/* Class c's prompt: its shared prefix r->group, then tail tokens of its own. */
static void build_class_prompt(req *r, int tail) {
  const slo_class *c = &opt.classes[r->cls];
  size_t pre_chars = (size_t)c->prefix_tokens * 4, tail_chars = (size_t)tail * 4;
  size_t n = 0;
  r->prompt = malloc(pre_chars + tail_chars + 256);
  if (pre_chars > 0) {
    n += (size_t)sprintf(r->prompt, "%s prefix %d: ", c->name, r->group);
    words(r->prompt, &n, pre_chars,
          2654435761ULL * (uint64_t)(r->cls * 64 + r->group + 1) + opt.seed);
  }
  n += (size_t)sprintf(r->prompt + n, "request %d: ", r->id);
  words(r->prompt, &n, tail_chars, 15485863ULL * (uint64_t)(r->id + 1) + opt.seed + 5);
  n += (size_t)sprintf(r->prompt + n, "assistant:");
  r->prompt_len = n;
}

/* --class: --requests single-turn requests, each's class, prefix, tail,
 * output length and arrival drawn from the seed in turn. */
static void build_objectives_workload(void) {
  double total = 0;
  for (int c = 0; c < opt.nclasses; c++)
    total += opt.classes[c].share;
  nreqs = opt.requests;
  reqs = calloc((size_t)nreqs, sizeof *reqs);
  uint64_t s = opt.seed * 0x2545F4914F6CDD1DULL + 1;
  double t = 0;
  for (int i = 0; i < nreqs; i++) {
    req *r = &reqs[i];
    double u = uniform(&s) * total;
    int c = 0;
    while (c < opt.nclasses - 1 && u >= opt.classes[c].share)
      u -= opt.classes[c++].share;
    const slo_class *k = &opt.classes[c];
    r->id = r->conv = i;
    r->turn = 1;
    r->cls = c;
    r->group = draw(&s, 0, k->prefixes - 1);
    r->max_tokens = draw(&s, k->out_min, k->out_max);
    r->model = opt.model;
    r->prev_done = 1;
    build_class_prompt(r, draw(&s, k->tail_min, k->tail_max));
    t += -log(1.0 - uniform(&s)) * 1000.0 / opt.rate;
    r->arrive_ms = on_off(t);
  }
}

/* --- the bound: a set of chained block hashes ---------------------------- */
static uint64_t *set;
static size_t set_cap;

static uint64_t block_hash(uint64_t parent, const char *p, size_t n) {
  uint64_t h = parent ^ 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
  return h ? h : 1;
}
/* Inserts h; returns 1 when it was there already. */
static int set_put(uint64_t h) {
  size_t i = h & (set_cap - 1);
  while (set[i]) {
    if (set[i] == h) return 1;
    i = (i + 1) & (set_cap - 1);
  }
  set[i] = h;
  return 0;
}

/* The best hit rate any routing could reach with caches that never evict. */
static void bound(double *hit_tokens, double *query_tokens) {
  size_t bchars = (size_t)opt.block_size * 4, total = 0;
  for (int i = 0; i < nreqs; i++)
    total += reqs[i].prompt_len / bchars + 1;
  for (set_cap = 1024; set_cap < 2 * total; set_cap *= 2) {
  }
  set = calloc(set_cap, sizeof *set);
  *hit_tokens = *query_tokens = 0;
  for (int i = 0; i < nreqs; i++) {
    req *r = &reqs[i];
    uint64_t h = block_hash(0, r->model, strlen(r->model));
    long blocks = 0, full = (long)(r->prompt_len / bchars), run = 1;
    for (long b = 0; b < full; b++) {
      h = block_hash(h, r->prompt + (size_t)b * bchars, bchars);
      if (set_put(h) && run)
        blocks++;
      else
        run = 0;
    }
    long tokens = (long)((r->prompt_len + 3) / 4), cap = (tokens - 1) / opt.block_size;
    if (blocks > cap) blocks = cap;
    *hit_tokens += (double)blocks * opt.block_size;
    *query_tokens += (double)tokens;
  }
  free(set);
}

/* --- one exchange ------------------------------------------------------- */
static void finish(req *r);
static void send_req(req *r);

static void on_close(uv_handle_t *h) {
  req *r = h->data;
  free(r->wbuf);
  r->wbuf = NULL;
  nfinished++;
  if (nfinished == nreqs) uv_stop(loop);
}

/* Closed loop: keeps --concurrency requests in flight, in sequence order,
 * skipping turns whose previous turn has not completed yet. */
static void pump(void) {
  while (next_closed < nreqs && reqs[next_closed].sent)
    next_closed++;
  for (int i = next_closed; i < nreqs && inflight < opt.concurrency; i++)
    if (!reqs[i].sent && reqs[i].prev_done) send_req(&reqs[i]);
}

static void finish(req *r) {
  if (r->finished) return;
  r->finished = 1;
  inflight--;
  if (!r->t_done) r->t_done = uv_hrtime();
  uv_close((uv_handle_t *)&r->tcp, on_close);
  if (r->next_turn) {
    r->next_turn->prev_done = 1;
    if (!opt.concurrency && r->next_turn->arrived) send_req(r->next_turn);
  }
  if (opt.concurrency) pump();
}

static int on_status(http_parser *p, const char *at, size_t len) {
  (void)at, (void)len;
  ((req *)p->data)->status = p->status_code;
  return 0;
}
static int on_header_field(http_parser *p, const char *at, size_t len) {
  req *r = p->data;
  if (len > sizeof r->hdr_field - 1 - r->hdr_field_len)
    len = sizeof r->hdr_field - 1 - r->hdr_field_len;
  memcpy(r->hdr_field + r->hdr_field_len, at, len);
  r->hdr_field_len += len;
  r->hdr_field[r->hdr_field_len] = 0;
  r->hdr_is_endpoint = strcasecmp(r->hdr_field, "x-sim-endpoint") == 0;
  return 0;
}
static int on_header_value(http_parser *p, const char *at, size_t len) {
  req *r = p->data;
  r->hdr_field_len = 0;
  if (r->hdr_is_endpoint) {
    size_t have = strlen(r->endpoint);
    if (len > sizeof r->endpoint - 1 - have) len = sizeof r->endpoint - 1 - have;
    memcpy(r->endpoint + have, at, len);
    r->endpoint[have + len] = 0;
  }
  return 0;
}
/* A line of the stream ended: a `data:` line but [DONE] carries a token. */
static void token_line(req *r) {
  size_t n = (size_t)r->line_len;
  if (n < 5 || memcmp(r->line, "data:", 5) || memmem(r->line, n, "[DONE]", 6)) return;
  if (!r->ntok++) r->t_tok_first = r->t_line;
  r->t_tok_last = r->t_line;
}

/* Splits the body into lines across reads, timing each at its first byte. */
static void scan_lines(req *r, const char *at, size_t len, uint64_t now) {
  for (size_t i = 0; i < len; i++) {
    if (at[i] == '\n') {
      token_line(r);
      r->line_len = 0;
      continue;
    }
    if (r->line_len == 0) r->t_line = now;
    if (r->line_len < (int)sizeof r->line) r->line[r->line_len++] = at[i];
  }
}

static int on_body(http_parser *p, const char *at, size_t len) {
  req *r = p->data;
  if (!r->t_first && memmem(at, len, "data:", 5)) r->t_first = uv_hrtime();
  if (opt.nclasses) scan_lines(r, at, len, uv_hrtime());
  return 0;
}
static int on_message_complete(http_parser *p) {
  req *r = p->data;
  r->complete = 1;
  r->t_done = uv_hrtime();
  finish(r);
  return 0;
}
static const http_parser_settings settings = {
    .on_status = on_status,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void on_alloc(uv_handle_t *h, size_t size, uv_buf_t *buf) {
  (void)h;
  static char slab[65536];
  (void)size;
  *buf = uv_buf_init(slab, sizeof slab);
}
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  req *r = s->data;
  if (r->finished) return;
  if (n < 0) {
    http_parser_execute(&r->parser, &settings, NULL, 0); /* EOF ends a close-delimited body */
    finish(r);
    return;
  }
  size_t done = http_parser_execute(&r->parser, &settings, buf->base, (size_t)n);
  if (!r->finished && done != (size_t)n) finish(r);
}
static void on_write(uv_write_t *w, int status) {
  req *r = w->data;
  if (status < 0) finish(r);
}
static void on_connect(uv_connect_t *c, int status) {
  req *r = c->data;
  if (status < 0) {
    finish(r);
    return;
  }
  uv_buf_t b = uv_buf_init(r->wbuf, (unsigned)r->wlen);
  r->wr.data = r;
  uv_write(&r->wr, (uv_stream_t *)&r->tcp, &b, 1, on_write);
  uv_read_start((uv_stream_t *)&r->tcp, on_alloc, on_read);
}

/* --- the resident oracle (--oracle) -------------------------------------- */
/* One blocking exchange with the simulator: it answers in well under a
 * millisecond on loopback, and the bench's clock starts after it. */
static char *oracle_call(const char *body, size_t blen) {
  static struct sockaddr_in sa;
  if (!sa.sin_port) {
    char host[64] = "127.0.0.1";
    const char *c = strrchr(opt.oracle, ':');
    if (c && (size_t)(c - opt.oracle) < sizeof host) {
      memcpy(host, opt.oracle, (size_t)(c - opt.oracle));
      host[c - opt.oracle] = 0;
    }
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(c ? c + 1 : opt.oracle));
    inet_pton(AF_INET, host, &sa.sin_addr);
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    if (fd >= 0) close(fd);
    return NULL;
  }
  char head[256];
  int hl = snprintf(head, sizeof head,
                    "POST /sim/oracle HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                    "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                    opt.oracle, blen);
  size_t cap = 1 << 16, n = 0;
  char *out = malloc(cap);
  if (write(fd, head, (size_t)hl) != hl || write(fd, body, blen) != (ssize_t)blen) n = 0;
  for (ssize_t k; (k = read(fd, out + n, cap - n - 1)) > 0;) {
    n += (size_t)k;
    if (n + 1 == cap) out = realloc(out, cap *= 2);
  }
  close(fd);
  out[n] = 0;
  return out;
}

/* The endpoint holding the most of the prompt now (ties: the least busy),
 * as "127.0.0.1:PORT", or 0 when the oracle did not answer. */
static int oracle_pick(const char *body, size_t blen, char *dst, size_t cap) {
  char *answer = oracle_call(body, blen);
  const char *json = answer ? strstr(answer, "\r\n\r\n") : NULL;
  json_t *root = json ? json_loads(json + 4, 0, NULL) : NULL;
  json_t *eps = json_object_get(root, "endpoints");
  long best_port = 0, best_cached = -1, best_busy = 0;
  for (size_t i = 0; i < json_array_size(eps); i++) {
    json_t *e = json_array_get(eps, i);
    long port = (long)json_integer_value(json_object_get(e, "port"));
    long cached = (long)json_integer_value(json_object_get(e, "cached_tokens"));
    long busy = (long)(json_integer_value(json_object_get(e, "running")) +
                       json_integer_value(json_object_get(e, "waiting")));
    if (cached > best_cached || (cached == best_cached && busy < best_busy))
      best_port = port, best_cached = cached, best_busy = busy;
  }
  json_decref(root);
  free(answer);
  if (!best_port) return 0;
  snprintf(dst, cap, "127.0.0.1:%ld", best_port);
  return 1;
}

/* The class's objectives as llm-d's request headers. */
static void slo_headers(const slo_class *c, char *dst, size_t cap) {
  size_t n = (size_t)snprintf(dst, cap, "x-llm-d-slo-ttft-ms: %.15g\r\n", c->ttft_ms);
  if (c->tpot_ms > 0 && n < cap)
    n += (size_t)snprintf(dst + n, cap - n, "x-llm-d-slo-tpot-ms: %.15g\r\n", c->tpot_ms);
  if (c->objective[0] && n < cap)
    snprintf(dst + n, cap - n, "x-gateway-inference-objective: %s\r\n", c->objective);
}

static void send_req(req *r) {
  size_t cap = r->prompt_len + 1024;
  char *body = malloc(cap);
  int blen = snprintf(body, cap,
                      "{\"model\":\"%s\",\"stream\":true,\"max_tokens\":%d,\"prompt\":\"%.*s\"}",
                      r->model, r->max_tokens, (int)r->prompt_len, r->prompt);
  char subset[160] = "";
  char pick[64];
  if (opt.oracle && oracle_pick(body, (size_t)blen, pick, sizeof pick))
    snprintf(subset, sizeof subset, "x-gateway-destination-endpoint-subset: %s\r\n", pick);
  char slo[192] = "";
  if (opt.nclasses) slo_headers(&opt.classes[r->cls], slo, sizeof slo);
  r->wbuf = malloc((size_t)blen + 1024);
  r->wlen = (size_t)sprintf(r->wbuf,
                            "POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                            "Content-Type: application/json\r\nContent-Length: %d\r\n"
                            "x-bench-group: %d\r\n%s%sConnection: close\r\n\r\n",
                            opt.host, opt.port, blen, r->group, subset, slo);
  memcpy(r->wbuf + r->wlen, body, (size_t)blen);
  r->wlen += (size_t)blen;
  free(body);
  http_parser_init(&r->parser, HTTP_RESPONSE);
  r->parser.data = r;
  r->tcp.data = r;
  r->conn.data = r;
  uv_tcp_init(loop, &r->tcp);
  uv_tcp_nodelay(&r->tcp, 1);
  r->sent = 1;
  nsent++;
  inflight++;
  r->t_sent = uv_hrtime();
  const struct sockaddr_in *to = &target;
  if (ntargets > 1) {
    uint64_t k = opt.seed * 0x9E3779B97F4A7C15ULL + (uint64_t)(r - reqs) * 0xD1B54A32D192ED03ULL;
    to = &targets[splitmix(&k) % (uint64_t)ntargets];
  }
  uv_tcp_connect(&r->conn, &r->tcp, (const struct sockaddr *)to, on_connect);
}

static void on_arrival(uv_timer_t *t) {
  double now_ms = (double)(uv_hrtime() - t0) / 1e6;
  while (next_arrival < nreqs && reqs[next_arrival].arrive_ms <= now_ms + 0.05) {
    req *r = &reqs[next_arrival++];
    r->arrived = 1;
    if (r->prev_done) send_req(r); /* else sent when the previous turn completes */
  }
  if (next_arrival < nreqs) {
    double wait = reqs[next_arrival].arrive_ms - (double)(uv_hrtime() - t0) / 1e6;
    uv_timer_start(t, on_arrival, wait > 0 ? (uint64_t)wait : 0, 0);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double pct(const double *v, int n, double p) {
  if (n == 0) return 0;
  int i = (int)ceil(p * n) - 1;
  return v[i < 0 ? 0 : i];
}

/* --- objectives (--class) ------------------------------------------------ */
/* Mean time between its first and last token lines; -1 with fewer than 2. */
static double tpot_ms(const req *r) {
  if (r->ntok < 2) return -1;
  return (double)(r->t_tok_last - r->t_tok_first) / 1e6 / (r->ntok - 1);
}

/* Completed within its class's objectives (TPOT only when it has one and the
 * answer had two tokens or more). */
static int met(const req *r) {
  const slo_class *c = &opt.classes[r->cls];
  if (!(r->complete && r->status == 200 && r->t_first)) return 0;
  double tp = tpot_ms(r);
  return (double)(r->t_first - r->t_sent) / 1e6 <= c->ttft_ms &&
         (c->tpot_ms <= 0 || tp < 0 || tp <= c->tpot_ms);
}

/* Class c's summary keys: counts, then TTFT and TPOT percentiles over its
 * completed requests. */
static void report_class(int c) {
  double *tf = malloc(sizeof(double) * (size_t)nreqs), *tp = malloc(sizeof(double) * (size_t)nreqs);
  int n = 0, nmet = 0, nshed = 0, ok = 0, ntp = 0;
  for (int i = 0; i < nreqs; i++) {
    req *r = &reqs[i];
    if (r->cls != c) continue;
    n++;
    nmet += met(r);
    nshed += r->status == 429;
    if (!(r->complete && r->status == 200 && r->t_first)) continue;
    tf[ok++] = (double)(r->t_first - r->t_sent) / 1e6;
    if (r->ntok >= 2) tp[ntp++] = tpot_ms(r);
  }
  qsort(tf, (size_t)ok, sizeof *tf, cmp_double);
  qsort(tp, (size_t)ntp, sizeof *tp, cmp_double);
  const char *k = opt.classes[c].name;
  printf(" %s_requests=%d %s_ok=%d %s_met=%d %s_shed=%d %s_ttft_p50_ms=%.2f %s_ttft_p90_ms=%.2f"
         " %s_tpot_p50_ms=%.2f %s_tpot_p90_ms=%.2f",
         k, n, k, ok, k, nmet, k, nshed, k, pct(tf, ok, 0.5), k, pct(tf, ok, 0.9), k,
         pct(tp, ntp, 0.5), k, pct(tp, ntp, 0.9));
  free(tf);
  free(tp);
}

/* --dry-run with --class: each class's requests and mean prompt tokens. */
static void dry_classes(void) {
  for (int c = 0; c < opt.nclasses; c++) {
    int n = 0;
    double tokens = 0;
    for (int i = 0; i < nreqs; i++)
      if (reqs[i].cls == c) n++, tokens += (double)(reqs[i].prompt_len + 3) / 4;
    printf(" %s_requests=%d %s_prompt_tokens_mean=%.0f", opt.classes[c].name, n,
           opt.classes[c].name, n ? tokens / n : 0);
  }
}

static void usage(void) {
  fprintf(stderr, "usage: bench-routing-client [--target host:port[,host:port...]] [--rate req/s]\n"
                  "  [--burst ON_MS,OFF_MS] [--concurrency C] [--groups G] [--questions Q]\n"
                  "  [--turns T] [--system-tokens N] [--context-tokens N] [--question-tokens N]\n"
                  "  [--answer-tokens N] [--max-tokens N] [--block-size N] [--seed N] [--model M]\n"
                  "  [--loras a,b,...] [--out per-request-file] [--oracle host:port]\n"
                  "  [--class NAME:share=S,ttft=MS[,tpot=MS][,objective=P][,prefixes=N]\n"
                  "     [,prefix-tokens=N][,tail=MIN-MAX][,output=MIN-MAX] ... [--requests N]]\n"
                  "  [--dry-run]\n");
  exit(2);
}

static void bad_class(const char *spec, const char *why) {
  fprintf(stderr, "bench-routing-client: --class %s: %s\n", spec, why);
  exit(2);
}

/* "MIN-MAX" (or one number) into lo, hi; 0 when malformed. */
static int range(const char *v, int *lo, int *hi) {
  char *end;
  *lo = *hi = (int)strtol(v, &end, 10);
  if (*end == '-') *hi = (int)strtol(end + 1, &end, 10);
  return end != v && *end == 0 && *lo <= *hi;
}

/* One class's key=value settings, checked. */
static void class_key(slo_class *c, const char *spec, const char *k, const char *v) {
  char *end = NULL;
  if (!strcmp(k, "share"))
    c->share = strtod(v, &end);
  else if (!strcmp(k, "ttft"))
    c->ttft_ms = strtod(v, &end);
  else if (!strcmp(k, "tpot"))
    c->tpot_ms = strtod(v, &end);
  else if (!strcmp(k, "prefixes"))
    c->prefixes = (int)strtol(v, &end, 10);
  else if (!strcmp(k, "prefix-tokens"))
    c->prefix_tokens = (int)strtol(v, &end, 10);
  else if (!strcmp(k, "objective")) {
    if (!*v || strlen(v) >= sizeof c->objective) bad_class(spec, "objective: 1 to 31 characters");
    strcpy(c->objective, v);
    return;
  } else if (!strcmp(k, "tail")) {
    if (!range(v, &c->tail_min, &c->tail_max) || c->tail_min < 0)
      bad_class(spec, "tail: MIN-MAX tokens, 0 <= MIN <= MAX");
    return;
  } else if (!strcmp(k, "output")) {
    if (!range(v, &c->out_min, &c->out_max) || c->out_min < 1)
      bad_class(spec, "output: MIN-MAX tokens, 1 <= MIN <= MAX");
    return;
  } else
    bad_class(spec, "keys: share ttft tpot objective prefixes prefix-tokens tail output");
  if (end == v || *end) bad_class(spec, "a value is not a number");
}

/* --class NAME:key=value,...: defaults one 100-token tail and 32 tokens out. */
static void parse_class(const char *spec) {
  if (opt.nclasses == MAX_CLASSES) bad_class(spec, "at most 8 classes");
  slo_class *c = &opt.classes[opt.nclasses++];
  *c = (slo_class){.prefixes = 1, .tail_min = 100, .tail_max = 100, .out_min = 32, .out_max = 32};
  const char *colon = strchr(spec, ':');
  size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
  if (nlen == 0 || nlen >= sizeof c->name ||
      strspn(spec, "abcdefghijklmnopqrstuvwxyz0123456789_") < nlen)
    bad_class(spec, "NAME: 1 to 31 of a-z 0-9 _ (it names summary keys)");
  memcpy(c->name, spec, nlen);
  char *list = strdup(colon ? colon + 1 : "");
  for (char *kv = strtok(list, ","); kv; kv = strtok(NULL, ",")) {
    char *eq = strchr(kv, '=');
    if (!eq) bad_class(spec, "settings are key=value, separated by commas");
    *eq = 0;
    class_key(c, spec, kv, eq + 1);
  }
  free(list);
  if (!(c->share > 0) || !(c->ttft_ms > 0) || !(c->tpot_ms >= 0) || c->prefixes < 1 ||
      c->prefix_tokens < 0)
    bad_class(spec, "needs share > 0, ttft > 0 (ms), tpot >= 0 (0: none), prefixes >= 1, "
                    "prefix-tokens >= 0");
}

int main(int argc, char **argv) {
  int dry = 0;
  static char hostbuf[256];
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--dry-run")) {
      dry = 1;
      continue;
    }
    if (!v) usage();
    i++;
    if (!strcmp(a, "--target")) {
      if (strchr(v, ',')) target_list = strdup(v);
      const char *c = strchr(v, ',') ? NULL : strrchr(v, ':');
      if (target_list) {
        char *first = strdup(v);
        *strchr(first, ',') = 0;
        c = strrchr(first, ':');
        v = first;
      }
      if (!c || (size_t)(c - v) >= sizeof hostbuf) usage();
      memcpy(hostbuf, v, (size_t)(c - v));
      opt.host = hostbuf;
      opt.port = atoi(c + 1);
    } else if (!strcmp(a, "--rate"))
      opt.rate = atof(v);
    else if (!strcmp(a, "--burst")) {
      if (sscanf(v, "%lf,%lf", &opt.burst_on_ms, &opt.burst_off_ms) != 2) usage();
    } else if (!strcmp(a, "--concurrency"))
      opt.concurrency = atoi(v);
    else if (!strcmp(a, "--context-tokens"))
      opt.context_tokens = atoi(v);
    else if (!strcmp(a, "--loras")) {
      char *list = strdup(v);
      for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        opt.loras = realloc(opt.loras, sizeof(char *) * (size_t)(opt.nloras + 1));
        opt.loras[opt.nloras++] = t;
      }
    } else if (!strcmp(a, "--groups"))
      opt.groups = atoi(v);
    else if (!strcmp(a, "--questions"))
      opt.questions = atoi(v);
    else if (!strcmp(a, "--turns"))
      opt.turns = atoi(v);
    else if (!strcmp(a, "--system-tokens"))
      opt.system_tokens = atoi(v);
    else if (!strcmp(a, "--question-tokens"))
      opt.question_tokens = atoi(v);
    else if (!strcmp(a, "--answer-tokens"))
      opt.answer_tokens = atoi(v);
    else if (!strcmp(a, "--max-tokens"))
      opt.max_tokens = atoi(v);
    else if (!strcmp(a, "--block-size"))
      opt.block_size = atoi(v);
    else if (!strcmp(a, "--seed"))
      opt.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--oracle"))
      opt.oracle = v;
    else if (!strcmp(a, "--class"))
      parse_class(v);
    else if (!strcmp(a, "--requests"))
      opt.requests = atoi(v);
    else if (!strcmp(a, "--model"))
      opt.model = v;
    else if (!strcmp(a, "--out"))
      opt.out = v;
    else
      usage();
  }
  if (opt.rate <= 0 || opt.groups < 1 || opt.questions < 1 || opt.turns < 1 || opt.turns > 63 ||
      opt.block_size < 1 || opt.concurrency < 0 || opt.burst_on_ms < 0 || opt.burst_off_ms < 0 ||
      opt.system_tokens < 0 || opt.context_tokens < 0 || opt.question_tokens < 1 ||
      opt.requests < 1)
    usage();
  if (opt.nclasses)
    build_objectives_workload();
  else
    build_workload();
  double bh, bq;
  bound(&bh, &bq);
  if (dry) {
    printf("requests=%d prompt_tokens=%.0f bound_hit=%.4f", nreqs, bq, bh / bq);
    dry_classes();
    printf("\n");
    return 0;
  }
  loop = uv_default_loop();
  if (uv_ip4_addr(opt.host, opt.port, &target)) {
    fprintf(stderr, "bad target %s:%d\n", opt.host, opt.port);
    return 2;
  }
  for (char *t = target_list ? strtok(target_list, ",") : NULL; t && ntargets < 16;
       t = strtok(NULL, ",")) {
    char *c = strrchr(t, ':');
    if (!c) usage();
    *c = 0;
    if (uv_ip4_addr(t, atoi(c + 1), &targets[ntargets++])) {
      fprintf(stderr, "bad target %s\n", t);
      return 2;
    }
  }
  t0 = uv_hrtime();
  if (opt.concurrency) {
    pump();
  } else {
    uv_timer_init(loop, &arrival_timer);
    uv_timer_start(&arrival_timer, on_arrival, (uint64_t)reqs[0].arrive_ms, 0);
  }
  uv_run(loop, UV_RUN_DEFAULT);
  uint64_t t_end = 0;
  FILE *f = opt.out ? fopen(opt.out, "w") : NULL;
  double *ttft = malloc(sizeof(double) * (size_t)nreqs),
         *lat = malloc(sizeof(double) * (size_t)nreqs);
  int ok = 0, shed = 0;
  double out_tokens = 0;
  for (int i = 0; i < nreqs; i++) {
    req *r = &reqs[i];
    int good = r->complete && r->status == 200 && r->t_first;
    double tf = good ? (double)(r->t_first - r->t_sent) / 1e6 : -1;
    double lt = good ? (double)(r->t_done - r->t_sent) / 1e6 : -1;
    if (good) {
      ttft[ok] = tf;
      lat[ok] = lt;
      ok++;
      out_tokens += r->max_tokens;
    }
    shed += r->status == 429;
    if (r->t_done > t_end) t_end = r->t_done;
    if (f) {
      fprintf(f, "%d %d %d %d %d %.3f %.3f %s", r->id, r->group, r->conv, r->turn, r->status, tf,
              lt, r->endpoint[0] ? r->endpoint : "-");
      if (opt.nclasses) fprintf(f, " %s %.3f %d", opt.classes[r->cls].name, tpot_ms(r), met(r));
      fprintf(f, "\n");
    }
  }
  if (f) fclose(f);
  qsort(ttft, (size_t)ok, sizeof *ttft, cmp_double);
  qsort(lat, (size_t)ok, sizeof *lat, cmp_double);
  double secs = (double)(t_end - t0) / 1e9;
  printf("requests=%d ok=%d seconds=%.3f throughput_rps=%.2f output_tok_s=%.1f "
         "ttft_p50_ms=%.2f ttft_p90_ms=%.2f ttft_p99_ms=%.2f latency_p50_ms=%.2f "
         "latency_p90_ms=%.2f bound_hit=%.4f",
         nreqs, ok, secs, ok / secs, out_tokens / secs, pct(ttft, ok, 0.5), pct(ttft, ok, 0.9),
         pct(ttft, ok, 0.99), pct(lat, ok, 0.5), pct(lat, ok, 0.9), bh / bq);
  if (opt.nclasses) {
    printf(" shed=%d", shed);
    for (int c = 0; c < opt.nclasses; c++)
      report_class(c);
  }
  printf("\n");
  /* a shed is the objectives workload's answer, not a failure */
  return ok + (opt.nclasses ? shed : 0) == nreqs ? 0 : 1;
}
