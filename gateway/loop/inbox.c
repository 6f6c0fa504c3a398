/* The workers' inboxes: a list of tasks under the workers' lock and a
 * uv_async_t that wakes the loop (docs/workers.md).  Only the leader ever
 * waits on another worker (gw_workers_each), never the other way round, so
 * waiting cannot deadlock.  workers.c starts and joins the workers. */
#include "loop/loop.h"

#include <stdlib.h>
#include <string.h>

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
