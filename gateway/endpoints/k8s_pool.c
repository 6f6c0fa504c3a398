/* Endpoints from Kubernetes: the InferencePool named by --k8s-pool and the
 * pods it selects, each listed then watched (the pool is not read from the
 * API server when the config file holds it: a manifest's InferencePool, or
 * chart values' modelServers; lupin_runtime_config_pool) (the list's resourceVersion,
 * moved on by every event and bookmark, is where a watch resumes; 410 Gone
 * starts over with a list).  After each change the full list of endpoints
 * goes to the process (gateway.c applies it as an endpoints file's).
 *
 * An endpoint is a pod that is Ready, not being deleted and has an IP, at
 * each of the pool's target ports: named as the pod when the pool has one
 * port, POD-PORT when it has several; its labels are the pod's. */
#include "endpoints/endpoints.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define MAX_PORTS        8
#define BACKOFF_FIRST_MS 250 /* doubled at each failure in a row, up to: */
#define BACKOFF_MAX_MS   30000
#define LIST_IDLE_MS     30000
#define WATCH_SECONDS    290 /* the server ends a watch after it; resumed at once */
#define WATCH_IDLE_MS    ((WATCH_SECONDS + 30) * 1000)
#define MAX_LIST_BYTES   (256u << 20)
#define MAX_ERROR_BYTES  65536
#define APPLY_DELAY_MS   5 /* the events of one read become one list */

/* lupin_kubernetes_errors_total's reasons */
enum {
  R_UNREACHABLE,
  R_TLS,
  R_TIMEOUT,
  R_CREDENTIALS,
  R_UNAUTHORIZED,
  R_FORBIDDEN,
  R_NOT_FOUND,
  R_HTTP,
  R_BAD_RESPONSE,
  R_WATCH,
  R_BAD_POOL,
  R_REASONS
};
static const char *const reason_names[R_REASONS] = {
    "unreachable", "tls",         "timeout",      "credentials", "unauthorized", "forbidden",
    "not_found",   "http_status", "bad_response", "watch_error", "bad_pool"};

typedef struct gw_k8s gw_k8s;

/* One resource listed then watched: the pool or its pods. */
typedef struct k8s_stream {
  gw_k8s *k;
  const char *what; /* "pool", "pods": in messages and metrics */
  gw_k8s_call *call;
  unsigned gen; /* bumped at each call: an event handler may restart it */
  int watching, listed, status;
  char rv[64];
  lh_buf body; /* a list's body, an error's, or a watch's partial line */
  uv_timer_t retry;
  uint64_t backoff_ms;
  uint64_t restarts;
  char err[1024]; /* the last failure, "" once a call worked */
  void (*path)(gw_k8s *k, lh_buf *b);
  void (*on_list)(gw_k8s *k, json_t *items);
  void (*on_event)(gw_k8s *k, const char *type, json_t *obj);
} k8s_stream;

struct gw_k8s {
  lupin_gateway *gw;
  gw_k8s_apply_fn apply;
  gw_k8s_config cfg;
  gw_k8s_client *client;
  char ns[256], name[256], group[256], version[16], label[520];
  int pool_found;
  int from_config;         /* the selector and ports are the config file's pool */
  char pool_problem[1024]; /* the pool missing or unusable, "" when fine */
  char selector[4096];     /* k=v,k2=v2 */
  int ports[MAX_PORTS], n_ports;
  json_t *pods; /* name -> the pod as last seen */
  k8s_stream pool, pods_s;
  uv_timer_t apply_timer;
  int applied, stopped;
  size_t n_endpoints;
  char reason[1100]; /* why not synced, "" when synced */
  uint64_t errors[R_REASONS];
};

static void update_status(gw_k8s *k);
static void stream_get(k8s_stream *s, int watch);

/* --- small helpers ------------------------------------------------------------ */

static void encoded(lh_buf *b, const char *s) {
  for (; *s; s++)
    if (isalnum((unsigned char)*s) || strchr("-_.~", *s))
      lh_buf_append(b, s, 1);
    else
      lh_buf_printf(b, "%%%02X", (unsigned char)*s);
}

static const char *str_at(json_t *o, const char *a, const char *b) {
  json_t *v = json_object_get(o, a);
  return json_string_value(b ? json_object_get(v, b) : v);
}

/* The message of a Status body (what the API server answers an error with). */
static void status_message(const lh_buf *body, char *out, size_t len) {
  json_t *st = body->data ? json_loadb(body->data, body->len, 0, NULL) : NULL;
  const char *m = json_string_value(json_object_get(st, "message"));
  snprintf(out, len, "%s", m ? m : "");
  json_decref(st);
}

/* --- a stream's calls and their failures -------------------------------------- */

static void on_retry(uv_timer_t *t) {
  k8s_stream *s = t->data;
  stream_get(s, s->listed);
}

static void stream_cancel(k8s_stream *s) {
  gw_k8s_cancel(s->call);
  s->call = NULL;
  uv_timer_stop(&s->retry);
}

/* An error the operator must see: counted, kept for /readyz and the log,
 * then the same call again after a pause that grows with each failure. */
static void stream_fail(k8s_stream *s, int reason, const char *msg) {
  gw_k8s *k = s->k;
  stream_cancel(s);
  k->errors[reason]++;
  snprintf(s->err, sizeof s->err, "%s: %s", s->what, msg);
  s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : BACKOFF_FIRST_MS;
  if (s->backoff_ms > BACKOFF_MAX_MS) s->backoff_ms = BACKOFF_MAX_MS;
  if (!k->stopped) uv_timer_start(&s->retry, on_retry, s->backoff_ms, 0);
  update_status(k);
}

static void stream_ok(k8s_stream *s) {
  s->backoff_ms = 0;
  if (!s->err[0]) return;
  s->err[0] = 0;
  update_status(s->k);
}

/* Lists from scratch: the first time, after 410 Gone, after a new selector. */
static void stream_list(k8s_stream *s) {
  s->listed = 0;
  s->rv[0] = 0;
  stream_get(s, 0);
}

/* A restart the protocol asks for (a watch ended or expired): counted, not an error. */
static void stream_restart(k8s_stream *s, int relist) {
  s->restarts++;
  if (relist)
    stream_list(s);
  else
    stream_get(s, 1);
}

static void handle_event(k8s_stream *s, const char *line, size_t n) {
  json_t *ev = json_loadb(line, n, 0, NULL), *obj = json_object_get(ev, "object");
  const char *type = json_string_value(json_object_get(ev, "type"));
  if (!type || !json_is_object(obj)) {
    stream_fail(s, R_BAD_RESPONSE, "a watch event that is not {type, object}");
  } else if (!strcmp(type, "ERROR")) {
    char msg[600];
    snprintf(msg, sizeof msg, "watch ERROR %lld: %s",
             (long long)json_integer_value(json_object_get(obj, "code")),
             str_at(obj, "message", NULL) ? str_at(obj, "message", NULL) : "(no message)");
    if (json_integer_value(json_object_get(obj, "code")) == 410)
      stream_restart(s, 1); /* too old a resourceVersion: list again */
    else
      stream_fail(s, R_WATCH, msg);
  } else {
    const char *rv = str_at(json_object_get(obj, "metadata"), "resourceVersion", NULL);
    if (rv) snprintf(s->rv, sizeof s->rv, "%s", rv);
    if (strcmp(type, "BOOKMARK")) s->on_event(s->k, type, obj);
  }
  json_decref(ev);
}

/* A watch's body: one JSON event per line. */
static void watch_body(k8s_stream *s, const char *data, size_t len) {
  unsigned gen = s->gen;
  lh_buf_append(&s->body, data, len);
  size_t start = 0;
  for (size_t i = 0; i < s->body.len && s->gen == gen; i++)
    if (s->body.data[i] == '\n') {
      if (i > start) handle_event(s, s->body.data + start, i - start);
      start = i + 1;
    }
  if (s->gen != gen) return; /* restarted: its body was reset */
  memmove(s->body.data, s->body.data + start, s->body.len - start);
  s->body.len -= start;
  if (s->body.len > MAX_LIST_BYTES) stream_fail(s, R_BAD_RESPONSE, "a watch event too large");
}

static void on_status(void *ud, int status) { ((k8s_stream *)ud)->status = status; }

static void on_body(void *ud, const char *data, size_t len) {
  k8s_stream *s = ud;
  if (s->status == 200 && s->watching) {
    watch_body(s, data, len);
    return;
  }
  size_t cap = s->status == 200 ? MAX_LIST_BYTES : MAX_ERROR_BYTES;
  if (s->body.len + len <= cap)
    lh_buf_append(&s->body, data, len);
  else if (s->status == 200)
    stream_fail(s, R_BAD_RESPONSE, "a list larger than 256 MiB");
}

static void list_done(k8s_stream *s) {
  json_t *root = json_loadb(s->body.data ? s->body.data : "", s->body.len, 0, NULL);
  json_t *items = json_object_get(root, "items");
  const char *rv = str_at(json_object_get(root, "metadata"), "resourceVersion", NULL);
  if (!json_is_array(items) || !rv) {
    json_decref(root);
    stream_fail(s, R_BAD_RESPONSE, "the list is not a Kubernetes list (items, resourceVersion)");
    return;
  }
  snprintf(s->rv, sizeof s->rv, "%s", rv);
  s->listed = 1;
  stream_ok(s);
  s->on_list(s->k, items);
  json_decref(root);
  stream_get(s, 1);
}

static int status_reason(int status) {
  return status == 401   ? R_UNAUTHORIZED
         : status == 403 ? R_FORBIDDEN
         : status == 404 ? R_NOT_FOUND
                         : R_HTTP;
}

static void on_done(void *ud, gw_k8s_error e, const char *detail) {
  k8s_stream *s = ud;
  s->call = NULL;
  if (e == GW_K8S_UNREACHABLE || e == GW_K8S_TLS || (e != GW_K8S_OK && !s->watching)) {
    int r = e == GW_K8S_TLS       ? R_TLS
            : e == GW_K8S_TIMEOUT ? R_TIMEOUT
            : e == GW_K8S_BROKEN  ? R_BAD_RESPONSE
                                  : R_UNREACHABLE;
    stream_fail(s, r, detail);
  } else if (e != GW_K8S_OK) { /* a watch cut short: resumed, after a pause */
    gw_log(s->k->gw, LUPIN_LOG_DEBUG, "kubernetes: %s watch: %s: resuming", s->what, detail);
    s->restarts++;
    uv_timer_start(&s->retry, on_retry, BACKOFF_FIRST_MS, 0);
  } else if (s->status == 200 && !s->watching) {
    list_done(s);
  } else if (s->status == 200) {
    stream_restart(s, 0); /* the server ended the watch (timeoutSeconds): resume it */
  } else if (s->status == 410) {
    stream_restart(s, 1);
  } else {
    char msg[700], m[600];
    status_message(&s->body, m, sizeof m);
    snprintf(msg, sizeof msg, "HTTP %d from the API server%s%s", s->status, *m ? ": " : "", m);
    stream_fail(s, status_reason(s->status), msg);
  }
}

static const gw_k8s_call_cb stream_cb = {on_status, on_body, on_done};

static void stream_get(k8s_stream *s, int watch) {
  gw_k8s *k = s->k;
  stream_cancel(s);
  s->gen++;
  if (k->stopped) return;
  lh_buf path = {0};
  s->path(k, &path);
  if (watch)
    lh_buf_printf(&path, "&watch=1&resourceVersion=%s&allowWatchBookmarks=true&timeoutSeconds=%d",
                  s->rv, WATCH_SECONDS);
  s->watching = watch;
  s->status = 0;
  s->body.len = 0;
  char err[600] = "out of memory";
  s->call = path.data ? gw_k8s_get(k->client, path.data, watch ? WATCH_IDLE_MS : LIST_IDLE_MS,
                                   &stream_cb, s, err, sizeof err)
                      : NULL;
  lh_buf_free(&path);
  if (!s->call) stream_fail(s, R_CREDENTIALS, err);
}

/* --- the pods and the endpoints they make ------------------------------------- */

static int pod_ready(json_t *pod) {
  json_t *meta = json_object_get(pod, "metadata"), *st = json_object_get(pod, "status");
  json_t *deleting = json_object_get(meta, "deletionTimestamp"), *c;
  const char *ip = str_at(st, "podIP", NULL);
  if ((deleting && !json_is_null(deleting)) || !ip || !*ip) return 0;
  size_t i;
  json_array_foreach(json_object_get(st, "conditions"), i, c) {
    const char *type = str_at(c, "type", NULL), *v = str_at(c, "status", NULL);
    if (type && !strcmp(type, "Ready")) return v && !strcmp(v, "True");
  }
  return 0;
}

/* A pod's labels as the runtime takes them (pointing into the pod). */
static lupin_header *pod_labels(json_t *pod, size_t *n) {
  json_t *labels = json_object_get(json_object_get(pod, "metadata"), "labels"), *v;
  const char *key;
  lupin_header *h = calloc(json_object_size(labels) + 1, sizeof *h);
  *n = 0;
  json_object_foreach(labels, key, v) {
    if (h && json_is_string(v)) h[(*n)++] = (lupin_header){key, json_string_value(v)};
  }
  return h;
}

static void apply_now(uv_timer_t *t) {
  gw_k8s *k = t->data;
  if (k->stopped) return;
  size_t cap = json_object_size(k->pods), n = 0, np = 0;
  lupin_endpoint_desc *d = calloc(cap * (size_t)k->n_ports + 1, sizeof *d);
  lupin_header **labels = calloc(cap + 1, sizeof *labels);
  char **names = calloc(cap * (size_t)k->n_ports + 1, sizeof *names);
  const char *pod_name;
  json_t *pod;
  if (!d || !labels || !names) {
    gw_log(k->gw, LUPIN_LOG_ERROR, "kubernetes: out of memory for %zu pods: not applied", cap);
    cap = 0;
  }
  json_object_foreach(k->pods, pod_name, pod) {
    if (!cap || !pod_ready(pod)) continue;
    size_t nl;
    lupin_header *l = labels[np++] = pod_labels(pod, &nl);
    for (int p = 0; p < k->n_ports; p++) {
      char name[300];
      snprintf(name, sizeof name, k->n_ports == 1 ? "%s" : "%s-%d", pod_name, k->ports[p]);
      names[n] = strdup(name);
      if (!names[n]) continue;
      d[n] = (lupin_endpoint_desc){names[n], str_at(json_object_get(pod, "status"), "podIP", NULL),
                                   k->ports[p], l, nl};
      n++;
    }
  }
  if (cap || !json_object_size(k->pods)) {
    k->apply(k->gw, d, n);
    k->n_endpoints = n;
    k->applied = 1;
  }
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  for (size_t i = 0; i < np; i++)
    free(labels[i]);
  free(names);
  free(labels);
  free(d);
  update_status(k);
}

static void schedule_apply(gw_k8s *k) {
  if (!uv_is_active((uv_handle_t *)&k->apply_timer))
    uv_timer_start(&k->apply_timer, apply_now, APPLY_DELAY_MS, 0);
}

static void pods_path(gw_k8s *k, lh_buf *b) {
  lh_buf_printf(b, "/api/v1/namespaces/%s/pods?labelSelector=", k->ns);
  encoded(b, k->selector);
}

static void pods_list(gw_k8s *k, json_t *items) {
  json_t *pod;
  size_t i;
  json_object_clear(k->pods);
  json_array_foreach(items, i, pod) {
    const char *name = str_at(pod, "metadata", "name");
    if (name) json_object_set(k->pods, name, pod);
  }
  schedule_apply(k);
}

static void pods_event(gw_k8s *k, const char *type, json_t *pod) {
  const char *name = str_at(pod, "metadata", "name");
  if (!name) return;
  if (!strcmp(type, "DELETED"))
    json_object_del(k->pods, name);
  else
    json_object_set(k->pods, name, pod);
  schedule_apply(k);
}

/* --- the pool ------------------------------------------------------------------- */

static void pool_path(gw_k8s *k, lh_buf *b) {
  lh_buf_printf(b, "/apis/%s/%s/namespaces/%s/inferencepools?fieldSelector=metadata.name%%3D",
                k->group, k->version, k->ns);
  encoded(b, k->name);
}

/* The selector and ports of v1 (spec.selector.matchLabels, spec.targetPorts
 * [{number}]) or of v1alpha2 (spec.selector, spec.targetPortNumber). */
static const char *pool_spec(gw_k8s *k, json_t *pool, lh_buf *sel, int *ports, int *n) {
  json_t *spec = json_object_get(pool, "spec"), *labels, *v;
  int alpha = !strcmp(k->version, "v1alpha2");
  labels = alpha ? json_object_get(spec, "selector")
                 : json_object_get(json_object_get(spec, "selector"), "matchLabels");
  const char *key;
  json_object_foreach(labels, key, v) {
    if (!json_is_string(v)) return "a selector label's value is not a string";
    lh_buf_printf(sel, "%s%s=%s", sel->len ? "," : "", key, json_string_value(v));
  }
  if (!sel->len)
    return alpha ? "spec.selector selects nothing" : "spec.selector.matchLabels selects nothing";
  *n = 0;
  if (alpha) {
    ports[(*n)++] = (int)json_integer_value(json_object_get(spec, "targetPortNumber"));
  } else {
    size_t i;
    json_array_foreach(json_object_get(spec, "targetPorts"), i, v) {
      if (*n < MAX_PORTS) ports[(*n)++] = (int)json_integer_value(json_object_get(v, "number"));
    }
  }
  for (int i = 0; i < *n; i++)
    if (ports[i] < 1 || ports[i] > 65535) return "a target port is not a port number";
  return *n ? NULL : alpha ? "no spec.targetPortNumber" : "no spec.targetPorts";
}

static void pool_missing(gw_k8s *k) {
  k->pool_found = 0;
  k->errors[R_NOT_FOUND]++;
  snprintf(k->pool_problem, sizeof k->pool_problem, "no InferencePool %s in namespace %s (%s/%s)",
           k->name, k->ns, k->group, k->version);
  stream_cancel(&k->pods_s);
  k->pods_s.err[0] = 0;
  k->selector[0] = 0;
  json_object_clear(k->pods);
  if (k->n_endpoints) schedule_apply(k); /* the pool is gone: so are its endpoints */
  update_status(k);
}

/* The pool's selector and ports in use; the pods listed again when they
 * changed.  from: where they come from, for the log. */
static void pool_use(gw_k8s *k, const char *sel, const int *ports, int n, const char *from) {
  int same = k->pool_found && !strcmp(sel, k->selector) && n == k->n_ports &&
             !memcmp(ports, k->ports, (size_t)n * sizeof *ports);
  k->pool_found = 1;
  k->pool_problem[0] = 0;
  if (!same) { /* other pods, or the same at other ports: listed again */
    snprintf(k->selector, sizeof k->selector, "%s", sel);
    memcpy(k->ports, ports, (size_t)n * sizeof *ports);
    k->n_ports = n;
    gw_log(k->gw, LUPIN_LOG_INFO, "kubernetes: InferencePool %s/%s%s selects %s, port %d%s", k->ns,
           k->name, from, k->selector, ports[0], n > 1 ? " and more" : "");
    stream_list(&k->pods_s);
  }
  update_status(k);
}

static void pool_set(gw_k8s *k, json_t *pool) {
  lh_buf sel = {0};
  int ports[MAX_PORTS], n = 0;
  const char *bad = pool_spec(k, pool, &sel, ports, &n);
  if (bad || !sel.data || sel.len >= sizeof k->selector) {
    k->errors[R_BAD_POOL]++;
    snprintf(k->pool_problem, sizeof k->pool_problem, "InferencePool %s/%s: %s", k->ns, k->name,
             bad ? bad : "the selector is too long");
    lh_buf_free(&sel);
    update_status(k);
    return;
  }
  pool_use(k, sel.data, ports, n, "");
  lh_buf_free(&sel);
}

/* The config file's pool, when it holds one of this name: used in place of
 * the API server's, whose stream stops.  Returns whether it did. */
static int pool_from_config(gw_k8s *k) {
  lupin_pool p = {0};
  char others[1024] = "", from[700];
  int rc = lupin_runtime_config_pool(k->gw->rt, k->name, k->ns, &p, others, sizeof others);
  if (rc != 1 || !p.n_ports || strlen(p.selector) >= sizeof k->selector) {
    if (rc == 0 && *others)
      gw_log(k->gw, LUPIN_LOG_WARN,
             "kubernetes: the config's InferencePools (%s) are not %s: reading %s from the API "
             "server",
             others, k->label, k->label);
    return 0;
  }
  if (!k->from_config) { /* the API server's pool no longer followed */
    stream_cancel(&k->pool);
    k->pool.err[0] = 0;
  }
  k->from_config = 1;
  snprintf(k->group, sizeof k->group, "%s", p.group);
  snprintf(k->version, sizeof k->version, "%s", p.version);
  snprintf(from, sizeof from, " (from the config, %s)", p.where);
  pool_use(k, p.selector, p.ports, p.n_ports, from);
  return 1;
}

static void pool_list(gw_k8s *k, json_t *items) {
  if (json_array_size(items))
    pool_set(k, json_array_get(items, 0));
  else
    pool_missing(k);
}

static void pool_event(gw_k8s *k, const char *type, json_t *pool) {
  if (!strcmp(type, "DELETED"))
    pool_missing(k);
  else
    pool_set(k, pool);
}

/* --- status, start, stop ---------------------------------------------------------- */

/* Logged once per change, not per retry: an operator reads the transitions. */
static void update_status(gw_k8s *k) {
  const char *why = k->pool.err[0]       ? k->pool.err
                    : k->pool_problem[0] ? k->pool_problem
                    : !k->pool_found     ? "waiting for the first list of the InferencePool"
                    : k->pods_s.err[0]   ? k->pods_s.err
                    : !k->applied        ? "waiting for the first list of pods"
                                         : "";
  if (!strcmp(why, k->reason)) return;
  snprintf(k->reason, sizeof k->reason, "%s", why);
  if (!*why)
    gw_log(k->gw, LUPIN_LOG_INFO, "kubernetes: InferencePool %s synced: %zu endpoints", k->label,
           k->n_endpoints);
  else if (strncmp(why, "waiting", 7))
    gw_log(k->gw, LUPIN_LOG_ERROR, "kubernetes: InferencePool %s: %s", k->label, why);
}

static void stream_init(gw_k8s *k, k8s_stream *s, const char *what) {
  s->k = k;
  s->what = what;
  uv_timer_init(k->gw->loop, &s->retry);
  s->retry.data = s;
}

/* The API group's version: v1 for the GA group, v1alpha2 for the older one. */
static int pick_group(gw_k8s *k, const char *group, char *err, size_t errlen) {
  static const char *const known[][2] = {{"inference.networking.k8s.io", "v1"},
                                         {"inference.networking.x-k8s.io", "v1alpha2"}};
  for (int i = 0; i < 2; i++)
    if (!strcmp(group, known[i][0])) {
      snprintf(k->group, sizeof k->group, "%s", group);
      snprintf(k->version, sizeof k->version, "%s", known[i][1]);
      return 0;
    }
  lh_errf(err, errlen,
          "--pool-group %s: give inference.networking.k8s.io (InferencePool v1) or "
          "inference.networking.x-k8s.io (v1alpha2)",
          group);
  return -1;
}

int gw_k8s_start(lupin_gateway *gw, gw_k8s_apply_fn apply, char *err, size_t errlen) {
  const gw_options *o = &gw->opts;
  gw_k8s *k = calloc(1, sizeof *k);
  if (!k || !(k->pods = json_object())) {
    free(k);
    lh_errf(err, errlen, "out of memory");
    return -1;
  }
  k->gw = gw;
  k->apply = apply;
  gw->k8s = k;
  if (pick_group(k, o->k8s_group ? o->k8s_group : "inference.networking.k8s.io", err, errlen) ||
      gw_k8s_config_load(o->kubeconfig, &k->cfg, err, errlen))
    return -1;
  snprintf(k->ns, sizeof k->ns, "%s",
           o->k8s_namespace ? o->k8s_namespace
           : k->cfg.ns      ? k->cfg.ns
                            : "default");
  snprintf(k->name, sizeof k->name, "%s", o->k8s_pool);
  snprintf(k->label, sizeof k->label, "%s/%s", k->ns, k->name);
  if (!(k->client = gw_k8s_client_new(gw->loop, &k->cfg, err, errlen))) return -1;
  stream_init(k, &k->pool, "pool");
  stream_init(k, &k->pods_s, "pods");
  k->pool.path = pool_path;
  k->pool.on_list = pool_list;
  k->pool.on_event = pool_event;
  k->pods_s.path = pods_path;
  k->pods_s.on_list = pods_list;
  k->pods_s.on_event = pods_event;
  uv_timer_init(gw->loop, &k->apply_timer);
  k->apply_timer.data = k;
  update_status(k);
  if (pool_from_config(k)) return 0;
  gw_log(gw, LUPIN_LOG_INFO, "kubernetes: reading InferencePool %s (%s/%s) from %s:%d, %s",
         k->label, k->group, k->version, k->cfg.host, k->cfg.port, k->cfg.from);
  stream_list(&k->pool);
  return 0;
}

void gw_k8s_config_changed(lupin_gateway *gw) {
  gw_k8s *k = gw->k8s;
  if (!k || k->stopped || pool_from_config(k) || !k->from_config) return;
  k->from_config = 0; /* the config no longer holds the pool: the API server's */
  k->pool_found = 0;
  gw_log(gw, LUPIN_LOG_INFO,
         "kubernetes: the config no longer holds InferencePool %s: reading it "
         "from the API server",
         k->label);
  stream_list(&k->pool);
}

void gw_k8s_stop(lupin_gateway *gw) {
  gw_k8s *k = gw->k8s;
  if (!k || k->stopped) return;
  k->stopped = 1;
  if (!k->client) return; /* a failed start: no handle was opened */
  stream_cancel(&k->pool);
  stream_cancel(&k->pods_s);
  uv_close((uv_handle_t *)&k->pool.retry, NULL);
  uv_close((uv_handle_t *)&k->pods_s.retry, NULL);
  uv_close((uv_handle_t *)&k->apply_timer, NULL);
}

void gw_k8s_free(lupin_gateway *gw) {
  gw_k8s *k = gw->k8s;
  if (!k) return;
  gw_k8s_client_free(k->client);
  gw_k8s_config_free(&k->cfg);
  json_decref(k->pods);
  lh_buf_free(&k->pool.body);
  lh_buf_free(&k->pods_s.body);
  free(k);
  gw->k8s = NULL;
}

const char *gw_k8s_not_ready(const lupin_gateway *gw) {
  return gw->k8s && gw->k8s->reason[0] ? gw->k8s->reason : NULL;
}

void gw_k8s_metrics(lupin_gateway *gw, lh_expo *e) {
  gw_k8s *k = gw->k8s;
  if (!k || gw->worker != 0) return;
  const char *pool[] = {k->label};
  lh_expo_family(e, LH_M_K8S_SYNCED);
  lh_expo_sample(e, pool, !k->reason[0]);
  lh_expo_family(e, LH_M_K8S_ENDPOINTS);
  lh_expo_sample(e, pool, (double)k->n_endpoints);
  lh_expo_family(e, LH_M_K8S_RESTARTS);
  lh_expo_sample(e, (const char *[]){"pool"}, (double)k->pool.restarts);
  lh_expo_sample(e, (const char *[]){"pods"}, (double)k->pods_s.restarts);
  lh_expo_family(e, LH_M_K8S_ERRORS);
  for (int r = 0; r < R_REASONS; r++)
    lh_expo_sample(e, (const char *[]){reason_names[r]}, (double)k->errors[r]);
}
