/* The request stream: deterministic prompts with shared prefixes, and
 * endpoint metrics that move between requests.
 *
 * Prompts are cut from one corpus of English-like words.  85% of requests
 * belong to one of 24 groups (skewed: low-numbered groups are hotter, as a
 * few system prompts or documents dominate real traffic); a group's requests
 * share a prefix of 50-90% of the prompt and end with their own text.  The
 * other 15% share nothing.  Before each request some endpoints' metrics move
 * (a scrape landing): the waiting queue steps by -2..+2 within 0..40 and the
 * KV-cache usage drifts by up to ±5% within 2-98%. */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GROUPS         24
#define SHARED_PERCENT 85

double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static uint64_t next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

static double unit(uint64_t *s) { return (next(s) >> 11) * (1.0 / 9007199254740992.0); }

static const char *const words[] = {
    "the",       "model",     "server",   "answers", "a",       "question",   "about",
    "inference", "and",       "cache",    "of",      "every",   "request",    "tokens",
    "prompt",    "system",    "you",      "are",     "helpful", "assistant",  "please",
    "summarize", "following", "document", "in",      "three",   "sentences,", "with",
    "care.",     "context:",  "user",     "asked",   "why",     "latency",    "grows",
    "when",      "queues",    "fill",     "up;",     "gateway", "routes",     "to",
    "replica",   "holding",   "its",      "prefix",  "blocks",  "already.",
};

void workload_init(workload *w, int n_endpoints, size_t prompt_bytes, uint64_t seed) {
  memset(w, 0, sizeof *w);
  w->n_endpoints = n_endpoints;
  w->prompt_bytes = prompt_bytes;
  w->seed = seed;
  uint64_t s = seed * 2 + 1;
  w->corpus_len = 4 * prompt_bytes + (1 << 20);
  w->corpus = malloc(w->corpus_len + 32);
  size_t n = 0;
  while (n < w->corpus_len) {
    const char *word = words[next(&s) % (sizeof words / sizeof *words)];
    size_t l = strlen(word);
    memcpy(w->corpus + n, word, l);
    n += l;
    w->corpus[n++] = ' ';
  }
  w->n_groups = GROUPS;
  w->group_off = malloc(GROUPS * sizeof *w->group_off);
  w->group_len = malloc(GROUPS * sizeof *w->group_len);
  for (int g = 0; g < GROUPS; g++) {
    w->group_len[g] = (size_t)(prompt_bytes * (0.5 + 0.4 * unit(&s)));
    w->group_off[g] = next(&s) % (w->corpus_len - prompt_bytes);
  }
  w->body_cap = prompt_bytes + 256;
  w->body = malloc(w->body_cap);
  w->queue = malloc(n_endpoints * sizeof *w->queue);
  w->kv = malloc(n_endpoints * sizeof *w->kv);
  w->changed = malloc(n_endpoints * sizeof *w->changed);
  workload_reset(w);
}

void workload_reset(workload *w) {
  w->rng = w->seed * 0x9E3779B97F4A7C15ull + 7;
  for (int i = 0; i < w->n_endpoints; i++) {
    w->queue[i] = (double)(next(&w->rng) % 10);
    w->kv[i] = 0.1 + 0.8 * unit(&w->rng);
    w->changed[i] = i;
  }
  w->n_changed = w->n_endpoints;
}

static void put(workload *w, const char *s, size_t n) {
  memcpy(w->body + w->body_len, s, n);
  w->body_len += n;
}

#define PUTS(w, lit) put(w, lit, sizeof lit - 1)

void workload_next(workload *w) {
  uint64_t *s = &w->rng;
  /* metrics: a few endpoints scraped since the last request */
  int k = w->n_endpoints / 8 > 0 ? w->n_endpoints / 8 : 1;
  w->n_changed = 0;
  for (int j = 0; j < k; j++) {
    int e = (int)(next(s) % (uint64_t)w->n_endpoints);
    double q = w->queue[e] + (double)(next(s) % 5) - 2;
    w->queue[e] = q < 0 ? 0 : q > 40 ? 40 : q;
    double u = w->kv[e] + (unit(s) - 0.5) * 0.1;
    w->kv[e] = u < 0.02 ? 0.04 - u : u > 0.98 ? 1.96 - u : u;
    w->changed[w->n_changed++] = e;
  }
  /* the prompt: a group's prefix and its own tail, or all its own */
  size_t shared = 0;
  w->group = -1;
  if (next(s) % 100 < SHARED_PERCENT) {
    double u = unit(s);
    w->group = (int)(u * u * w->n_groups);
    shared = w->group_len[w->group];
  }
  size_t tail = w->prompt_bytes - shared;
  size_t tail_off = next(s) % (w->corpus_len - tail);
  w->body_len = 0;
  PUTS(w, "{\"model\":\"" MODEL "\",\"prompt\":\"");
  if (shared) put(w, w->corpus + w->group_off[w->group], shared);
  put(w, w->corpus + tail_off, tail);
  PUTS(w, "\",\"max_tokens\":128,\"temperature\":0.7,\"stream\":true}");
}

void workload_free(workload *w) {
  free(w->corpus);
  free(w->group_off);
  free(w->group_len);
  free(w->body);
  free(w->queue);
  free(w->kv);
  free(w->changed);
}
