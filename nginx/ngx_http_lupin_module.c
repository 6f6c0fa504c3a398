/* ngx_http_lupin_module: the directives, the configuration and the worker's
 * runtime.
 *
 * nginx parses the configuration in the master; lupin_config's file is
 * loaded there once, into a runtime freed at once, so that `nginx -t` (and a
 * reload's parse) fails with lupin's `file:line: path: message`.  Each worker
 * process then opens its own runtime in init_process (one LuaJIT state per
 * worker: docs/nginx.md says what that means) and frees it in exit_process. */
#include "ngx_http_lupin.h"

#include <stdlib.h>

ngx_http_lupin_worker_t ngx_http_lupin_worker;

static void *ngx_http_lupin_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_lupin_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_lupin_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_lupin_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child);
static char *ngx_http_lupin_config(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *ngx_http_lupin_prefix_zone_size(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_http_lupin_postconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_lupin_init_process(ngx_cycle_t *cycle);
static void ngx_http_lupin_exit_process(ngx_cycle_t *cycle);

static ngx_command_t ngx_http_lupin_commands[] = {
    {ngx_string("lupin_config"), NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1, ngx_http_lupin_config,
     NGX_HTTP_MAIN_CONF_OFFSET, 0, NULL},
    {ngx_string("lupin_home"), NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1, ngx_conf_set_str_slot,
     NGX_HTTP_MAIN_CONF_OFFSET, offsetof(ngx_http_lupin_main_conf_t, home), NULL},
    {ngx_string("lupin_memory_limit"), NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1, ngx_conf_set_size_slot,
     NGX_HTTP_MAIN_CONF_OFFSET, offsetof(ngx_http_lupin_main_conf_t, memory_limit), NULL},
    {ngx_string("lupin_prefix_zone"), NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
     ngx_http_lupin_prefix_zone_size, NGX_HTTP_MAIN_CONF_OFFSET, 0, NULL},
    {ngx_string("lupin_schedule"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_FLAG,
     ngx_conf_set_flag_slot, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(ngx_http_lupin_loc_conf_t, schedule), NULL},
    {ngx_string("lupin"), NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS, ngx_http_lupin_upstream, 0, 0, NULL},
    {ngx_string("lupin_status"), NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS, ngx_http_lupin_status, 0, 0,
     NULL},
    {ngx_string("lupin_admin"), NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS, ngx_http_lupin_admin,
     NGX_HTTP_LOC_CONF_OFFSET, 0, NULL},
    {ngx_string("lupin_explain"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_CONF_FLAG,
     ngx_conf_set_flag_slot, NGX_HTTP_LOC_CONF_OFFSET, offsetof(ngx_http_lupin_loc_conf_t, explain),
     NULL},
    {ngx_string("lupin_config_watch"), NGX_HTTP_MAIN_CONF | NGX_CONF_FLAG, ngx_conf_set_flag_slot,
     NGX_HTTP_MAIN_CONF_OFFSET, offsetof(ngx_http_lupin_main_conf_t, watch), NULL},
    ngx_null_command};

static ngx_http_module_t ngx_http_lupin_module_ctx = {
    NULL,                             /* preconfiguration */
    ngx_http_lupin_postconfiguration, /* postconfiguration */
    ngx_http_lupin_create_main_conf,  /* create main configuration */
    ngx_http_lupin_init_main_conf,    /* init main configuration */
    NULL,                             /* create server configuration */
    NULL,                             /* merge server configuration */
    ngx_http_lupin_create_loc_conf,   /* create location configuration */
    ngx_http_lupin_merge_loc_conf     /* merge location configuration */
};

ngx_module_t ngx_http_lupin_module = {NGX_MODULE_V1,
                                      &ngx_http_lupin_module_ctx,  /* module context */
                                      ngx_http_lupin_commands,     /* module directives */
                                      NGX_HTTP_MODULE,             /* module type */
                                      NULL,                        /* init master */
                                      NULL,                        /* init module */
                                      ngx_http_lupin_init_process, /* init process */
                                      NULL,                        /* init thread */
                                      NULL,                        /* exit thread */
                                      ngx_http_lupin_exit_process, /* exit process */
                                      NULL,                        /* exit master */
                                      NGX_MODULE_V1_PADDING};

static void *ngx_http_lupin_create_main_conf(ngx_conf_t *cf) {
  ngx_http_lupin_main_conf_t *mcf = ngx_pcalloc(cf->pool, sizeof(*mcf));
  if (mcf == NULL) return NULL;
  mcf->memory_limit = NGX_CONF_UNSET_SIZE;
  mcf->prefix_zone_size = NGX_CONF_UNSET_SIZE;
  mcf->watch = NGX_CONF_UNSET;
  return mcf;
}

/* A string as the runtime takes it: NUL-terminated, in the pool. */
static char *ngx_http_lupin_cstr(ngx_pool_t *pool, ngx_str_t *s) {
  char *p = ngx_pnalloc(pool, s->len + 1);
  if (p == NULL) return NULL;
  ngx_memcpy(p, s->data, s->len);
  p[s->len] = '\0';
  return p;
}

static char *ngx_http_lupin_init_main_conf(ngx_conf_t *cf, void *conf) {
  ngx_http_lupin_main_conf_t *mcf = conf;
  ngx_conf_init_size_value(mcf->memory_limit, 0);
  ngx_conf_init_size_value(mcf->prefix_zone_size, 8 * 1024 * 1024);
  ngx_conf_init_value(mcf->watch, 0);
  if (mcf->home.len == 0) {
    /* nginx clears the workers' environment: the master's $LUPIN_HOME is
     * kept here for them */
    const char *env = getenv("LUPIN_HOME");
    if (env != NULL) {
      mcf->home.len = ngx_strlen(env);
      mcf->home.data = (u_char *)env;
    }
  } else if (ngx_conf_full_name(cf->cycle, &mcf->home, 0) != NGX_OK) {
    return NGX_CONF_ERROR;
  }
  if (mcf->home.len && !(mcf->home.data = (u_char *)ngx_http_lupin_cstr(cf->pool, &mcf->home)))
    return NGX_CONF_ERROR;
  return NGX_CONF_OK;
}

static void *ngx_http_lupin_create_loc_conf(ngx_conf_t *cf) {
  ngx_http_lupin_loc_conf_t *lcf = ngx_pcalloc(cf->pool, sizeof(*lcf));
  if (lcf == NULL) return NULL;
  lcf->schedule = NGX_CONF_UNSET;
  lcf->explain = NGX_CONF_UNSET;
  return lcf;
}

static char *ngx_http_lupin_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child) {
  ngx_http_lupin_loc_conf_t *prev = parent, *conf = child;
  (void)cf;
  ngx_conf_merge_value(conf->schedule, prev->schedule, 0);
  ngx_conf_merge_value(conf->explain, prev->explain, 0);
  return NGX_CONF_OK;
}

static char *ngx_http_lupin_config(ngx_conf_t *cf, ngx_command_t *cmd, void *conf) {
  ngx_http_lupin_main_conf_t *mcf = conf;
  ngx_str_t *value = cf->args->elts;
  (void)cmd;
  if (mcf->config.len) return "is duplicate";
  mcf->config = value[1];
  if (ngx_conf_full_name(cf->cycle, &mcf->config, 1) != NGX_OK) return NGX_CONF_ERROR;
  if (!(mcf->config.data = (u_char *)ngx_http_lupin_cstr(cf->pool, &mcf->config)))
    return NGX_CONF_ERROR;
  if (ngx_http_lupin_reload_zone(cf, mcf) != NGX_OK) return NGX_CONF_ERROR;
  return NGX_CONF_OK;
}

/* lupin_prefix_zone SIZE | off */
static char *ngx_http_lupin_prefix_zone_size(ngx_conf_t *cf, ngx_command_t *cmd, void *conf) {
  ngx_http_lupin_main_conf_t *mcf = conf;
  ngx_str_t *value = cf->args->elts;
  (void)cmd;
  if (mcf->prefix_zone_size != NGX_CONF_UNSET_SIZE) return "is duplicate";
  if (ngx_strcmp(value[1].data, "off") == 0) {
    mcf->prefix_zone_size = 0;
    return NGX_CONF_OK;
  }
  ssize_t size = ngx_parse_size(&value[1]);
  if (size == NGX_ERROR || size < (ssize_t)(256 * 1024))
    return "needs a size of 256k or more, or off";
  mcf->prefix_zone_size = (size_t)size;
  return NGX_CONF_OK;
}

/* The runtime's log lines, into nginx's error log. */
static void ngx_http_lupin_log(void *ud, int level, const char *msg) {
  static const ngx_uint_t levels[] = {NGX_LOG_ERR, NGX_LOG_WARN, NGX_LOG_INFO, NGX_LOG_DEBUG};
  ngx_log_t *log = ud;
  ngx_log_error(levels[level & 3], log, 0, "lupin: %s", msg);
}

static int ngx_http_lupin_log_level(ngx_log_t *log) {
  if (log->log_level >= NGX_LOG_DEBUG) return LUPIN_LOG_DEBUG;
  if (log->log_level >= NGX_LOG_INFO) return LUPIN_LOG_INFO;
  if (log->log_level >= NGX_LOG_WARN) return LUPIN_LOG_WARN;
  return LUPIN_LOG_ERROR;
}

/* A runtime with the config loaded; NULL with the reason in err. */
static lupin_runtime *ngx_http_lupin_open(ngx_http_lupin_main_conf_t *mcf, ngx_log_t *log,
                                          lupin_shared *shared, char *err, size_t errlen) {
  lupin_options opts = {.home = mcf->home.len ? (const char *)mcf->home.data : NULL,
                        .shared = shared,
                        /* lupin serve's choices: mimalloc under the Lua heap,
                         * and the collector's steps between requests
                         * (lupin_schedule.c posts them), not inside them */
                        .allocator = lh_lua_alloc,
                        .host_paces_collector = 1,
                        .memory_limit = mcf->memory_limit,
                        .log = ngx_http_lupin_log,
                        .log_ud = log,
                        .log_level = ngx_http_lupin_log_level(log)};
  lupin_runtime *rt = lupin_runtime_new(&opts, err, errlen);
  if (rt == NULL) return NULL;
  /* the "gateway" section lupin serve reads: one config serves both */
  if (lh_settings_declare(rt, err, errlen) != 0 ||
      lupin_runtime_load(rt, (const char *)mcf->config.data, err, errlen) != 0) {
    lupin_runtime_free(rt);
    return NULL;
  }
  return rt;
}

/* nginx -t, and every parse of nginx.conf: the config loads, or nginx
 * refuses it with lupin's message. */
static ngx_int_t ngx_http_lupin_postconfiguration(ngx_conf_t *cf) {
  ngx_http_lupin_main_conf_t *mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_lupin_module);
  if (ngx_http_lupin_schedule_init(cf) != NGX_OK || ngx_http_lupin_filters_init(cf) != NGX_OK)
    return NGX_ERROR;
  if (mcf->config.len == 0) return NGX_OK;
  char err[2048];
  lupin_runtime *rt = ngx_http_lupin_open(mcf, cf->log, NULL, err, sizeof err);
  if (rt == NULL) {
    ngx_log_error(NGX_LOG_EMERG, cf->log, 0, "lupin_config \"%V\": %s", &mcf->config, err);
    return NGX_ERROR;
  }
  lupin_runtime_free(rt);
  if (mcf->prefix_zone_size && ngx_http_lupin_prefix_zone_add(cf, mcf->prefix_zone_size) != NGX_OK)
    return NGX_ERROR;
  return NGX_OK;
}

static void ngx_http_lupin_add_route(void *ud, const char *path) {
  int *failed = ud;
  char **slot = ngx_array_push(&ngx_http_lupin_worker.routes);
  if (slot == NULL || !(*slot = strdup(path))) *failed = 1;
}

ngx_int_t ngx_http_lupin_send(ngx_http_request_t *r, ngx_uint_t status, const char *type,
                              lh_buf *text) {
  ngx_buf_t *out = text->data ? ngx_create_temp_buf(r->pool, text->len ? text->len : 1) : NULL;
  if (out == NULL) {
    lh_buf_free(text);
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  }
  out->last = ngx_cpymem(out->pos, text->data, text->len);
  out->last_buf = (r == r->main);
  out->last_in_chain = 1;
  lh_buf_free(text);
  r->headers_out.status = status;
  r->headers_out.content_length_n = out->last - out->pos;
  r->headers_out.content_type.data = (u_char *)type;
  r->headers_out.content_type.len = ngx_strlen(type);
  r->headers_out.content_type_len = r->headers_out.content_type.len;
  r->headers_out.content_type_lowcase = NULL;
  ngx_int_t rc = ngx_http_send_header(r);
  if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) return rc;
  ngx_chain_t cl = {out, NULL};
  return ngx_http_output_filter(r, &cl);
}

static void ngx_http_lupin_collect_step(ngx_event_t *ev) {
  (void)ev;
  if (ngx_http_lupin_worker.rt) lupin_runtime_collect_step(ngx_http_lupin_worker.rt);
}

void ngx_http_lupin_collect_later(void) {
  ngx_event_t *ev = &ngx_http_lupin_worker.collect;
  if (!ev->posted && ev->handler) {
    ngx_post_event(ev, &ngx_posted_events);
  }
}

/* The runtime, and the names and routes copied out of it (malloc'ed: the
 * cycle's pool outlives exit_process, LeakSanitizer counts them). */
static void ngx_http_lupin_worker_free(ngx_http_lupin_worker_t *w) {
  if (w->collect.posted) { /* a macro of several statements */
    ngx_delete_posted_event(&w->collect);
  }
  w->collect.handler = NULL;
  ngx_http_lupin_endpoints_stop();
  char **route = w->routes.elts;
  for (ngx_uint_t i = 0; i < w->routes.nelts; i++)
    free(route[i]);
  w->routes.nelts = 0;
  ngx_http_lupin_prefix_zone_close(w->shared);
  if (w->rt) lupin_runtime_free(w->rt);
  w->rt = NULL;
  if (w->shared) lupin_shared_free(w->shared);
  w->shared = NULL;
}

static ngx_int_t ngx_http_lupin_init_process(ngx_cycle_t *cycle) {
  ngx_http_lupin_main_conf_t *mcf =
      ngx_http_cycle_get_module_main_conf(cycle, ngx_http_lupin_module);
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  if (mcf == NULL || mcf->config.len == 0) return NGX_OK;
  char err[2048];
  int failed = 0;
  if (ngx_array_init(&w->routes, cycle->pool, 16, sizeof(char *)) != NGX_OK) return NGX_ERROR;
  w->shared = lupin_shared_new(1, err, sizeof err);
  if (w->shared) w->rt = ngx_http_lupin_open(mcf, cycle->log, w->shared, err, sizeof err);
  if (w->rt == NULL) {
    ngx_log_error(NGX_LOG_EMERG, cycle->log, 0, "lupin_config \"%V\": %s", &mcf->config, err);
    ngx_http_lupin_worker_free(w);
    return NGX_ERROR;
  }
  ngx_http_lupin_prefix_zone_open(cycle, w->shared);
  w->collect.handler = ngx_http_lupin_collect_step;
  w->collect.log = cycle->log;
  if (ngx_http_lupin_endpoints_sync(cycle->log, err, sizeof err) != NGX_OK) {
    failed = 1;
  } else {
    lupin_runtime_routes(w->rt, ngx_http_lupin_add_route, &failed);
    if (failed) lh_errf(err, sizeof err, "out of memory");
  }
  if (failed) {
    ngx_log_error(NGX_LOG_EMERG, cycle->log, 0, "lupin_config \"%V\": %s", &mcf->config, err);
    ngx_http_lupin_worker_free(w);
    return NGX_ERROR;
  }
  ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                "lupin: worker runtime on \"%V\": %ui endpoints, %ui API routes", &mcf->config,
                w->n_endpoints, w->routes.nelts);
  return ngx_http_lupin_reload_start(cycle);
}

static void ngx_http_lupin_exit_process(ngx_cycle_t *cycle) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  (void)cycle;
  if (w->rt == NULL) return;
  ngx_http_lupin_reload_stop();
  /* requests still alive are ended as cancelled by the runtime; their pool
   * cleanups, should they run later, find no runtime */
  ngx_http_lupin_worker_free(w);
}
