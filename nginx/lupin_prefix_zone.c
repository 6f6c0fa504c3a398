/* The workers' prefix records, shared through an nginx shared-memory zone.
 *
 * Each worker process has its own runtime, so its own prefix indexes: a
 * conversation whose turns land on different workers would find its prefix
 * cached nowhere.  lupin.h already has what replicas of a host use to share
 * what their indexes learn (docs/replicas.md): a hook that hears every record
 * (lupin_shared_on_prefix_record) and a call that applies another's
 * (lupin_shared_prefix_apply).  Here the records travel through a ring of
 * fixed slots in shared memory instead of a Redis stream: a worker writes
 * each record it makes (a long one over several slots), and every other
 * worker applies what it has not seen yet before it schedules a request and
 * on the health tick.  A worker that falls a whole ring behind skips what
 * was overwritten (counted as dropped).  New workers after `nginx -s
 * reload` replay the ring: their indexes start warm.
 *
 * With one worker process nothing is written or read. */
#include "ngx_http_lupin.h"

#define NGX_HTTP_LUPIN_SLOT_HASHES 480

typedef struct {
  uint64_t seq; /* the record's number, 0: never written */
  ngx_pid_t pid;
  uint32_t n;
  char key[64];
  char endpoint[120];
  uint64_t hashes[NGX_HTTP_LUPIN_SLOT_HASHES];
} ngx_http_lupin_slot_t;

typedef struct {
  uint64_t head; /* the last slot written, under the pool's mutex */
  ngx_uint_t n_slots;
  ngx_http_lupin_slot_t slots[1];
} ngx_http_lupin_ring_t;

static ngx_int_t ngx_http_lupin_zone_init(ngx_shm_zone_t *zone, void *data) {
  ngx_slab_pool_t *shpool = (ngx_slab_pool_t *)zone->shm.addr;
  if (data) { /* nginx -s reload, same size: the records stay */
    zone->data = data;
    return NGX_OK;
  }
  size_t room = shpool->pfree * ngx_pagesize; /* what the slab pool's bookkeeping leaves */
  ngx_uint_t n = room > sizeof(ngx_http_lupin_ring_t)
                     ? (room - sizeof(ngx_http_lupin_ring_t)) / sizeof(ngx_http_lupin_slot_t)
                     : 0;
  if (n < 16) {
    ngx_log_error(NGX_LOG_EMERG, zone->shm.log, 0, "lupin_prefix_zone: %uz bytes hold no ring",
                  zone->shm.size);
    return NGX_ERROR;
  }
  ngx_http_lupin_ring_t *ring = ngx_slab_alloc(shpool, sizeof(ngx_http_lupin_ring_t) +
                                                           (n - 1) * sizeof(ngx_http_lupin_slot_t));
  if (ring == NULL) return NGX_ERROR;
  ring->head = 0;
  ring->n_slots = n;
  for (ngx_uint_t i = 0; i < n; i++)
    ring->slots[i].seq = 0;
  shpool->data = ring;
  zone->data = ring;
  return NGX_OK;
}

ngx_int_t ngx_http_lupin_prefix_zone_add(ngx_conf_t *cf, size_t size) {
  static ngx_str_t name = ngx_string("lupin_prefix");
  ngx_shm_zone_t *zone = ngx_shared_memory_add(cf, &name, size, &ngx_http_lupin_module);
  if (zone == NULL) return NGX_ERROR;
  zone->init = ngx_http_lupin_zone_init;
  ngx_http_lupin_main_conf_t *mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_lupin_module);
  mcf->prefix_zone = zone;
  return NGX_OK;
}

/* The hook: a record of this worker's, into the ring. */
static void ngx_http_lupin_published(void *ud, const char *key, const char *endpoint,
                                     const uint64_t *hashes, size_t n) {
  ngx_shm_zone_t *zone = ud;
  ngx_slab_pool_t *shpool = (ngx_slab_pool_t *)zone->shm.addr;
  ngx_http_lupin_ring_t *ring = zone->data;
  size_t klen = ngx_strlen(key), elen = ngx_strlen(endpoint);
  if (klen >= sizeof ring->slots[0].key || elen >= sizeof ring->slots[0].endpoint) {
    ngx_http_lupin_worker.prefix_too_long++;
    return;
  }
  ngx_shmtx_lock(&shpool->mutex);
  for (size_t at = 0; at < n; at += NGX_HTTP_LUPIN_SLOT_HASHES) {
    ngx_http_lupin_slot_t *s = &ring->slots[++ring->head % ring->n_slots];
    s->seq = ring->head;
    s->pid = ngx_pid;
    s->n = (uint32_t)ngx_min(n - at, NGX_HTTP_LUPIN_SLOT_HASHES);
    ngx_memcpy(s->key, key, klen + 1);
    ngx_memcpy(s->endpoint, endpoint, elen + 1);
    ngx_memcpy(s->hashes, hashes + at, s->n * sizeof(uint64_t));
    ngx_http_lupin_worker.prefix_published++;
  }
  ngx_shmtx_unlock(&shpool->mutex);
}

void ngx_http_lupin_prefix_zone_open(ngx_cycle_t *cycle, lupin_shared *shared) {
  ngx_http_lupin_main_conf_t *mcf =
      ngx_http_cycle_get_module_main_conf(cycle, ngx_http_lupin_module);
  ngx_core_conf_t *ccf = (ngx_core_conf_t *)ngx_get_conf(cycle->conf_ctx, ngx_core_module);
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  if (mcf->prefix_zone == NULL || ccf->worker_processes < 2) return;
  ngx_http_lupin_ring_t *ring = mcf->prefix_zone->data;
  w->prefix_zone = mcf->prefix_zone;
  /* what the ring still holds is replayed: a new worker starts warm */
  uint64_t head = *(volatile uint64_t *)&ring->head;
  w->prefix_cursor = head > ring->n_slots ? head - ring->n_slots : 0;
  lupin_shared_on_prefix_record(shared, ngx_http_lupin_published, mcf->prefix_zone);
}

void ngx_http_lupin_prefix_zone_drain(lupin_shared *shared) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  if (w->prefix_zone == NULL) return;
  ngx_slab_pool_t *shpool = (ngx_slab_pool_t *)w->prefix_zone->shm.addr;
  ngx_http_lupin_ring_t *ring = w->prefix_zone->data;
  if (*(volatile uint64_t *)&ring->head == w->prefix_cursor) return; /* the common case */
  ngx_http_lupin_slot_t s;
  for (;;) {
    ngx_shmtx_lock(&shpool->mutex);
    uint64_t head = ring->head;
    if (w->prefix_cursor == head) {
      ngx_shmtx_unlock(&shpool->mutex);
      return;
    }
    if (head - w->prefix_cursor > ring->n_slots) { /* overwritten before we came */
      w->prefix_dropped += head - ring->n_slots - w->prefix_cursor;
      w->prefix_cursor = head - ring->n_slots;
    }
    uint64_t seq = ++w->prefix_cursor;
    ngx_http_lupin_slot_t *slot = &ring->slots[seq % ring->n_slots];
    int mine = slot->pid == ngx_pid;
    if (!mine) ngx_memcpy(&s, slot, offsetof(ngx_http_lupin_slot_t, hashes) + slot->n * 8);
    ngx_shmtx_unlock(&shpool->mutex);
    if (mine) continue;
    int rc = lupin_shared_prefix_apply(shared, s.key, s.endpoint, s.hashes, s.n);
    if (rc == 1)
      w->prefix_applied++;
    else
      w->prefix_ignored++;
  }
}

void ngx_http_lupin_prefix_zone_close(lupin_shared *shared) {
  ngx_http_lupin_worker.prefix_zone = NULL;
  if (shared) lupin_shared_on_prefix_record(shared, NULL, NULL);
}
