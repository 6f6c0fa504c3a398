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
