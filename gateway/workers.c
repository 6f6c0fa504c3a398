/* Workers: `lupin serve --workers N` runs N event loops, one thread each.
 *
 * Each worker is a whole lupin_gateway: its loop, its runtime (all made with
 * one lupin_shared, so endpoint ids, in-flight counts, prefix indexes and
 * plugins' shared dicts are the process's), its upstream pools and its own
 * handle on the one listening socket: whichever loop is free accepts.  The
 * leader (worker 0, the main thread) also has what the process has once: the
 * admin listener, signals, file watches and the scrapes; it hands every
 * scrape's result to the others.
 *
 * Workers talk through inboxes: a list of tasks under the workers' lock and
 * a uv_async_t that wakes the loop.  Only the leader ever waits on another
 * worker (gw_workers_each), never the other way round, so waiting cannot
 * deadlock. */
#include "gateway.h"

#include <stdlib.h>
#include <string.h>

typedef struct gw_task {
  gw_task_fn fn;
  void *arg;
  struct gw_shared_arg *shared; /* posted to several workers: freed by the last */
  int *done;                    /* a waiting caller's flag, set under the lock */
  struct gw_task *next;
} gw_task;

/* An argument several followers use: the last one to finish frees it. */
typedef struct gw_shared_arg {
  void *arg;
  void (*drop)(void *);
  size_t refs;
} gw_shared_arg;

struct gw_inbox {
  uv_async_t async;
  gw_task *head, *tail;
  int open;
};

struct gw_workers {
  size_t n;
  lupin_gateway *w; /* the followers, w[1..n-1] (w[0] unused) */
  lupin_gateway *leader;
  uv_thread_t *threads;
  uv_mutex_t lock; /* inboxes, starts, waits */
  uv_cond_t cond;
  size_t started;
  int failed; /* 0, or the first failure's gw_open code (-1 config, -2 start) */
  int go;     /* 1: every worker started, serve; -1: one failed, do not */
  char err[2048];
};

/* --- inboxes ------------------------------------------------------------- */

/* Under the lock: a waiter reads its flag there. */
static void task_release(gw_workers *ws, gw_task *t) {
  if (t->done) {
    *t->done = 1;
    uv_cond_broadcast(&ws->cond);
  }
  gw_shared_arg *s = t->shared;
  int last = s && --s->refs == 0;
  free(t);
  if (last) {
    if (s->drop) s->drop(s->arg);
    free(s);
  }
}

static void on_inbox(uv_async_t *a) {
  lupin_gateway *gw = a->data;
  gw_workers *ws = gw->workers;
  uv_mutex_lock(&ws->lock);
  gw_task *t = gw->inbox->head;
  gw->inbox->head = gw->inbox->tail = NULL;
  uv_mutex_unlock(&ws->lock);
  while (t) {
    gw_task *next = t->next;
    t->fn(gw, t->arg);
    uv_mutex_lock(&ws->lock);
    task_release(ws, t);
    uv_mutex_unlock(&ws->lock);
    t = next;
  }
}

int gw_inbox_open(lupin_gateway *gw, char *err, size_t errlen) {
  gw->inbox = calloc(1, sizeof *gw->inbox);
  if (!gw->inbox) {
    lh_errf(err, errlen, "out of memory");
    return -1;
  }
  gw->inbox->async.data = gw;
  uv_async_init(gw->loop, &gw->inbox->async, on_inbox);
  uv_mutex_lock(&gw->workers->lock);
  gw->inbox->open = 1;
  uv_mutex_unlock(&gw->workers->lock);
  return 0;
}

static void inbox_closed(uv_handle_t *h) { free(h->data); }

/* Tasks still queued are dropped: their waiters are let go. */
void gw_inbox_close(lupin_gateway *gw) {
  gw_inbox *in = gw->inbox;
  if (!in || !in->open) return;
  gw_workers *ws = gw->workers;
  uv_mutex_lock(&ws->lock);
  in->open = 0;
  for (gw_task *t = in->head, *next; t; t = next) {
    next = t->next;
    task_release(ws, t);
  }
  in->head = in->tail = NULL;
  gw->inbox = NULL; /* under the lock: post() reads it there */
  uv_mutex_unlock(&ws->lock);
  in->async.data = in;
  uv_close((uv_handle_t *)&in->async, inbox_closed);
}

/* Queues t on gw's inbox; 0 when it was closed (t is released). */
static int post(lupin_gateway *gw, gw_task *t) {
  gw_workers *ws = gw->workers;
  uv_mutex_lock(&ws->lock);
  gw_inbox *in = gw->inbox;
  int open = in && in->open;
  if (open) {
    if (in->tail)
      in->tail->next = t;
    else
      in->head = t;
    in->tail = t;
    uv_async_send(&in->async);
  } else {
    task_release(ws, t);
  }
  uv_mutex_unlock(&ws->lock);
  return open;
}

/* --- the leader's calls -------------------------------------------------- */

size_t gw_workers_count(const lupin_gateway *gw) { return gw->workers ? gw->workers->n : 1; }

void gw_workers_each(lupin_gateway *leader, gw_task_fn fn, void *arg) {
  fn(leader, arg);
  gw_workers *ws = leader->workers;
  for (size_t i = 1; ws && i < ws->n; i++) {
    int done = 0;
    gw_task *t = calloc(1, sizeof *t);
    if (!t) continue;
    *t = (gw_task){.fn = fn, .arg = arg, .done = &done};
    post(&ws->w[i], t);
    uv_mutex_lock(&ws->lock);
    while (!done)
      uv_cond_wait(&ws->cond, &ws->lock);
    uv_mutex_unlock(&ws->lock);
  }
}

void gw_workers_post(lupin_gateway *from, gw_task_fn fn, void *arg, void (*drop)(void *)) {
  gw_workers *ws = from->workers;
  size_t n = ws ? ws->n - 1 : 0, made = 0;
  gw_shared_arg *s = n ? malloc(sizeof *s) : NULL;
  gw_task **t = s ? calloc(n, sizeof *t) : NULL;
  while (t && made < n && (t[made] = malloc(sizeof **t)))
    made++;
  if (made < n || !n) { /* out of memory, or no other worker: nobody runs it */
    for (size_t i = 0; t && i < made; i++)
      free(t[i]);
    free(t);
    free(s);
    if (drop) drop(arg);
    return;
  }
  *s = (gw_shared_arg){arg, drop, n};
  for (size_t i = 0, k = 0; i < ws->n; i++) {
    lupin_gateway *to = i == 0 ? ws->leader : &ws->w[i];
    if (to == from) continue;
    *t[k] = (gw_task){.fn = fn, .arg = arg, .shared = s};
    post(to, t[k++]);
  }
  free(t);
}

/* --- scrapes ------------------------------------------------------------- */

typedef struct scraped {
  char *name;
  lupin_metrics m;
  char *running, *waiting;
  int ok;
  char detail[160];
} scraped;

static void scraped_free(void *p) {
  scraped *s = p;
  free(s->name);
  free(s->running);
  free(s->waiting);
  free(s);
}

static void scraped_apply(lupin_gateway *gw, void *arg) {
  const scraped *s = arg;
  gw_endpoint *ep = gw_endpoint_find(gw, s->name);
  if (!ep) return;
  if (!s->ok) {
    ep->scrape_errors++;
    gw_health_scrape(ep, 0, s->detail);
    return;
  }
  free(ep->running_lora);
  free(ep->waiting_lora);
  ep->running_lora = s->running ? strdup(s->running) : NULL;
  ep->waiting_lora = s->waiting ? strdup(s->waiting) : NULL;
  ep->metrics = s->m;
  ep->metrics.running_lora_adapters = ep->running_lora;
  ep->metrics.waiting_lora_adapters = ep->waiting_lora;
  ep->scraped_at = s->m.scraped_at;
  ep->scrapes++;
  lupin_endpoint_set_metrics(gw->rt, ep->name, &ep->metrics);
  gw_health_scrape(ep, 1, NULL);
}

void gw_workers_scraped(gw_endpoint *ep, int ok, const char *detail) {
  lupin_gateway *gw = ep->gw;
  if (gw_workers_count(gw) < 2 || ep->removed) return;
  scraped *s = calloc(1, sizeof *s);
  if (!s || !(s->name = strdup(ep->name))) {
    free(s);
    return;
  }
  s->ok = ok;
  s->m = ep->metrics;
  s->running = ep->running_lora ? strdup(ep->running_lora) : NULL;
  s->waiting = ep->waiting_lora ? strdup(ep->waiting_lora) : NULL;
  s->m.running_lora_adapters = s->m.waiting_lora_adapters = NULL;
  snprintf(s->detail, sizeof s->detail, "%s", detail ? detail : "");
  gw_workers_post(gw, scraped_apply, s, scraped_free);
}

/* --- start and join ------------------------------------------------------ */

void gw_workers_wanted(lupin_gateway *gw, size_t *n) {
  const char *cli = gw->opts.workers; /* checked by main.c: auto or 1..256 */
  size_t want = cli ? (strcmp(cli, "auto") ? (size_t)atoi(cli) : 0) : (size_t)gw->set.workers;
  *n = want ? want : (size_t)uv_available_parallelism();
}

/* A follower opens, then waits for the leader's word: it serves only once
 * every worker started, so a start that fails serves nothing at all. */
static void follower_main(void *p) {
  lupin_gateway *gw = p;
  gw_workers *ws = gw->workers;
  char err[1900];
  int rc = gw_open_follower(gw, ws->leader, err, sizeof err);
  uv_mutex_lock(&ws->lock);
  if (rc && !ws->failed) {
    ws->failed = rc;
    snprintf(ws->err, sizeof ws->err, "worker %d: %s", gw->worker, err);
  }
  ws->started++;
  uv_cond_broadcast(&ws->cond);
  while (!ws->go)
    uv_cond_wait(&ws->cond, &ws->lock);
  gw->serving = !rc && ws->go > 0;
  uv_mutex_unlock(&ws->lock);
  if (rc) gw->exit_code = rc == -1 ? GW_EXIT_CONFIG : GW_EXIT_START;
  gw_run(gw);
}

/* 0 when all n workers opened and serve; else the first failure's code
 * (-1 config, -2 start: a thread, a listener, memory) in err, and none
 * serves. */
int gw_workers_start(lupin_gateway *leader, size_t n, char *err, size_t errlen) {
  gw_workers *ws = calloc(1, sizeof *ws);
  if (!ws || !(ws->w = calloc(n, sizeof *ws->w)) ||
      !(ws->threads = calloc(n, sizeof *ws->threads))) {
    if (ws) free(ws->w);
    free(ws);
    lh_errf(err, errlen, "cannot start %zu workers: out of memory", n);
    return -2;
  }
  ws->n = n;
  ws->leader = leader;
  uv_mutex_init(&ws->lock);
  uv_cond_init(&ws->cond);
  leader->workers = ws;
  if (gw_inbox_open(leader, err, errlen)) {
    ws->n = 1; /* no thread to join */
    return -2;
  }
  size_t spawned = 1;
  for (size_t i = 1; i < n; i++, spawned++) {
    lupin_gateway *gw = &ws->w[i];
    gw->worker = (int)i;
    gw->workers = ws;
    if (uv_thread_create(&ws->threads[i], follower_main, gw)) {
      uv_mutex_lock(&ws->lock);
      if (!ws->failed) {
        ws->failed = -2;
        snprintf(ws->err, sizeof ws->err, "cannot start the thread of worker %zu", i);
      }
      uv_mutex_unlock(&ws->lock);
      break;
    }
  }
  uv_mutex_lock(&ws->lock);
  while (ws->started < spawned - 1)
    uv_cond_wait(&ws->cond, &ws->lock);
  int failed = ws->failed;
  if (failed) lh_errf(err, errlen, "%s", ws->err);
  ws->go = failed ? -1 : 1;
  uv_cond_broadcast(&ws->cond);
  uv_mutex_unlock(&ws->lock);
  ws->n = spawned; /* threads that never started are not joined */
  return failed;
}

int gw_workers_join(lupin_gateway *leader) {
  gw_workers *ws = leader->workers;
  if (!ws) return GW_EXIT_OK;
  int worst = GW_EXIT_OK;
  for (size_t i = 1; i < ws->n; i++) {
    uv_thread_join(&ws->threads[i]);
    if (ws->w[i].exit_code > worst) worst = ws->w[i].exit_code;
  }
  uv_cond_destroy(&ws->cond);
  uv_mutex_destroy(&ws->lock);
  free(ws->threads);
  free(ws->w);
  free(ws);
  leader->workers = NULL;
  return worst;
}
