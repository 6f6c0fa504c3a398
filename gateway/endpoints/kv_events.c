/* The engines' KV-cache events: lupin serve subscribes to each endpoint's
 * ZMQ publisher and keeps the precise prefix index in step with what the
 * engine really holds (docs/kv-events.md).
 *
 * One thread owns every ZMQ socket (a ZMQ socket belongs to one thread)
 * and does the work: receive, check the sequence, decode (host/kv_wire.c),
 * apply (host/kv_index.c) to the keyed index in the lupin_shared, which is
 * thread-safe.  A flood of events thus costs this thread, never a
 * request.  The leader's loop only says what it wants — the current
 * generation's settings and the endpoints — under the lock, and reads the
 * counters for /metrics and /admin/kv-events.
 *
 * Each endpoint's stream is trusted only while its sequence numbers run
 * without a hole.  A hole (a batch lost, or dropped by ZMQ's high-water
 * mark under a flood) is filled from the engine's replay socket when it has
 * one; otherwise, or when the replay cannot fill it, the endpoint's blocks
 * are purged and learnt again (a resync), and the endpoint is "unsure" for
 * a while: the precise plugins score it from the approximate index.  A
 * sequence going back, or AllBlocksCleared, is an engine restarted: purge. */
#define _GNU_SOURCE /* pthread_setname_np */
#include "endpoints/endpoints.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <zmq.h>

#define POLL_MS       50   /* the longest a change of wants waits */
#define DRAIN_MAX     256  /* messages of one socket a turn: the others' turn comes */
#define HELD_MAX      4096 /* live batches held while a replay runs */
#define REPLAY_MS     500  /* a replay's deadline */
#define LAGS          1024 /* recent lags kept for the quantiles */
#define WARN_EVERY    10.0 /* seconds between warnings of one kind per endpoint */
#define RECONNECT_MS  100
#define RECONNECT_MAX 1000
/* A batch's bytes at most: decoding takes a bounded multiple of them */
#define MAX_MESSAGE (16 << 20)

/* An endpoint's own publisher and replay socket, as labels (docs/kv-events.md) */
#define LABEL_EVENTS "lupin.io/kv-events"
#define LABEL_REPLAY "lupin.io/kv-replay"

typedef struct held {
  int64_t seq;
  void *payload;
  size_t len;
} held;

typedef enum sub_state { SUB_WAITING, SUB_LIVE, SUB_REPLAYING } sub_state;

typedef struct kv_sub {
  char *name;         /* the endpoint's */
  char hostport[300]; /* address:port, as topics name it */
  char *connect, *replay_connect;
  void *sub, *dealer; /* NULL: the global socket / no replay */
  int live;           /* still wanted (the sync's mark) */
  sub_state state;
  int64_t last; /* the last sequence applied, -1: none yet */
  int64_t replay_from;
  double replay_deadline;
  held *held;
  size_t n_held;
  lh_kv_index *index;
  double unsure_until; /* wall clock */
  double warned_at;
  /* counters, under the lock */
  lh_kv_counts counts;
  uint64_t batches, bad, gaps, lost, replays_ok, replays_failed, resyncs, restarts;
  char last_bad[160];
} kv_sub;

/* The generation's settings, strings owned: the leader's wants and the
 * thread's copy it runs with (the leader frees its own at the next sync). */
typedef struct kv_conf {
  lupin_kv_events set;
  char *index_key, *hash_seed, *topic, *bind;
} kv_conf;

struct gw_kv_events {
  lupin_gateway *gw; /* the leader */
  pthread_t thread;
  int started;
  pthread_mutex_t lock;
  /* the wants, written by the leader under the lock */
  int stopping, changed;
  kv_conf want;
  struct want {
    char *name, *events, *replay; /* replay NULL: none */
    char hostport[300];
  } * wants;
  size_t n_wants;
  /* the thread's */
  kv_conf conf;
  void *ctx, *global;
  kv_sub **subs;
  size_t n_subs;
  lh_histogram lag_hist;
  double lags[LAGS];
  size_t n_lags;
  uint64_t unmatched; /* global-socket batches whose topic names no endpoint */
};

static double wall(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* --- the wants (leader) -------------------------------------------------- */

static void conf_free(kv_conf *c) {
  free(c->index_key);
  free(c->hash_seed);
  free(c->topic);
  free(c->bind);
  *c = (kv_conf){0};
}

/* 0, or -1: out of memory (c is then empty). */
static int conf_set(kv_conf *c, const lupin_kv_events *set) {
  conf_free(c);
  c->set = *set;
  c->index_key = strdup(set->index ? set->index : "");
  c->hash_seed = strdup(set->hash_seed ? set->hash_seed : "");
  c->topic = strdup(set->topic ? set->topic : "");
  c->bind = strdup(set->bind ? set->bind : "");
  if (c->index_key && c->hash_seed && c->topic && c->bind) return 0;
  conf_free(c);
  return -1;
}

static void wants_free(gw_kv_events *k) {
  for (size_t i = 0; i < k->n_wants; i++) {
    free(k->wants[i].name);
    free(k->wants[i].events);
    free(k->wants[i].replay);
  }
  free(k->wants);
  k->wants = NULL;
  k->n_wants = 0;
  conf_free(&k->want);
}

static void *run(void *ud);

static int start_thread(lupin_gateway *gw) {
  gw_kv_events *k = calloc(1, sizeof *k);
  if (!k) return -1;
  k->gw = gw;
  pthread_mutex_init(&k->lock, NULL);
  k->ctx = zmq_ctx_new();
  if (!k->ctx || pthread_create(&k->thread, NULL, run, k)) {
    if (k->ctx) zmq_ctx_term(k->ctx);
    pthread_mutex_destroy(&k->lock);
    free(k);
    return -1;
  }
  k->started = 1;
  gw->kv_events = k;
  return 0;
}

static char *tcp(const char *address, int port) {
  char buf[320];
  int v6 = strchr(address, ':') != NULL;
  snprintf(buf, sizeof buf, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", address, port);
  return strdup(buf);
}

/* Where an endpoint's engine publishes: its label LABEL_EVENTS when it has
 * one (engines sharing an address, or ports of their own), else its address
 * at the configured port; the same for the replay socket.  -1: out of
 * memory. */
static int want_of(struct want *w, const gw_endpoint *ep, const lupin_kv_events *set) {
  const char *events = lh_headers_get(&ep->labels, LABEL_EVENTS);
  const char *replay = lh_headers_get(&ep->labels, LABEL_REPLAY);
  *w = (struct want){0};
  snprintf(w->hostport, sizeof w->hostport, "%s:%d", ep->address, ep->port);
  w->name = strdup(ep->name);
  w->events = events ? strdup(events) : set->port > 0 ? tcp(ep->address, set->port) : strdup("");
  w->replay = replay                 ? strdup(replay)
              : set->replay_port > 0 ? tcp(ep->address, set->replay_port)
                                     : NULL;
  if (w->name && w->events && (w->replay || (!replay && set->replay_port <= 0))) return 0;
  free(w->name);
  free(w->events);
  free(w->replay);
  return -1;
}

void gw_kv_events_sync(lupin_gateway *gw) {
  if (gw->worker != 0 || !gw->rt) return;
  lupin_kv_events set;
  int on = lupin_runtime_kv_events(gw->rt, &set) == 1;
  if (!on && !gw->kv_events) return;
  if (!gw->kv_events && start_thread(gw)) {
    gw_log(gw, LUPIN_LOG_ERROR, "kv events: cannot start the subscriber thread");
    return;
  }
  gw_kv_events *k = gw->kv_events;
  pthread_mutex_lock(&k->lock);
  wants_free(k);
  if (on && conf_set(&k->want, &set) == 0) {
    k->wants = calloc(gw->n_endpoints ? gw->n_endpoints : 1, sizeof *k->wants);
    for (gw_endpoint *ep = gw->endpoints; ep && k->wants; ep = ep->next)
      if (want_of(&k->wants[k->n_wants], ep, &set) == 0) k->n_wants++;
  }
  k->changed = 1;
  pthread_mutex_unlock(&k->lock);
}

void gw_kv_events_stop(lupin_gateway *gw) {
  gw_kv_events *k = gw->kv_events;
  if (!k || !k->started) return;
  pthread_mutex_lock(&k->lock);
  k->stopping = 1;
  pthread_mutex_unlock(&k->lock);
  pthread_join(k->thread, NULL);
  k->started = 0;
}

void gw_kv_events_free(lupin_gateway *gw) {
  gw_kv_events *k = gw->kv_events;
  if (!k) return;
  gw_kv_events_stop(gw);
  wants_free(k);
  conf_free(&k->conf);
  zmq_ctx_term(k->ctx);
  pthread_mutex_destroy(&k->lock);
  free(k);
  gw->kv_events = NULL;
}

/* --- subscriptions (the thread) ------------------------------------------ */

static lh_kv_target target(gw_kv_events *k, kv_sub *s) {
  return (lh_kv_target){k->gw->shared, k->conf.index_key, s->name, k->conf.hash_seed,
                        (size_t)k->conf.set.block_size};
}

static void warn(gw_kv_events *k, kv_sub *s, const char *fmt, const char *what) {
  double now = wall();
  if (now - s->warned_at < WARN_EVERY) return;
  s->warned_at = now;
  gw_log(k->gw, LUPIN_LOG_WARN, fmt, s->name, what);
}

static void held_clear(kv_sub *s) {
  for (size_t i = 0; i < s->n_held; i++)
    free(s->held[i].payload);
  s->n_held = 0;
}

static void sub_free(kv_sub *s) {
  if (s->sub) zmq_close(s->sub);
  if (s->dealer) zmq_close(s->dealer);
  held_clear(s);
  free(s->held);
  lh_kv_index_free(s->index);
  free(s->name);
  free(s->connect);
  free(s->replay_connect);
  free(s);
}

/* The endpoint's blocks forgotten: the index must not keep what it can no
 * longer vouch for.  unsure: the plugins score the endpoint approximately
 * until the stream has run long enough to be trusted again. */
static void purge(gw_kv_events *k, kv_sub *s, int unsure) {
  lh_kv_target t = target(k, s);
  lh_kv_index_clear(s->index, &t);
  if (unsure && k->conf.set.unsure_seconds > 0) {
    s->unsure_until = wall() + k->conf.set.unsure_seconds;
    lupin_shared_prefix_unsure(k->gw->shared, k->conf.index_key, s->name,
                               k->conf.set.unsure_seconds);
  }
}

static void *socket_to(gw_kv_events *k, int type, const char *addr) {
  void *z = zmq_socket(k->ctx, type);
  if (!z) return NULL;
  int zero = 0, ivl = RECONNECT_MS, ivl_max = RECONNECT_MAX, one = 1;
  int hwm = (int)k->conf.set.max_pending;
  int64_t max_message = MAX_MESSAGE;
  zmq_setsockopt(z, ZMQ_MAXMSGSIZE, &max_message, sizeof max_message);
  zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(z, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
  zmq_setsockopt(z, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
  zmq_setsockopt(z, ZMQ_IPV6, &one, sizeof one);
  if (hwm > 0) zmq_setsockopt(z, ZMQ_RCVHWM, &hwm, sizeof hwm);
  if (type == ZMQ_SUB) zmq_setsockopt(z, ZMQ_SUBSCRIBE, k->conf.topic, strlen(k->conf.topic));
  int rc = addr == k->conf.bind ? zmq_bind(z, addr) : zmq_connect(z, addr);
  if (rc) {
    zmq_close(z);
    return NULL;
  }
  return z;
}

static kv_sub *sub_new(gw_kv_events *k, const struct want *w) {
  kv_sub *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->name = strdup(w->name);
  s->index = lh_kv_index_new(k->conf.set.max_blocks);
  s->held = calloc(HELD_MAX, sizeof *s->held);
  s->last = -1;
  snprintf(s->hostport, sizeof s->hostport, "%s", w->hostport);
  if (!s->name || !s->index || !s->held) goto fail;
  if (*w->events) {
    if (!(s->connect = strdup(w->events)) || !(s->sub = socket_to(k, ZMQ_SUB, s->connect)))
      goto fail;
  }
  if (w->replay) {
    if (!(s->replay_connect = strdup(w->replay)) ||
        !(s->dealer = socket_to(k, ZMQ_DEALER, s->replay_connect)))
      goto fail;
  }
  return s;
fail:
  gw_log(k->gw, LUPIN_LOG_ERROR, "kv events: cannot subscribe to %s (%s): %s", w->name, w->events,
         zmq_strerror(errno));
  sub_free(s);
  return NULL;
}

/* Whether s was made for w's sockets. */
static int same_sockets(const kv_sub *s, const struct want *w) {
  const char *replay = s->replay_connect;
  return !strcmp(s->connect ? s->connect : "", w->events) &&
         (replay && w->replay ? !strcmp(replay, w->replay) : !replay && !w->replay);
}

static kv_sub *sub_named(gw_kv_events *k, const char *name) {
  for (size_t i = 0; i < k->n_subs; i++)
    if (!strcmp(k->subs[i]->name, name)) return k->subs[i];
  return NULL;
}

/* The settings changed: every subscription starts again from nothing. */
static void drop_all(gw_kv_events *k) {
  for (size_t i = 0; i < k->n_subs; i++) {
    purge(k, k->subs[i], 0);
    sub_free(k->subs[i]);
  }
  k->n_subs = 0;
  if (k->global) zmq_close(k->global);
  k->global = NULL;
}

/* Whether subscriptions made with a and b differ. */
static int conf_differs(const kv_conf *a, const kv_conf *b) {
  if (!a->index_key || !b->index_key) return 1;
  return a->set.port != b->set.port || a->set.replay_port != b->set.replay_port ||
         a->set.block_size != b->set.block_size || a->set.max_blocks != b->set.max_blocks ||
         a->set.max_pending != b->set.max_pending || strcmp(a->index_key, b->index_key) ||
         strcmp(a->hash_seed, b->hash_seed) || strcmp(a->topic, b->topic) ||
         strcmp(a->bind, b->bind);
}

/* Under the lock: the subscriptions made to match the wants.  New settings
 * start every subscription again from nothing. */
static void apply_wants(gw_kv_events *k) {
  if (conf_differs(&k->conf, &k->want)) {
    drop_all(k);
    if (!k->want.index_key || conf_set(&k->conf, &k->want.set)) conf_free(&k->conf);
  }
  for (size_t i = 0; i < k->n_subs; i++)
    k->subs[i]->live = 0;
  kv_sub **grown = realloc(k->subs, (k->n_subs + k->n_wants + 1) * sizeof *grown);
  if (!grown) return;
  k->subs = grown;
  for (size_t i = 0; k->conf.index_key && i < k->n_wants; i++) {
    kv_sub *s = sub_named(k, k->wants[i].name);
    if (s && !same_sockets(s, &k->wants[i])) { /* re-addressed: from nothing */
      purge(k, s, 0);
      s->name[0] = 0; /* found no more; freed below */
      s = NULL;
    }
    if (!s && (s = sub_new(k, &k->wants[i]))) k->subs[k->n_subs++] = s;
    if (s) s->live = 1;
  }
  size_t kept = 0;
  for (size_t i = 0; i < k->n_subs; i++) {
    if (k->subs[i]->live) {
      k->subs[kept++] = k->subs[i];
    } else { /* gone from the pool: the core purged its blocks already */
      sub_free(k->subs[i]);
    }
  }
  k->n_subs = kept;
  if (k->conf.bind && *k->conf.bind && !k->global && kept) {
    k->global = socket_to(k, ZMQ_SUB, k->conf.bind);
    if (!k->global)
      gw_log(k->gw, LUPIN_LOG_ERROR, "kv events: cannot bind %s: %s", k->conf.bind,
             zmq_strerror(errno));
  }
}

/* --- a batch ------------------------------------------------------------- */

static void lag_seen(gw_kv_events *k, double lag) {
  if (lag < 0) lag = 0;
  lh_histogram_observe(&k->lag_hist, LH_M_KV_LAG, lag);
  k->lags[k->n_lags++ % LAGS] = lag;
}

/* The thread's work on a subscription runs under the lock, a message at a
 * time: the leader reads the same counters for /metrics. */
static void apply(gw_kv_events *k, kv_sub *s, int64_t seq, const void *payload, size_t len) {
  lh_kv_batch b;
  char err[160];
  int rc = lh_kv_decode(&b, payload, len, err, sizeof err);
  s->last = seq;
  s->batches++;
  if (rc) {
    s->bad++;
    snprintf(s->last_bad, sizeof s->last_bad, "%s", err);
    warn(k, s, "kv events from %s: a batch not understood, skipped: %s", err);
    return;
  }
  lh_kv_target t = target(k, s);
  if (lh_kv_index_apply(s->index, &t, &b, &s->counts)) {
    s->resyncs++;
    warn(k, s, "kv events from %s: %s; its blocks are learnt again", "more blocks than maxBlocks");
    purge(k, s, 1);
  } else {
    lag_seen(k, wall() - b.ts);
  }
  lh_kv_batch_free(&b);
}

static void hold(gw_kv_events *k, kv_sub *s, int64_t seq, const void *payload, size_t len) {
  void *copy = s->n_held < HELD_MAX ? malloc(len ? len : 1) : NULL;
  if (!copy) { /* the replay is too slow for this stream: give up on it */
    s->state = SUB_LIVE;
    held_clear(s);
    s->resyncs++;
    purge(k, s, 1);
    apply(k, s, seq, payload, len);
    return;
  }
  memcpy(copy, payload, len);
  s->held[s->n_held++] = (held){seq, copy, len};
}

static void replay_start(gw_kv_events *k, kv_sub *s, int64_t from) {
  unsigned char frame[8];
  for (int i = 0; i < 8; i++)
    frame[i] = (unsigned char)((uint64_t)from >> (56 - 8 * i));
  if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
      zmq_send(s->dealer, frame, 8, ZMQ_DONTWAIT) < 0) {
    s->replays_failed++;
    s->resyncs++;
    purge(k, s, 1);
    return;
  }
  s->state = SUB_REPLAYING;
  s->replay_from = from;
  s->replay_deadline = wall() + REPLAY_MS / 1e3;
}

/* The replay is over (ok: it reached its end marker): what arrived live
 * meanwhile follows, in order. */
static void replay_end(gw_kv_events *k, kv_sub *s, int ok) {
  s->state = SUB_LIVE;
  if (ok) {
    s->replays_ok++;
  } else {
    s->replays_failed++;
    s->resyncs++;
    warn(k, s, "kv events from %s: %s; its blocks are learnt again", "the replay failed");
    purge(k, s, 1);
  }
  for (size_t i = 0; i < s->n_held; i++) {
    held *h = &s->held[i];
    if (h->seq > s->last) apply(k, s, h->seq, h->payload, h->len);
  }
  held_clear(s);
}

/* A live batch of the stream: in sequence, or a hole, or a restart. */
static void on_batch(gw_kv_events *k, kv_sub *s, int64_t seq, const void *payload, size_t len) {
  if (s->state == SUB_REPLAYING) {
    hold(k, s, seq, payload, len);
    return;
  }
  if (s->state == SUB_WAITING) { /* first contact: what the engine kept of before */
    s->state = SUB_LIVE;
    if (s->dealer && seq > 0) {
      hold(k, s, seq, payload, len);
      replay_start(k, s, 0);
      return;
    }
  } else if (seq <= s->last) { /* the engine started again */
    s->restarts++;
    purge(k, s, 0);
  } else if (seq > s->last + 1) {
    s->gaps++;
    s->lost += (uint64_t)(seq - s->last - 1);
    if (s->dealer) {
      hold(k, s, seq, payload, len);
      replay_start(k, s, s->last + 1);
      return;
    }
    s->resyncs++;
    warn(k, s, "kv events from %s: %s; its blocks are learnt again", "batches lost");
    purge(k, s, 1);
  }
  apply(k, s, seq, payload, len);
}

/* A replayed batch: the next one we need, a duplicate, or past a hole the
 * engine's buffer no longer covers. */
static void on_replayed(gw_kv_events *k, kv_sub *s, int64_t seq, const void *payload, size_t len) {
  if (s->state != SUB_REPLAYING) return; /* a late answer to a replay given up */
  if (seq < 0) {
    replay_end(k, s, 1);
  } else if (seq <= s->last) {
    return;
  } else if (seq == s->last + 1 || (s->last < 0 && s->replay_from == 0)) {
    apply(k, s, seq, payload, len);
  } else {
    replay_end(k, s, 0);
  }
}

/* --- the sockets --------------------------------------------------------- */

typedef struct frames {
  zmq_msg_t m[4];
  int n;
} frames;

/* One message, every frame (at most 4 kept); 0, or -1: nothing there. */
static int recv_frames(void *z, frames *f) {
  f->n = 0;
  int more = 1;
  while (more) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, z, f->n ? 0 : ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&part);
      return f->n ? 0 : -1;
    }
    more = zmq_msg_more(&part);
    if (f->n < 4) {
      f->m[f->n++] = part;
    } else {
      zmq_msg_close(&part);
      f->n = 5; /* too many: marked, not kept */
    }
  }
  return 0;
}

static void frames_close(frames *f) {
  for (int i = 0; i < f->n && i < 4; i++)
    zmq_msg_close(&f->m[i]);
}

static void bad_frames(gw_kv_events *k, kv_sub *s, const char *why) {
  s->bad++;
  snprintf(s->last_bad, sizeof s->last_bad, "%s", why);
  warn(k, s, "kv events from %s: %s", why);
}

/* The endpoint a global socket's topic names: kv@<address:port>@<model>. */
static kv_sub *by_topic(gw_kv_events *k, const zmq_msg_t *topic) {
  const char *t = zmq_msg_data((zmq_msg_t *)topic);
  size_t n = zmq_msg_size((zmq_msg_t *)topic);
  if (n < 4 || memcmp(t, "kv@", 3)) return NULL;
  const char *at = memchr(t + 3, '@', n - 3);
  size_t len = at ? (size_t)(at - (t + 3)) : n - 3;
  for (size_t i = 0; i < k->n_subs; i++)
    if (strlen(k->subs[i]->hostport) == len && !memcmp(k->subs[i]->hostport, t + 3, len))
      return k->subs[i];
  return NULL;
}

static void read_sub(gw_kv_events *k, void *z, kv_sub *s) {
  frames f;
  for (int i = 0; i < DRAIN_MAX && recv_frames(z, &f) == 0; i++) {
    pthread_mutex_lock(&k->lock);
    kv_sub *to = s ? s : f.n >= 1 ? by_topic(k, &f.m[0]) : NULL;
    int64_t seq;
    if (!to) {
      k->unmatched++;
    } else if (f.n != 3) {
      bad_frames(k, to, "a message of other than 3 frames");
    } else if (lh_kv_seq(zmq_msg_data(&f.m[1]), zmq_msg_size(&f.m[1]), &seq) || seq < 0) {
      bad_frames(k, to, "a sequence frame of other than 8 bytes");
    } else {
      on_batch(k, to, seq, zmq_msg_data(&f.m[2]), zmq_msg_size(&f.m[2]));
    }
    pthread_mutex_unlock(&k->lock);
    frames_close(&f);
  }
}

static void read_dealer(gw_kv_events *k, kv_sub *s) {
  frames f;
  for (int i = 0; i < DRAIN_MAX && recv_frames(s->dealer, &f) == 0; i++) {
    int64_t seq;
    pthread_mutex_lock(&k->lock);
    if (f.n != 3 || zmq_msg_size(&f.m[0]) != 0 ||
        lh_kv_seq(zmq_msg_data(&f.m[1]), zmq_msg_size(&f.m[1]), &seq)) {
      bad_frames(k, s, "a replay message not [\"\", seq, payload]");
    } else {
      on_replayed(k, s, seq, zmq_msg_data(&f.m[2]), zmq_msg_size(&f.m[2]));
    }
    pthread_mutex_unlock(&k->lock);
    frames_close(&f);
  }
}

static void timers(gw_kv_events *k) {
  double now = wall();
  pthread_mutex_lock(&k->lock);
  for (size_t i = 0; i < k->n_subs; i++) {
    kv_sub *s = k->subs[i];
    if (s->state == SUB_REPLAYING && now > s->replay_deadline) replay_end(k, s, 0);
  }
  pthread_mutex_unlock(&k->lock);
}

static void *run(void *ud) {
  gw_kv_events *k = ud;
  pthread_setname_np(pthread_self(), "lupin-kv-events"); /* top and perf name it */
  zmq_pollitem_t *items = NULL;
  kv_sub **owner = NULL;
  size_t cap = 0;
  for (;;) {
    pthread_mutex_lock(&k->lock);
    if (k->stopping) {
      pthread_mutex_unlock(&k->lock);
      break;
    }
    if (k->changed) {
      k->changed = 0;
      apply_wants(k);
    }
    pthread_mutex_unlock(&k->lock);
    size_t need = 2 * k->n_subs + 1, n = 0;
    if (need > cap) {
      free(items);
      free(owner);
      items = calloc(need, sizeof *items);
      owner = calloc(need, sizeof *owner);
      cap = items && owner ? need : 0;
      if (!cap) break;
    }
    for (size_t i = 0; i < k->n_subs; i++) {
      kv_sub *s = k->subs[i];
      if (s->sub) items[n] = (zmq_pollitem_t){s->sub, 0, ZMQ_POLLIN, 0}, owner[n++] = s;
      if (s->dealer) items[n] = (zmq_pollitem_t){s->dealer, 0, ZMQ_POLLIN, 0}, owner[n++] = s;
    }
    if (k->global) items[n] = (zmq_pollitem_t){k->global, 0, ZMQ_POLLIN, 0}, owner[n++] = NULL;
    if (zmq_poll(items, (int)n, POLL_MS) > 0) {
      for (size_t i = 0; i < n; i++) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        if (!owner[i]) {
          read_sub(k, k->global, NULL);
        } else if (items[i].socket == owner[i]->dealer) {
          read_dealer(k, owner[i]);
        } else {
          read_sub(k, items[i].socket, owner[i]);
        }
      }
    }
    timers(k);
  }
  free(items);
  free(owner);
  for (size_t i = 0; i < k->n_subs; i++)
    sub_free(k->subs[i]);
  free(k->subs);
  k->subs = NULL;
  k->n_subs = 0;
  if (k->global) zmq_close(k->global);
  k->global = NULL;
  return NULL;
}

/* --- what the leader shows ------------------------------------------------ */

static const char *state_name(const kv_sub *s, double now) {
  if (s->state == SUB_REPLAYING) return "replaying";
  if (s->state == SUB_WAITING) return "waiting";
  return s->unsure_until > now ? "unsure" : "live";
}

void gw_kv_events_metrics(lupin_gateway *gw, lh_expo *e) {
  gw_kv_events *k = gw->kv_events;
  if (!k || gw->worker != 0) return;
  pthread_mutex_lock(&k->lock);
  static const char *const types[] = {"stored", "removed", "cleared",  "ignored",
                                      "orphan", "unknown", "malformed"};
  lh_expo_family(e, LH_M_KV_BLOCKS_APPLIED);
  for (size_t i = 0; i < k->n_subs; i++) {
    const lh_kv_counts *c = &k->subs[i]->counts;
    const uint64_t v[] = {c->stored,  c->removed, c->cleared,  c->ignored,
                          c->orphans, c->unknown, c->malformed};
    for (size_t j = 0; j < sizeof types / sizeof *types; j++) {
      const char *labels[] = {k->subs[i]->name, types[j]};
      lh_expo_sample(e, labels, (double)v[j]);
    }
  }
  const lh_family_id per_sub[] = {LH_M_KV_BATCHES,  LH_M_KV_BAD,     LH_M_KV_GAPS,
                                  LH_M_KV_LOST,     LH_M_KV_REPLAYS, LH_M_KV_RESYNCS,
                                  LH_M_KV_RESTARTS, LH_M_KV_BLOCKS,  LH_M_KV_STATE};
  double now = wall();
  for (size_t f = 0; f < sizeof per_sub / sizeof *per_sub; f++) {
    lh_expo_family(e, per_sub[f]);
    for (size_t i = 0; i < k->n_subs; i++) {
      const kv_sub *s = k->subs[i];
      const char *labels[] = {s->name, NULL};
      switch (per_sub[f]) {
      case LH_M_KV_BATCHES:
        lh_expo_sample(e, labels, (double)s->batches);
        break;
      case LH_M_KV_BAD:
        lh_expo_sample(e, labels, (double)s->bad);
        break;
      case LH_M_KV_GAPS:
        lh_expo_sample(e, labels, (double)s->gaps);
        break;
      case LH_M_KV_LOST:
        lh_expo_sample(e, labels, (double)s->lost);
        break;
      case LH_M_KV_REPLAYS:
        labels[1] = "ok";
        lh_expo_sample(e, labels, (double)s->replays_ok);
        labels[1] = "failed";
        lh_expo_sample(e, labels, (double)s->replays_failed);
        break;
      case LH_M_KV_RESYNCS:
        lh_expo_sample(e, labels, (double)s->resyncs);
        break;
      case LH_M_KV_RESTARTS:
        lh_expo_sample(e, labels, (double)s->restarts);
        break;
      case LH_M_KV_BLOCKS:
        lh_expo_sample(e, labels, (double)lh_kv_index_blocks(s->index));
        break;
      default:
        labels[1] = state_name(s, now);
        lh_expo_sample(e, labels, 1);
        break;
      }
    }
  }
  lh_expo_family(e, LH_M_KV_LAG);
  lh_expo_histogram(e, NULL, &k->lag_hist);
  pthread_mutex_unlock(&k->lock);
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The recent lags' quantile q, under the lock; 0 when none. */
static double lag_quantile(const gw_kv_events *k, double *sorted, double q) {
  size_t n = k->n_lags < LAGS ? k->n_lags : LAGS;
  if (!n || !sorted) return 0;
  memcpy(sorted, k->lags, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, by_value);
  return sorted[(size_t)(q * (double)(n - 1))];
}

static void sub_json(lh_buf *b, const kv_sub *s, double now) {
  const lh_kv_counts *c = &s->counts;
  lh_buf_printf(b, "{\"endpoint\":");
  lh_buf_json(b, s->name);
  lh_buf_printf(b, ",\"events\":");
  lh_buf_json(b, s->connect ? s->connect : "(the bound socket)");
  lh_buf_printf(b, ",\"replay\":");
  if (s->replay_connect) {
    lh_buf_json(b, s->replay_connect);
  } else {
    lh_buf_str(b, "null");
  }
  lh_buf_printf(b,
                ",\"state\":\"%s\",\"last_seq\":%lld,\"blocks\":%zu,\"batches\":%llu,"
                "\"stored\":%llu,\"removed\":%llu,\"cleared\":%llu,\"ignored\":%llu,"
                "\"orphans\":%llu,\"unknown\":%llu,\"malformed\":%llu,\"bad\":%llu,"
                "\"gaps\":%llu,\"lost\":%llu,\"replays\":%llu,\"replays_failed\":%llu,"
                "\"resyncs\":%llu,\"restarts\":%llu,\"last_bad\":",
                state_name(s, now), (long long)s->last, lh_kv_index_blocks(s->index),
                (unsigned long long)s->batches, (unsigned long long)c->stored,
                (unsigned long long)c->removed, (unsigned long long)c->cleared,
                (unsigned long long)c->ignored, (unsigned long long)c->orphans,
                (unsigned long long)c->unknown, (unsigned long long)c->malformed,
                (unsigned long long)s->bad, (unsigned long long)s->gaps,
                (unsigned long long)s->lost, (unsigned long long)s->replays_ok,
                (unsigned long long)s->replays_failed, (unsigned long long)s->resyncs,
                (unsigned long long)s->restarts);
  if (*s->last_bad) {
    lh_buf_json(b, s->last_bad);
  } else {
    lh_buf_str(b, "null");
  }
  lh_buf_str(b, "}");
}

void gw_kv_events_admin(lupin_gateway *gw, gw_conn *c) {
  gw_kv_events *k = gw->kv_events;
  lh_buf b = {0};
  if (!k || !k->want.index_key) {
    lh_buf_printf(&b, "{\"enabled\":false,\"endpoints\":[]}\n");
  } else {
    double *sorted = malloc(LAGS * sizeof *sorted);
    pthread_mutex_lock(&k->lock);
    lh_buf_printf(&b, "{\"enabled\":true,\"index\":");
    lh_buf_json(&b, k->want.index_key);
    lh_buf_printf(&b, ",\"block_size\":%d,\"unmatched\":%llu,\"lag_seconds\":{\"p50\":",
                  k->want.set.block_size, (unsigned long long)k->unmatched);
    lh_buf_number(&b, lag_quantile(k, sorted, 0.5));
    lh_buf_str(&b, ",\"p99\":");
    lh_buf_number(&b, lag_quantile(k, sorted, 0.99));
    lh_buf_str(&b, "},\"endpoints\":[");
    double now = wall();
    for (size_t i = 0; i < k->n_subs; i++) {
      if (i) lh_buf_str(&b, ",");
      sub_json(&b, k->subs[i], now);
    }
    lh_buf_str(&b, "]}\n");
    pthread_mutex_unlock(&k->lock);
    free(sorted);
  }
  lupin_header h = {"content-type", "application/json"};
  gw_conn_respond(c, 200, &h, 1, b.data, b.len);
  lh_buf_free(&b);
}
