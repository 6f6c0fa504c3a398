/* A reload inside the workers, through lupin's generations: requests in
 * flight finish on the generation they began on, new ones begin on the new
 * one, and a config that fails leaves the current one serving
 * (lupin_runtime_reload).  It is the other way to `nginx -s reload`, which
 * starts new workers with new runtimes while the old ones drain.
 *
 * Each worker has its own runtime, and an admin request reaches one worker:
 * the one that reloads adds one to a sequence number in a small shared
 * zone, and every worker looks at it on a timer and reloads when it is
 * behind.  The same timer stats lupin_config's file under
 * `lupin_config_watch on`: each worker sees the change for itself, so a
 * watched reload needs no sequence number.  The timer is cancelable, so a
 * graceful shutdown does not wait for it. */
#include "ngx_http_lupin.h"

/* how often a worker looks (ms): a reload reaches every worker within it */
#define NGX_HTTP_LUPIN_TICK 200

static ngx_str_t ngx_http_lupin_zone_name = ngx_string("ngx_http_lupin_reload");

static ngx_int_t ngx_http_lupin_zone_init(ngx_shm_zone_t *zone, void *data) {
  if (data) { /* nginx -s reload: the old cycle's number goes on */
    zone->data = data;
    return NGX_OK;
  }
  ngx_slab_pool_t *sp = (ngx_slab_pool_t *)zone->shm.addr;
  if (zone->shm.exists) {
    zone->data = sp->data;
    return NGX_OK;
  }
  ngx_atomic_t *seq = ngx_slab_calloc(sp, sizeof(*seq));
  if (seq == NULL) return NGX_ERROR;
  sp->data = (void *)seq;
  zone->data = (void *)seq;
  return NGX_OK;
}

ngx_int_t ngx_http_lupin_reload_zone(ngx_conf_t *cf, ngx_http_lupin_main_conf_t *mcf) {
  /* the slab allocator's least: one atomic needs no more */
  mcf->shm = ngx_shared_memory_add(cf, &ngx_http_lupin_zone_name, 8 * ngx_pagesize,
                                   &ngx_http_lupin_module);
  if (mcf->shm == NULL) return NGX_ERROR;
  mcf->shm->init = ngx_http_lupin_zone_init;
  return NGX_OK;
}

/* The file as it is now; 0 when it could not be looked at. */
static int ngx_http_lupin_stamp(ngx_http_lupin_main_conf_t *mcf, ngx_http_lupin_admin_t *now) {
  ngx_file_info_t fi;
  if (ngx_file_info(mcf->config.data, &fi) == NGX_FILE_ERROR) return 0;
  now->ino = ngx_file_uniq(&fi);
  now->mtime = fi.st_mtim; /* nanoseconds: two saves in one second differ */
  now->size = ngx_file_size(&fi);
  return 1;
}

static int ngx_http_lupin_same_stamp(const ngx_http_lupin_admin_t *a,
                                     const ngx_http_lupin_admin_t *b) {
  return a->ino == b->ino && a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
         a->mtime.tv_nsec == b->mtime.tv_nsec;
}

ngx_int_t ngx_http_lupin_reload(ngx_log_t *log, const char *why, int shared, char *err,
                                size_t errlen) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  ngx_http_lupin_admin_t *a = &w->admin, now;
  ngx_http_lupin_main_conf_t *mcf =
      ngx_http_cycle_get_module_main_conf(ngx_cycle, ngx_http_lupin_module);
  if (w->rt == NULL) {
    lh_errf(err, errlen, "no lupin_config");
    return NGX_ERROR;
  }
  /* the file as read: a save after this point is another change */
  if (ngx_http_lupin_stamp(mcf, &now)) {
    a->ino = now.ino;
    a->mtime = now.mtime;
    a->size = now.size;
  }
  a->changed = 0;
  double t0 = lupin_now();
  int failed = lupin_runtime_reload(w->rt, err, errlen) != 0;
  /* the generation is in: its endpoints are the ones to serve */
  if (!failed && ngx_http_lupin_endpoints_sync(log, err, errlen) != NGX_OK) failed = 1;
  a->last_seconds = lupin_now() - t0;
  a->reloads[failed]++;
  lupin_stats st;
  lupin_runtime_stats(w->rt, &st);
  if (failed) {
    ngx_log_error(NGX_LOG_ERR, log, 0,
                  "lupin: reload (%s) failed after %.1f ms in worker %ui, generation %uL "
                  "keeps serving: %s",
                  why, a->last_seconds * 1e3, ngx_worker, st.generation, err);
    return NGX_ERROR;
  }
  ngx_log_error(NGX_LOG_NOTICE, log, 0,
                "lupin: reload (%s): generation %uL serving in worker %ui, built in %.1f ms", why,
                st.generation, ngx_worker, a->last_seconds * 1e3);
  /* a reload another worker asked for at the same moment is not followed:
   * both read the same file */
  if (shared && a->seq) a->seen = ngx_atomic_fetch_add(a->seq, 1) + 1;
  return NGX_OK;
}

/* The file changed and stayed so for a tick (an editor's save is whole by
 * then): reload.  A file being replaced may be missing for a moment. */
static void ngx_http_lupin_watch(ngx_http_lupin_main_conf_t *mcf, ngx_log_t *log) {
  ngx_http_lupin_admin_t *a = &ngx_http_lupin_worker.admin, now;
  if (!ngx_http_lupin_stamp(mcf, &now) || ngx_http_lupin_same_stamp(a, &now)) {
    a->changed = 0;
    return;
  }
  if (a->changed++ == 0) return;
  char err[2048];
  ngx_http_lupin_reload(log, "file change", 0, err, sizeof err);
}

static void ngx_http_lupin_tick(ngx_event_t *ev) {
  ngx_http_lupin_main_conf_t *mcf = ev->data;
  ngx_http_lupin_admin_t *a = &ngx_http_lupin_worker.admin;
  if (ngx_exiting || ngx_http_lupin_worker.rt == NULL) return;
  ngx_atomic_uint_t seq = a->seq ? *a->seq : 0;
  if (seq != a->seen) {
    char err[2048];
    a->seen = seq; /* followed once, whatever it gives */
    ngx_http_lupin_reload(ev->log, "another worker asked", 0, err, sizeof err);
  }
  if (mcf->watch) ngx_http_lupin_watch(mcf, ev->log);
  ngx_add_timer(ev, NGX_HTTP_LUPIN_TICK);
}

ngx_int_t ngx_http_lupin_reload_start(ngx_cycle_t *cycle) {
  ngx_http_lupin_main_conf_t *mcf =
      ngx_http_cycle_get_module_main_conf(cycle, ngx_http_lupin_module);
  ngx_http_lupin_admin_t *a = &ngx_http_lupin_worker.admin;
  a->ring = lh_explain_ring_new(NGX_HTTP_LUPIN_EXPLAIN_KEPT);
  if (a->ring == NULL) return NGX_ERROR;
  if (mcf->shm && mcf->shm->data) {
    a->seq = mcf->shm->data;
    a->seen = *a->seq; /* a new worker starts from the file as it is */
  }
  ngx_http_lupin_stamp(mcf, a);
  /* nothing can ask for a reload without an admin location or the watch */
  if (mcf->admin.len == 0 && !mcf->watch) return NGX_OK;
  a->timer.handler = ngx_http_lupin_tick;
  a->timer.data = mcf;
  a->timer.log = cycle->log;
  a->timer.cancelable = 1;
  ngx_add_timer(&a->timer, NGX_HTTP_LUPIN_TICK);
  return NGX_OK;
}

void ngx_http_lupin_reload_stop(void) {
  ngx_http_lupin_admin_t *a = &ngx_http_lupin_worker.admin;
  if (a->timer.timer_set) ngx_del_timer(&a->timer);
  lh_explain_ring_free(a->ring);
  a->ring = NULL;
}
