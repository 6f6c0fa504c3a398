/* ngx_http_lupin.h -- what the files of ngx_http_lupin_module share.
 *
 *   ngx_http_lupin_module.c  directives, configuration, the module, the
 *                            worker's runtime (init_process, exit_process)
 *   lupin_schedule.c         the precontent phase: the body read, the
 *                            request begun and scheduled, a refusal answered;
 *                            the request ended from the pool's cleanup
 *   lupin_balancer.c         `lupin;` in upstream {}: the peers are the picks,
 *                            then the runtime's fallbacks
 *   lupin_endpoints.c        the config's endpoints: their addresses, their
 *                            metrics scraped on nginx timers, their health
 *   lupin_prefix_zone.c      the workers' prefix records through shared memory
 *   lupin_filters.c          the response's header and body, to the runtime
 *   lupin_status.c           `lupin_status;`: Prometheus text
 *   lupin_admin.c            `lupin_admin;`: the admin operations as JSON
 *   lupin_reload.c           a reload through lupin's generations, in every
 *                            worker (a shared sequence number), and the
 *                            config file's watch
 *   lupin_explain.c          explain records: the live request's header,
 *                            the worker's ring, the dry run
 *
 * The module embeds liblupin through core/lupin.h and liblupin-host.a
 * through host/lupin_host.h, nothing else of lupin (docs/nginx.md). */
#ifndef NGX_HTTP_LUPIN_H
#define NGX_HTTP_LUPIN_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "lupin.h"
#include "lupin_host.h"

/* the http{} level: the config file, read by every worker */
typedef struct {
  ngx_str_t config; /* lupin_config: full path, NUL-terminated; empty: none */
  ngx_str_t home;   /* lupin_home, else $LUPIN_HOME when nginx -t/start ran */
  size_t memory_limit;
  size_t prefix_zone_size;     /* lupin_prefix_zone; 0: off */
  ngx_shm_zone_t *prefix_zone; /* NULL: none */
  ngx_flag_t watch;            /* lupin_config_watch */
  ngx_str_t admin;             /* the first lupin_admin location's name, empty: none */
  ngx_shm_zone_t *shm;         /* the reload sequence number, with lupin_config */
} ngx_http_lupin_main_conf_t;

/* location{} */
typedef struct {
  ngx_flag_t schedule; /* lupin_schedule */
  ngx_flag_t explain;  /* lupin_explain */
} ngx_http_lupin_loc_conf_t;

/* An endpoint of the config, its address resolved when it was added.  An
 * endpoint a reload drops is marked removed and kept until the worker
 * exits: a request's upstream may still name its address. */
typedef struct ngx_http_lupin_endpoint_s ngx_http_lupin_endpoint_t;
typedef struct ngx_http_lupin_scrape_s ngx_http_lupin_scrape_t;
struct ngx_http_lupin_endpoint_s {
  ngx_http_lupin_endpoint_t *next;
  char *name, *address; /* malloc'ed */
  int port;
  ngx_pool_t *pool; /* its resolved address */
  struct sockaddr *sockaddr;
  socklen_t socklen;
  ngx_str_t text;                  /* "address:port", the peer's name in nginx's logs */
  ngx_event_t tick;                /* the next scrape */
  ngx_http_lupin_scrape_t *scrape; /* the one in flight, NULL: none */
  lupin_metrics metrics;
  char *running_lora, *waiting_lora; /* as last scraped (malloc'ed) */
  double scraped_at;                 /* lupin_now() of the last good scrape, 0: never */
  uint64_t scrapes, scrape_errors;
  lh_health health;
  unsigned removed : 1; /* dropped by a reload */
  unsigned seen : 1;    /* listed by the config being applied */
};

/* explain records a worker keeps (lupin serve's ring holds as many) */
#define NGX_HTTP_LUPIN_EXPLAIN_KEPT 64

/* The worker's part of reloads (lupin_reload.c) and explain records
 * (lupin_explain.c). */
typedef struct {
  ngx_event_t timer;      /* the shared sequence and the file, looked at */
  ngx_atomic_t *seq;      /* in the zone: reloads asked for, all workers */
  ngx_atomic_uint_t seen; /* the last of them this worker followed */
  ngx_file_uniq_t ino;    /* lupin_config's file as last loaded... */
  struct timespec mtime;
  off_t size;
  ngx_uint_t changed;  /* ...and ticks it has looked changed and settled */
  uint64_t reloads[2]; /* by result: ok, error */
  double last_seconds;
  lh_explain_ring *ring;
} ngx_http_lupin_admin_t;

/* The worker's runtime and what it counts: one per worker process. */
typedef struct {
  lupin_runtime *rt;
  lupin_shared *shared;                 /* the runtime's: the prefix records' hook is on it */
  lh_settings set;                      /* the config's "gateway" section */
  ngx_http_lupin_endpoint_t *endpoints; /* newest first, removed ones too */
  ngx_uint_t n_endpoints;               /* not removed */
  ngx_event_t health_tick;              /* ejections' ends, staleness, flow TTLs */
  ngx_uint_t ticks;                     /* of health_tick */
  ngx_uint_t turn;                      /* the next endpoint for a GET (round robin) */
  ngx_event_t collect;                  /* the Lua collector's step, posted */
  ngx_log_t scrape_log;                 /* the error log, crit only */
  ngx_uint_t no_healthy;                /* "no healthy endpoint" was logged */
  uint64_t ended_at_gc;                 /* requests ended at the last idle collection */
  ngx_array_t routes;                   /* char *, sorted: the runtime's API routes */
  uint64_t outcomes[16];                /* requests ended, by lupin_outcome */
  uint64_t by_status[600];              /* requests begun, by the status answered */
  uint64_t attempts_failed;             /* upstream attempts that failed */
  uint64_t fallbacks_tried;             /* attempts sent to a fallback */
  /* prefix records shared with the other workers (lupin_prefix_zone.c) */
  ngx_shm_zone_t *prefix_zone; /* NULL: not shared (one worker, or off) */
  uint64_t prefix_cursor;      /* the last record of the ring seen */
  uint64_t prefix_published, prefix_applied, prefix_ignored, prefix_dropped, prefix_too_long;
  ngx_http_lupin_admin_t admin;
} ngx_http_lupin_worker_t;

extern ngx_http_lupin_worker_t ngx_http_lupin_worker;

/* One request's part: kept in the module's ctx and as the data of the pool
 * cleanup that ends it. */
typedef struct {
  ngx_http_request_t *r;
  lupin_request *req;
  lupin_result result;
  const lupin_pick *fallbacks;
  size_t n_fallbacks;
  ngx_http_lupin_endpoint_t *endpoint; /* the current attempt's */
  ngx_uint_t attempt;                  /* attempts begun: picks first, then fallbacks */
  ngx_int_t status;                    /* the precontent handler's answer once decided */
  unsigned body_read : 1;              /* the client body is in */
  unsigned waiting : 1;                /* the handler returned NGX_DONE for the body */
  unsigned scheduled : 1;              /* status 200: the balancer has picks */
  unsigned answered : 1;               /* the upstream's response header reached us */
  unsigned completed : 1;              /* its last buffer too */
  unsigned failed : 1;                 /* an attempt failed */
  unsigned explain : 2;                /* x-lupin-explain: 1 asked; 1 kept, 2 refused */
  char *explain_summary;               /* the one line, in the request's pool */
} ngx_http_lupin_ctx_t;

extern ngx_module_t ngx_http_lupin_module;

/* ngx_http_lupin_module.c: text (freed here) as the whole answer, with
 * its status and content type; what a handler returns */
ngx_int_t ngx_http_lupin_send(ngx_http_request_t *r, ngx_uint_t status, const char *type,
                              lh_buf *text);

/* lupin_schedule.c; the client body in one piece (read back from nginx's
 * temporary file, else in place) */
ngx_int_t ngx_http_lupin_schedule_init(ngx_conf_t *cf);
ngx_int_t ngx_http_lupin_body(ngx_http_request_t *r, const char **body, size_t *len);

/* ngx_http_lupin_module.c: the Lua collector's owed work, done once the
 * events at hand are handled (lupin_options.host_paces_collector) */
void ngx_http_lupin_collect_later(void);

/* lupin_endpoints.c: the config's endpoints (at start and after a reload)
 * into the runtime and the worker's list, their scrapes started; the
 * settings read again.  Stop: every timer and scrape ended, all freed. */
ngx_int_t ngx_http_lupin_endpoints_sync(ngx_log_t *log, char *err, size_t errlen);
void ngx_http_lupin_endpoints_stop(void);
/* The endpoint of that name, or NULL (none, or removed). */
ngx_http_lupin_endpoint_t *ngx_http_lupin_endpoint(const char *name);
/* An attempt's end, for outlier detection: failed (nginx gave up on the
 * peer: connect refused, reset, timeout) or the status it answered. */
void ngx_http_lupin_endpoint_attempt(ngx_http_lupin_endpoint_t *e, ngx_uint_t failed,
                                     ngx_uint_t status);
/* The endpoint families of /lupin_status. */
void ngx_http_lupin_endpoints_expo(lh_expo *e);

/* lupin_prefix_zone.c: the zone added while nginx.conf is read; opened
 * in a worker (the hook set when there are several workers), drained
 * before each schedule and on the health tick, closed at exit. */
ngx_int_t ngx_http_lupin_prefix_zone_add(ngx_conf_t *cf, size_t size);
void ngx_http_lupin_prefix_zone_open(ngx_cycle_t *cycle, lupin_shared *shared);
void ngx_http_lupin_prefix_zone_drain(lupin_shared *shared);
void ngx_http_lupin_prefix_zone_close(lupin_shared *shared);

/* lupin_balancer.c */
char *ngx_http_lupin_upstream(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);

/* lupin_filters.c */
ngx_int_t ngx_http_lupin_filters_init(ngx_conf_t *cf);

/* lupin_status.c */
char *ngx_http_lupin_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);

/* lupin_admin.c; x-lupin-worker, the worker that answered */
char *ngx_http_lupin_admin(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
ngx_int_t ngx_http_lupin_worker_header(ngx_http_request_t *r);

/* lupin_reload.c: the zone made with lupin_config; the worker's timer and
 * file stamp from init_process (after its runtime opened), gone in
 * exit_process; a reload of this worker's runtime (why: for the log),
 * shared: the other workers follow it */
ngx_int_t ngx_http_lupin_reload_zone(ngx_conf_t *cf, ngx_http_lupin_main_conf_t *mcf);
ngx_int_t ngx_http_lupin_reload_start(ngx_cycle_t *cycle);
void ngx_http_lupin_reload_stop(void);
ngx_int_t ngx_http_lupin_reload(ngx_log_t *log, const char *why, int shared, char *err,
                                size_t errlen);

/* lupin_explain.c: x-lupin-explain on a scheduled location (the desc's
 * flag, the summary once scheduled, the response's headers, the record
 * kept at the end), and the admin's explain routes (rest: after "explain") */
void ngx_http_lupin_explain_begin(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx,
                                  lupin_request_desc *d);
void ngx_http_lupin_explain_scheduled(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx);
ngx_int_t ngx_http_lupin_explain_headers(ngx_http_request_t *r);
void ngx_http_lupin_explain_ended(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx,
                                  lupin_outcome o);
ngx_int_t ngx_http_lupin_explain_admin(ngx_http_request_t *r, ngx_str_t *rest);

/* lupin_admin.c: an admin answer, b's JSON (freed) or the OpenAI error
 * shape; what to finalize r with */
ngx_int_t ngx_http_lupin_admin_json(ngx_http_request_t *r, ngx_uint_t status, lh_buf *b);
ngx_int_t ngx_http_lupin_admin_error(ngx_http_request_t *r, ngx_uint_t status, const char *msg,
                                     const char *param);

/* The endpoints of the current generation's config applied to the worker's
 * table and runtime, after a reload (lupin_endpoints.c). */
ngx_int_t ngx_http_lupin_endpoints_sync(ngx_log_t *log, char *err, size_t errlen);

#endif
