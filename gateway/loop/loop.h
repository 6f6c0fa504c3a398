/* loop.h -- the lowest room of lupin serve (gateway/loop/): the worker
 * object every room shares, and what a worker's libuv loop has beneath
 * HTTP: timeouts (timer.c), socket writes (write.c), the log (log.c),
 * addresses (address.c), the workers' inboxes (inbox.c), the Lua heaps'
 * allocator (lua_heap.c).
 *
 * Rooms, top to bottom (a room calls only rooms below it;
 * spec/gateway/rooms_spec.lua holds the order): cli/ -> gateway/ (the
 * process: open, run, reload, workers) -> admin/ -> epp/ -> proxy/ -> endpoints/
 * -> http/ -> loop/ -> host/ (liblupin-host.a) -> core/lupin.h.  What a
 * lower room must ask of a higher one goes through the callbacks in
 * lupin_gateway (check_drained, reload), set by gateway.c.
 *
 * One gateway object owns everything of one worker: the runtime, the loop's
 * handles, the endpoints and their upstream pools, the listener, the stats.
 * There is no global mutable state.  A worker runs on one libuv loop, one
 * thread; with several workers (workers.c) the first one, the leader, also
 * owns what the process has once: the admin listener, the signals, the
 * watches and the scrapes, whose results it hands to the others. */
#ifndef LUPIN_GW_LOOP_H
#define LUPIN_GW_LOOP_H

#include "lupin.h"
#include "lupin_host.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <strings.h>

#include <uv.h>

typedef struct lupin_gateway lupin_gateway;
typedef struct gw_endpoint gw_endpoint;
typedef struct gw_server gw_server;
typedef struct gw_conn gw_conn;
typedef struct gw_upstream gw_upstream;
typedef struct gw_uconn gw_uconn;
typedef struct gw_exchange gw_exchange;
typedef struct gw_workers gw_workers;
typedef struct gw_inbox gw_inbox;
typedef struct gw_objective gw_objective;
typedef struct gw_watch gw_watch;

/* --- timeouts pushed back by a store (timer.c) ---------------------------- */

/* A timeout that moves at every request and every piece read: restarting a
 * libuv timer each time is a removal from its heap and an insertion.  The
 * deadline moves in a field; the libuv timer, armed for the earliest
 * deadline it was given, finds on firing whether it has moved since and
 * re-arms for what is left.  handle comes first: callbacks get &handle, and
 * its data is the owner's. */
typedef struct gw_timer {
  uv_timer_t handle;
  uint64_t due; /* loop time (ms) of the deadline, while pending */
  int pending;
  uv_timer_cb cb;
} gw_timer;

void gw_timer_init(uv_loop_t *loop, gw_timer *t, void *data);
/* cb runs once, ms from now, unless set again (to a new deadline) or cleared */
void gw_timer_set(gw_timer *t, uv_timer_cb cb, uint64_t ms);
void gw_timer_clear(gw_timer *t);

/* --- writing to sockets (write.c) ----------------------------------------- */

/* Called for a write that had to be queued, once its bytes have left (or
 * failed); never for a write the socket took at once. */
typedef void (*gw_written_fn)(uv_stream_t *s, int status, void *data);
/* Writes the parts in order: at once as far as the socket takes them, the
 * rest copied and queued.  Returns 0 or a libuv error (nothing queued). */
int gw_write(uv_stream_t *s, const uv_buf_t *parts, unsigned n, gw_written_fn cb, void *data);
/* The same without the copy (at most 4 parts): what the socket does not take
 * is queued by reference, so the caller keeps the bytes until cb has run or
 * the stream is closed (libuv reads none of them after uv_close).  For
 * request bodies, which a copy would double. */
int gw_write_kept(uv_stream_t *s, const uv_buf_t *parts, unsigned n, gw_written_fn cb, void *data);

/* --- settings (the config's "gateway" section, lua/lupin/config/) ------------- */

/* the host library's (host/settings.c), every setting a uint64_t */
typedef lh_settings gw_settings;

/* --- the gateway object (gateway.c) --------------------------------------- */

typedef struct gw_stats {
  uint64_t by_status[600];
  uint64_t by_outcome[16]; /* by lupin_outcome */
  lh_histogram sched;      /* lupin_scheduling_seconds */
  lh_histogram sched_epp;  /* the same times in the EPP's buckets */
} gw_stats;

typedef struct gw_options {
  const char *config;
  const char *listen;
  const char *admin;
  const char *admin_token;
  const char *endpoints_file;
  int log_level;
  int log_json;               /* --log-format json: diagnostics as JSON lines */
  int no_watch;               /* --no-watch: no reload on config or plugin file changes */
  const char *max_lua_memory; /* --max-lua-memory: overrides maxLuaMemoryBytes */
  int admin_insecure;         /* --admin-insecure: a non-loopback admin without a token */
  const char *resolve[16];    /* --resolve NAME=ADDR[,ADDR...] */
  int n_resolve;
  const char *workers; /* --workers N|auto: overrides gateway.workers */
  const char *redis;   /* --redis HOST:PORT: replicas on, at that address */
  /* lupin epp (epp/): the ext_proc and gRPC health addresses; set, the
   * gateway serves them instead of the HTTP listener */
  const char *grpc;
  const char *grpc_health;
  int metrics_open; /* /metrics, /healthz, /readyz with no token (lupin epp) */
  /* endpoints from Kubernetes (endpoints/k8s_pool.c): the InferencePool's
   * name, its namespace (NULL: the in-cluster or kubeconfig context's, else
   * "default"), its API group (NULL: inference.networking.k8s.io, v1;
   * inference.networking.x-k8s.io: v1alpha2), the kubeconfig (NULL: as
   * kubectl looks for one) */
  const char *k8s_pool, *k8s_namespace, *k8s_group, *kubeconfig;
} gw_options;

/* Reloads and their outcome, for /metrics. */
typedef struct gw_reload_stats {
  uint64_t ok, error;
  double seconds_sum, last_seconds;
} gw_reload_stats;

/* What the caps count for the whole process, whichever worker holds it
 * (__atomic builtins): the leader's, every follower points at it. */
typedef struct gw_totals {
  size_t in_flight;    /* requests handed to the proxy and not yet answered */
  uint64_t body_bytes; /* request body bytes held */
  size_t series;       /* model series begun (GW_MAX_MODELS bounds them) */
} gw_totals;

struct lupin_gateway {
  uv_loop_t *loop;
  /* Every socket reads into this one buffer: each read callback consumes
   * its bytes before it returns, and reads never nest. */
  char read_buf[65536];
  lupin_runtime *rt;
  gw_options opts;
  gw_settings set;
  gw_server *server, *admin;
  char **routes; /* the API routes proxied (proxy.c) */
  size_t n_routes;
  gw_endpoint *endpoints;
  size_t n_endpoints;
  uv_fs_event_t *watch;
  uv_timer_t *rewatch;      /* debounces file events */
  gw_watch *watches;        /* config and plugin directories (watch.c) */
  uv_timer_t *reload_timer; /* debounces them into one reload */
  gw_reload_stats reloads;
  uv_signal_t *sigterm, *sigint, *sighup;
  uv_timer_t *drain_timer;
  uv_prepare_t *collector; /* paces the Lua collector between requests, writes the access log */
  int draining;
  gw_exchange *exchanges; /* live proxied requests, newest first */
  size_t n_exchanges;
  size_t n_upstreams; /* live upstream exchanges (scrapes included) */
  /* ended exchanges kept, buffers and all, for the next ones (upstream.c) */
  gw_upstream *spare_upstreams;
  size_t n_spare_upstreams;
  gw_exchange *spare_exchanges; /* the same for exchanges (proxy.c) */
  size_t n_spare_exchanges;
  lh_buf access_log;        /* lines this loop iteration ended, not written yet */
  size_t n_retrying;        /* exchanges on a second or later attempt (the retry budget) */
  uint64_t retries_denied;  /* retries the budget refused */
  uv_timer_t *health_timer; /* health.c */
  unsigned health_ticks;
  int no_healthy;       /* "no healthy endpoint" was logged */
  uint64_t ended_at_gc; /* requests ended at the last idle collection */
  int heap_releases;    /* ticks left that give freed memory back (lua_heap.c) */
  gw_stats stats;
  gw_objective *objectives;        /* by model, for the EPP's request families */
  struct gw_flow_wait *flow_waits; /* flow.c: wait histograms by band and outcome */
  size_t n_flow_waits;
  size_t n_objectives;
  int exit_code;
  int serving;      /* every part of the start succeeded: the loop may serve */
  int admin_closed; /* off loopback with no token: only metrics_open's routes */
  /* memory bounds (server.c): requests handed to the proxy and not yet
   * answered, request body bytes held (this worker's: the caps apply to
   * *totals), requests refused by each cap */
  gw_totals own_totals, *totals;
  size_t in_flight;
  uint64_t body_bytes;
  uint64_t refused_in_flight, refused_body_bytes;
  uint64_t empty_endpoints_kept; /* empty endpoints lists not applied (leader) */
  lh_explain_ring *explain_ring; /* proxy/explain.c: the leader's, shared */
  /* workers (workers.c): this one's index, 0 for the leader */
  int worker;
  gw_workers *workers;
  gw_inbox *inbox;
  lupin_shared *shared; /* given to the runtime */
  /* what lower rooms ask of the process (gateway.c sets them): a drain
   * waits for the last request or connection to end; admin's reload */
  void (*check_drained)(lupin_gateway *gw);
  int (*reload)(lupin_gateway *gw, const char *why, char *err, size_t errlen, uint64_t *generation,
                double *seconds);
  struct gw_replicas *replicas;   /* replicas.c: the leader's, NULL when off */
  struct gw_epp *epp;             /* epp/rpc.c: lupin epp's gRPC server, NULL for serve */
  struct gw_k8s *k8s;             /* k8s_pool.c: the leader's, NULL when off */
  struct gw_kv_events *kv_events; /* kv_events.c: the leader's, NULL until asked for */
  struct gw_tokenize *tokenize;   /* tokenize.c: the leader's */
};

/* Called when a request or a connection ends: a drain waits for the last. */
static inline void gw_check_drained(lupin_gateway *gw) {
  if (gw->check_drained) gw->check_drained(gw);
}

/* --- the log (log.c) -------------------------------------------------------- */

void gw_log(lupin_gateway *gw, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

enum {
  GW_EXIT_OK = 0,
  GW_EXIT_CONFIG = 1, /* config, plugins or endpoints rejected */
  GW_EXIT_USAGE = 2,  /* bad command line */
  GW_EXIT_START = 3,  /* serve could not start: address in use, no permission */
  GW_EXIT_DRAIN = 4,  /* requests still in flight were cut at drainTimeoutMs */
};

/* --- addresses (address.c) ------------------------------------------------ */

/* host (an IP or a name) and port to its first socket address; -1 when unknown. */
int gw_resolve(const char *host, int port, struct sockaddr_storage *out);
/* Every address of host (each once, at most max; --resolve pins first);
 * returns how many, 0 when unknown.  Blocking: start-up and re-reads only. */
int gw_resolve_all(const gw_options *o, const char *host, int port, struct sockaddr_storage *out,
                   int max);
/* "ip:port" or "[ip6]:port". */
int gw_addr_name(const struct sockaddr_storage *ss, char *out, size_t len);
/* An IP literal (no lookup) to an address; -1 when host is a name. */
int gw_addr_literal(const char *host, int port, struct sockaddr_storage *out);
int gw_addr_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
/* Appends ai's addresses not in out[0..n) (at most max); returns the count. */
int gw_addr_list(const struct addrinfo *ai, int port, struct sockaddr_storage *out, int n, int max);
/* --resolve's addresses for host (at most max); -1 when it is not pinned. */
int gw_addr_pinned(const gw_options *o, const char *host, int port, struct sockaddr_storage *out,
                   int max);

/* --- the workers' inboxes (inbox.c, docs/workers.md) ------------------------ */

/* A task run on a worker's loop thread. */
typedef void (*gw_task_fn)(lupin_gateway *gw, void *arg);
size_t gw_workers_count(const lupin_gateway *gw);
/* Runs fn on every worker's thread in turn, the leader's first, and waits
 * for each: the admin API's way to read a follower's runtime and stats.
 * Only from the leader's thread.  Workers that stopped are skipped. */
void gw_workers_each(lupin_gateway *leader, gw_task_fn fn, void *arg);
/* Queues fn on every worker but `from` (any worker) without waiting; the
 * tasks run on their workers' threads.  drop(arg) frees arg after the last
 * one ran or was dropped (NULL: nothing to free).  Never waits: a follower
 * may post to the leader. */
void gw_workers_post(lupin_gateway *from, gw_task_fn fn, void *arg, void (*drop)(void *));
/* A follower's inbox, closed when its loop ends (shutdown_all). */
int gw_inbox_open(lupin_gateway *gw, char *err, size_t errlen);
void gw_inbox_close(lupin_gateway *gw);

/* The workers' own state: inbox.c posts through it, workers.c starts and
 * joins the threads. */
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

#endif
