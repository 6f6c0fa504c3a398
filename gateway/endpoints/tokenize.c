/* Tokenize jobs: the precise prefix plugins need a shared prefix's token ids
 * (docs/kv-events.md); the runtime asks for them through
 * lupin_shared_on_tokenize, on whichever worker's thread scheduled the
 * request, and this file answers on the leader's loop: it POSTs the
 * prefix to an endpoint's /tokenize (vLLM's) and puts the ids in the
 * token cache (lupin_shared_tokens_put) for the requests that follow.
 * Nothing waits for it: a request whose ids are not there yet is scored
 * approximately.  Jobs past MAX_QUEUED are refused (the runtime asks again
 * later); MAX_RUNNING run at once, so a burst of new contexts cannot take
 * the engines' API servers. */
#include "endpoints/endpoints.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_QUEUED  256
#define MAX_RUNNING 4
#define TIMEOUT_MS  5000
#define MAX_BODY    (64u << 20) /* a tokenize answer's bytes at most */

typedef struct job {
  uint64_t key;
  char *endpoint, *body;
  size_t body_len;
  struct job *next;
} job;

typedef struct call {
  gw_tokenize *t;
  job *j;
  gw_upstream *up;
  int status;
  lh_buf answer;
} call;

struct gw_tokenize {
  lupin_gateway *gw; /* the leader */
  uv_async_t wake;
  pthread_mutex_t lock;
  job *head, *tail; /* under the lock */
  size_t queued;
  int closed;
  /* the leader's */
  size_t running;
  uint64_t asked, ok, failed, refused;
};

static void job_free(job *j) {
  free(j->endpoint);
  free(j->body);
  free(j);
}

/* vLLM's /tokenize body: {"model", "prompt"} for a completion's prefix; for
 * a chat's, {"model", "messages", "add_generation_prompt": false}, the
 * messages as the runtime gave them (a JSON array it wrote itself), so the
 * engine renders them with its own template. */
static char *body_of(const lupin_tokenize_job *tj, size_t *len) {
  lh_buf b = {0};
  lh_buf_str(&b, "{\"model\":");
  lh_buf_json(&b, tj->model ? tj->model : "");
  char *text = malloc(tj->text_len + 1); /* lh_buf_json wants a C string */
  if (text) {
    memcpy(text, tj->text, tj->text_len);
    text[tj->text_len] = 0;
    if (tj->chat) {
      lh_buf_str(&b, ",\"messages\":");
      lh_buf_append(&b, text, tj->text_len);
      lh_buf_str(&b, ",\"add_generation_prompt\":false}");
    } else {
      lh_buf_str(&b, ",\"prompt\":");
      lh_buf_json(&b, text);
      lh_buf_str(&b, ",\"add_special_tokens\":true}");
    }
    free(text);
  }
  if (!text || !b.data) {
    lh_buf_free(&b);
    return NULL;
  }
  *len = b.len;
  return b.data;
}

/* The runtime's hook, on any worker's thread.  A job not taken is said
 * failed at once: the runtime may ask again. */
static void on_job(void *ud, const lupin_tokenize_job *tj) {
  gw_tokenize *t = ud;
  job *j = calloc(1, sizeof *j);
  if (!j || !(j->endpoint = strdup(tj->endpoint ? tj->endpoint : "")) ||
      !(j->body = body_of(tj, &j->body_len))) {
    if (j) job_free(j);
    lupin_shared_tokens_failed(t->gw->shared, tj->key);
    return;
  }
  j->key = tj->key;
  pthread_mutex_lock(&t->lock);
  int taken = !t->closed && t->queued < MAX_QUEUED;
  if (taken) {
    if (t->tail) {
      t->tail->next = j;
    } else {
      t->head = j;
    }
    t->tail = j;
    t->queued++;
    uv_async_send(&t->wake);
  } else {
    t->refused++;
  }
  pthread_mutex_unlock(&t->lock);
  if (!taken) {
    lupin_shared_tokens_failed(t->gw->shared, j->key);
    job_free(j);
  }
}

/* --- the leader's calls --------------------------------------------------- */

static void on_headers(void *ud, int status, const lh_headers *h, int64_t content_length) {
  (void)h;
  (void)content_length;
  ((call *)ud)->status = status;
}

static void on_body(void *ud, const char *data, size_t len) {
  call *c = ud;
  if (c->answer.len + len <= MAX_BODY) lh_buf_append(&c->answer, data, len);
}

/* The answer's "tokens", less the last block's worth: a tokenizer may
 * merge the prefix's last characters with what follows them in a longer
 * prompt, so the last ids are not trusted to be the longer prompt's. */
static int put_tokens(gw_tokenize *t, call *c) {
  json_t *root = json_loadb(c->answer.data ? c->answer.data : "", c->answer.len, 0, NULL);
  json_t *ids = json_object_get(root, "tokens");
  size_t n = json_array_size(ids);
  uint32_t *v = n ? malloc(n * sizeof *v) : NULL;
  int ok = v != NULL;
  for (size_t i = 0; ok && i < n; i++) {
    json_t *x = json_array_get(ids, i);
    json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
    ok = id >= 0 && id <= UINT32_MAX;
    if (ok) v[i] = (uint32_t)id;
  }
  lupin_kv_events set;
  size_t drop = lupin_runtime_kv_events(t->gw->rt, &set) == 1 ? (size_t)set.block_size : 16;
  if (ok) ok = lupin_shared_tokens_put(t->gw->shared, c->j->key, v, n > drop ? n - drop : 0) == 0;
  free(v);
  json_decref(root);
  return ok ? 0 : -1;
}

static void pump(gw_tokenize *t);

static void on_done(void *ud, gw_upstream_error e, const char *detail) {
  call *c = ud;
  gw_tokenize *t = c->t;
  int ok = e == GW_UP_OK && c->status == 200 && put_tokens(t, c) == 0;
  if (ok) {
    t->ok++;
  } else {
    t->failed++;
    lupin_shared_tokens_failed(t->gw->shared, c->j->key);
    gw_log(t->gw, LUPIN_LOG_DEBUG, "tokenize on %s: %s", c->j->endpoint,
           e                  ? detail
           : c->status != 200 ? "the endpoint did not answer 200"
                              : "no token ids");
  }
  t->running--;
  job_free(c->j);
  lh_buf_free(&c->answer);
  free(c);
  pump(t);
}

static const gw_upstream_cb tokenize_cb = {on_headers, on_body, on_done, NULL};

static void start(gw_tokenize *t, job *j) {
  gw_endpoint *ep = gw_endpoint_find(t->gw, j->endpoint);
  call *c = ep && !ep->removed ? calloc(1, sizeof *c) : NULL;
  if (!c) {
    t->failed++;
    lupin_shared_tokens_failed(t->gw->shared, j->key);
    job_free(j);
    return;
  }
  *c = (call){.t = t, .j = j};
  lupin_header h = {"content-type", "application/json"};
  gw_timeouts to = {TIMEOUT_MS, TIMEOUT_MS, TIMEOUT_MS};
  t->running++;
  t->asked++;
  c->up =
      gw_upstream_start(ep, "POST", "/tokenize", &h, 1, j->body, j->body_len, to, &tokenize_cb, c);
  if (!c->up) on_done(c, GW_UP_BROKEN, "could not start");
}

static void pump(gw_tokenize *t) {
  while (t->running < MAX_RUNNING) {
    pthread_mutex_lock(&t->lock);
    job *j = t->head;
    if (j) {
      t->head = j->next;
      if (!t->head) t->tail = NULL;
      t->queued--;
    }
    pthread_mutex_unlock(&t->lock);
    if (!j) return;
    start(t, j);
  }
}

static void on_wake(uv_async_t *a) { pump(a->data); }

int gw_tokenize_start(lupin_gateway *gw, char *err, size_t errlen) {
  gw_tokenize *t = calloc(1, sizeof *t);
  if (!t) {
    lh_errf(err, errlen, "out of memory");
    return -1;
  }
  t->gw = gw;
  pthread_mutex_init(&t->lock, NULL);
  if (uv_async_init(gw->loop, &t->wake, on_wake)) {
    pthread_mutex_destroy(&t->lock);
    free(t);
    lh_errf(err, errlen, "cannot start the tokenize queue");
    return -1;
  }
  t->wake.data = t;
  gw->tokenize = t;
  lupin_shared_on_tokenize(gw->shared, on_job, t);
  return 0;
}

static void on_closed(uv_handle_t *h) {
  gw_tokenize *t = h->data;
  pthread_mutex_lock(&t->lock);
  while (t->head) {
    job *j = t->head;
    t->head = j->next;
    job_free(j);
  }
  pthread_mutex_unlock(&t->lock);
}

void gw_tokenize_stop(lupin_gateway *gw) {
  gw_tokenize *t = gw->tokenize;
  if (!t || t->closed) return;
  pthread_mutex_lock(&t->lock);
  t->closed = 1; /* workers still scheduling: their jobs are refused */
  pthread_mutex_unlock(&t->lock);
  uv_close((uv_handle_t *)&t->wake, on_closed);
}

void gw_tokenize_free(lupin_gateway *gw) {
  gw_tokenize *t = gw->tokenize;
  if (!t) return;
  lupin_shared_on_tokenize(gw->shared, NULL, NULL);
  pthread_mutex_destroy(&t->lock);
  free(t);
  gw->tokenize = NULL;
}

void gw_tokenize_metrics(lupin_gateway *gw, lh_expo *e) {
  gw_tokenize *t = gw->tokenize;
  if (!t || gw->worker != 0 || !t->asked) return;
  lh_expo_family(e, LH_M_TOKENIZE);
  const char *ok[] = {"ok"}, *failed[] = {"failed"}, *refused[] = {"refused"};
  lh_expo_sample(e, ok, (double)t->ok);
  lh_expo_sample(e, failed, (double)t->failed);
  pthread_mutex_lock(&t->lock);
  lh_expo_sample(e, refused, (double)t->refused);
  pthread_mutex_unlock(&t->lock);
  lupin_token_cache_stats st;
  lupin_shared_tokens_stats(gw->shared, &st);
  lh_expo_family(e, LH_M_TOKEN_CACHE_ENTRIES);
  lh_expo_sample(e, NULL, (double)st.entries);
  lh_expo_family(e, LH_M_TOKEN_CACHE_BYTES);
  lh_expo_sample(e, NULL, (double)st.bytes);
  lh_expo_family(e, LH_M_TOKEN_CACHE_LOOKUPS);
  const char *hit[] = {"hit"}, *miss[] = {"miss"};
  lh_expo_sample(e, hit, (double)st.hits);
  lh_expo_sample(e, miss, (double)st.misses);
}
