/* ngx_http_lupin.h -- what the files of ngx_http_lupin_module share.
 *
 *   ngx_http_lupin_module.c  directives, configuration, the module, the
 *                            worker's runtime (init_process, exit_process)
 *   lupin_schedule.c         the precontent phase: the body read, the
 *                            request begun and scheduled, a refusal answered;
 *                            the request ended from the pool's cleanup
 *   lupin_balancer.c         `lupin;` in upstream {}: the peers are the picks,
 *                            then the runtime's fallbacks
 *   lupin_filters.c          the response's header and body, to the runtime
 *   lupin_status.c           `lupin_status;`: Prometheus text
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
} ngx_http_lupin_main_conf_t;

/* location{} */
typedef struct {
  ngx_flag_t schedule; /* lupin_schedule */
} ngx_http_lupin_loc_conf_t;

/* An endpoint of the config, its address resolved when the worker started. */
typedef struct {
  char *name;
  struct sockaddr *sockaddr;
  socklen_t socklen;
  ngx_str_t text; /* "address:port", the peer's name in nginx's logs */
} ngx_http_lupin_endpoint_t;

/* The worker's runtime and what it counts: one per worker process. */
typedef struct {
  lupin_runtime *rt;
  ngx_array_t endpoints;    /* ngx_http_lupin_endpoint_t */
  ngx_array_t routes;       /* char *, sorted: the runtime's API routes */
  uint64_t outcomes[16];    /* requests ended, by lupin_outcome */
  uint64_t by_status[600];  /* requests begun, by the status answered */
  uint64_t attempts_failed; /* upstream attempts that failed */
  uint64_t fallbacks_tried; /* attempts sent to a fallback */
} ngx_http_lupin_worker_t;

extern ngx_http_lupin_worker_t ngx_http_lupin_worker;

/* One request's part: kept in the module's ctx and as the data of the pool
 * cleanup that ends it. */
typedef struct {
  lupin_request *req;
  lupin_result result;
  const lupin_pick *fallbacks;
  size_t n_fallbacks;
  ngx_uint_t attempt;     /* attempts begun: picks first, then fallbacks */
  ngx_int_t status;       /* the precontent handler's answer once decided */
  unsigned body_read : 1; /* the client body is in */
  unsigned waiting : 1;   /* the handler returned NGX_DONE for the body */
  unsigned scheduled : 1; /* status 200: the balancer has picks */
  unsigned answered : 1;  /* the upstream's response header reached us */
  unsigned completed : 1; /* its last buffer too */
  unsigned failed : 1;    /* an attempt failed */
} ngx_http_lupin_ctx_t;

extern ngx_module_t ngx_http_lupin_module;

/* lupin_schedule.c */
ngx_int_t ngx_http_lupin_schedule_init(ngx_conf_t *cf);

/* ngx_http_lupin_module.c: lupin_config's endpoint of that name, or NULL */
ngx_http_lupin_endpoint_t *ngx_http_lupin_endpoint(const char *name);

/* lupin_balancer.c */
char *ngx_http_lupin_upstream(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);

/* lupin_filters.c */
ngx_int_t ngx_http_lupin_filters_init(ngx_conf_t *cf);

/* lupin_status.c */
char *ngx_http_lupin_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);

#endif
