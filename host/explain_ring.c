/* Explain records kept for the admin API (docs/explain.md): a ring of a
 * fixed number of records, the newest replacing the oldest, so memory stays
 * bounded whoever asks.  One ring may serve every thread of a host: each
 * keeps its records under the ring's lock, the admin API reads them.
 *
 * A record is the runtime's (lupin_request_explain, LUPIN_EXPLAIN_JSON) with
 * the host's part added: the answer and every attempt (lh_explain_record). */
#include "lupin_host.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct lh_explain_ring {
  pthread_mutex_t lock;
  size_t kept; /* slots */
  size_t next; /* the slot the next record takes */
  struct {
    char *id, *json;
  } slot[];
};

lh_explain_ring *lh_explain_ring_new(size_t kept) {
  if (!kept) return NULL;
  lh_explain_ring *r = calloc(1, sizeof *r + kept * sizeof r->slot[0]);
  if (!r) return NULL;
  if (pthread_mutex_init(&r->lock, NULL)) {
    free(r);
    return NULL;
  }
  r->kept = kept;
  return r;
}

void lh_explain_ring_free(lh_explain_ring *r) {
  if (!r) return;
  for (size_t i = 0; i < r->kept; i++) {
    free(r->slot[i].id);
    free(r->slot[i].json);
  }
  pthread_mutex_destroy(&r->lock);
  free(r);
}

size_t lh_explain_ring_kept(const lh_explain_ring *r) { return r ? r->kept : 0; }

void lh_explain_keep(lh_explain_ring *r, const char *id, char *json) {
  char *copy = r && id ? strdup(id) : NULL;
  if (!copy) {
    free(json);
    return;
  }
  pthread_mutex_lock(&r->lock);
  size_t i = r->next;
  free(r->slot[i].id);
  free(r->slot[i].json);
  r->slot[i].id = copy;
  r->slot[i].json = json;
  r->next = (i + 1) % r->kept;
  pthread_mutex_unlock(&r->lock);
}

/* The slot k records back from the newest (k = 1: the newest). */
static size_t back(const lh_explain_ring *r, size_t k) { return (r->next + r->kept - k) % r->kept; }

char *lh_explain_find(lh_explain_ring *r, const char *id) {
  char *found = NULL;
  if (!r || !id) return NULL;
  pthread_mutex_lock(&r->lock);
  for (size_t k = 1; k <= r->kept && !found; k++) {
    size_t i = back(r, k);
    if (r->slot[i].id && !strcmp(r->slot[i].id, id)) found = strdup(r->slot[i].json);
  }
  pthread_mutex_unlock(&r->lock);
  return found;
}

void lh_explain_ids(lh_buf *b, lh_explain_ring *r) {
  lh_buf_printf(b, "{\"kept\":%zu,\"ids\":[", lh_explain_ring_kept(r));
  int n = 0;
  if (r) pthread_mutex_lock(&r->lock);
  for (size_t k = 1; r && k <= r->kept; k++) {
    size_t i = back(r, k);
    if (!r->slot[i].id) continue;
    lh_buf_printf(b, "%s", n++ ? "," : "");
    lh_buf_json(b, r->slot[i].id);
  }
  if (r) pthread_mutex_unlock(&r->lock);
  lh_buf_printf(b, "]}\n");
}

int lh_explain_record(lh_buf *b, lupin_request *req, int status, const char *outcome,
                      double total_ms, const char *attempts, size_t attempts_len) {
  size_t len;
  const char *json = lupin_request_explain(req, LUPIN_EXPLAIN_JSON, &len);
  if (!json || len < 2) return -1;
  lh_buf_append(b, json, len - 1); /* without its closing brace */
  lh_buf_printf(b,
                ",\"gateway\":{\"status\":%d,\"outcome\":\"%s\",\"total_ms\":%.3f,"
                "\"attempts\":[%.*s]}}\n",
                status, outcome, total_ms, (int)attempts_len, attempts ? attempts : "");
  return 0;
}
