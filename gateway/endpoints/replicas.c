/* Replicas: several `lupin serve` processes share what their prefix indexes
 * learn through a Redis stream (docs/replicas.md).
 *
 * Every keyed prefix record of this process reaches record_heard (the core's
 * hook, lupin_shared_on_prefix_record) on the thread that made it, which
 * appends it to a batch under the batch's lock: the only cost on the request
 * path.  The rest runs on the leader's loop, asynchronously (hiredis with its
 * libuv adapter): a timer every batchIntervalMs sends the batch with XADD
 * (MAXLEN ~ streamMaxLen) and reads what the stream has past the last entry
 * read with a non-blocking XREAD, applying other replicas' records with
 * lupin_shared_prefix_apply (which calls no hook: nothing echoes).  At most
 * one XADD and one XREAD are outstanding: a slow or absent Redis makes the
 * batch grow to maxPendingBytes, past which the oldest records are dropped
 * and counted.  A request never waits for any of it.
 *
 * An entry: v (format version), r (the replica's id), t (the microsecond
 * wall clock of its first record) and b, the packed records, each
 *   u32 age (µs after t)  u16 key length  key  u16 name length  name
 *   u32 n  n × u64 block hash, all little-endian. */
#include "endpoints/endpoints.h"

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FORMAT      "1"
#define READ_COUNT  256  /* entries per XREAD */
#define LAGS        1024 /* recent record lags kept for the quantiles */
#define BACKOFF_MIN 0.1  /* seconds before the first reconnect */
#define BACKOFF_MAX 5.0
#define WARN_EVERY  10.0 /* seconds between warnings while Redis stays down */

typedef struct rsettings {
  uint64_t enabled, batch_ms, stream_max, max_pending, timeout_ms, share_prefix;
} rsettings;

typedef struct rsetting {
  lupin_setting s;
  size_t offset; /* of its uint64_t in rsettings; SIZE_MAX: a string */
} rsetting;

#define NONE (-1)
#define INT(field, nm, d, lo, hi)                                                                  \
  { {.name = nm, .def = d, .min = lo, .max = hi}, offsetof(rsettings, field) }
#define TEXT(nm, d, pat, w)                                                                        \
  { {.name = nm, .text = d, .pattern = pat, .what = w}, SIZE_MAX }

static const rsetting settings[] = {
    INT(enabled, "enabled", 0, 0, 1),
    TEXT("address", "127.0.0.1:6379", "^%[?[%w%.%-:]+%]?:%d+$", "HOST:PORT"),
    TEXT("keyPrefix", "lupin", "^[%w%-_:%.]+$", "letters, digits, - _ : or ."),
    INT(batch_ms, "batchIntervalMs", 2, 1, 10000),
    INT(stream_max, "streamMaxLen", 10000, 10, NONE),
    INT(max_pending, "maxPendingBytes", 4 * 1024 * 1024, 4096, NONE),
    INT(timeout_ms, "timeoutMs", 1000, 10, NONE),
    INT(share_prefix, "sharePrefix", 1, 0, 1),
};

enum { N_SETTINGS = sizeof settings / sizeof *settings };

struct gw_replicas {
  lupin_gateway *gw; /* the leader */
  rsettings set;
  char host[256], stream[300], id[40];
  int port;
  /* the batch: any worker's thread appends, the leader's takes */
  pthread_mutex_t lock;
  lh_buf batch;
  double batch_t; /* wall clock of its first record, µs */
  uint64_t batch_records, dropped;
  uint64_t heard; /* records appended (under the lock) */
  /* the rest on the leader's loop */
  uv_timer_t tick;
  uv_getaddrinfo_t resolving;
  int resolving_now, stopping;
  redisAsyncContext *ac;
  int connected;
  double since; /* lupin_now() of the connect or of the command outstanding */
  double next_try, backoff, warned_at;
  uint64_t failures; /* connect failures since the last warning */
  lh_buf sending;    /* the XADD outstanding, packed */
  uint64_t sending_records;
  int xadd_out, xread_out;
  char last_id[64];
  int caught_up;
  uint64_t published, batches, applied, ignored, bad, reconnects, skipped_own;
  double lag, lags[LAGS];
  size_t n_lags;
};

/* --- settings ------------------------------------------------------------- */

int gw_replicas_declare(lupin_runtime *rt, char *err, size_t errlen) {
  lupin_setting s[N_SETTINGS];
  for (size_t i = 0; i < N_SETTINGS; i++)
    s[i] = settings[i].s;
  return lupin_runtime_declare_section(rt, "replicas", s, N_SETTINGS, err, errlen);
}

static int read_settings(lupin_gateway *gw, gw_replicas *r, char *err, size_t errlen) {
  double v[N_SETTINGS];
  char addr[300], prefix[256];
  if (lupin_runtime_section(gw->rt, "replicas", v, N_SETTINGS) ||
      lupin_runtime_section_text(gw->rt, "replicas", "address", addr, sizeof addr) ||
      lupin_runtime_section_text(gw->rt, "replicas", "keyPrefix", prefix, sizeof prefix)) {
    lh_errf(err, errlen, "replicas: no settings (the section was not declared)");
    return -1;
  }
  for (size_t i = 0; i < N_SETTINGS; i++)
    if (settings[i].offset != SIZE_MAX)
      *(uint64_t *)((char *)&r->set + settings[i].offset) = (uint64_t)v[i];
  const char *a = addr;
  if (gw->opts.redis) { /* --redis HOST:PORT: on, at that address */
    a = gw->opts.redis;
    r->set.enabled = 1;
  }
  const char *colon = strrchr(a, ':');
  size_t hl = colon ? (size_t)(colon - a) : 0;
  if (hl && a[0] == '[' && a[hl - 1] == ']') { /* [v6]:port */
    a++;
    hl -= 2;
  }
  long port = colon ? strtol(colon + 1, NULL, 10) : 0;
  if (!hl || hl >= sizeof r->host || port < 1 || port > 65535 ||
      strspn(colon + 1, "0123456789") != strlen(colon + 1)) {
    lh_errf(err, errlen,
            "%s: the Redis address must be HOST:PORT with a port from 1 to 65535, "
            "got \"%s\"",
            gw->opts.redis ? "--redis" : "replicas.address",
            gw->opts.redis ? gw->opts.redis : addr);
    return -1;
  }
  memcpy(r->host, a, hl);
  r->host[hl] = 0;
  r->port = (int)port;
  snprintf(r->stream, sizeof r->stream, "%s:prefix", prefix);
  return 0;
}

/* --- the hook: any worker's thread ------------------------------------------- */

static double wall_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void put(lh_buf *b, uint64_t v, int bytes) {
  char le[8];
  for (int i = 0; i < bytes; i++)
    le[i] = (char)(v >> (8 * i));
  lh_buf_append(b, le, (size_t)bytes);
}

static uint64_t get(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The size of the packed record at p (which holds len bytes), 0: malformed. */
static size_t record_size(const unsigned char *p, size_t len) {
  if (len < 6) return 0;
  size_t at = 4, kl = get(p + at, 2);
  at += 2 + kl;
  if (len < at + 2) return 0;
  size_t nl = get(p + at, 2);
  at += 2 + nl;
  if (len < at + 4) return 0;
  uint64_t n = get(p + at, 4);
  at += 4;
  if (n > (len - at) / 8) return 0;
  return at + (size_t)n * 8;
}

/* Drops the oldest records until the batch has room for more: counted. */
static void drop_oldest(gw_replicas *r, size_t more) {
  size_t at = 0;
  const unsigned char *p = (const unsigned char *)r->batch.data;
  while (at < r->batch.len && r->batch.len - at + more > r->set.max_pending) {
    at += record_size(p + at, r->batch.len - at);
    r->dropped++;
    r->batch_records--;
  }
  memmove(r->batch.data, r->batch.data + at, r->batch.len - at);
  r->batch.len -= at;
}

static void record_heard(void *ud, const char *key, const char *endpoint, const uint64_t *hashes,
                         size_t n) {
  gw_replicas *r = ud;
  size_t kl = strlen(key), nl = strlen(endpoint);
  if (kl > 0xffff || nl > 0xffff || n > 0xffffffffu) return;
  size_t size = 12 + kl + nl + n * 8;
  double now = wall_us();
  pthread_mutex_lock(&r->lock);
  if (size > r->set.max_pending) {
    r->dropped++;
  } else {
    if (r->batch.len + size > r->set.max_pending) drop_oldest(r, size);
    if (r->batch.len == 0) r->batch_t = now;
    double age = now - r->batch_t;
    put(&r->batch, age > 0 && age < 4e9 ? (uint64_t)age : 0, 4);
    put(&r->batch, kl, 2);
    lh_buf_append(&r->batch, key, kl);
    put(&r->batch, nl, 2);
    lh_buf_append(&r->batch, endpoint, nl);
    put(&r->batch, n, 4);
    for (size_t i = 0; i < n; i++)
      put(&r->batch, hashes[i], 8);
    r->batch_records++;
    r->heard++;
  }
  pthread_mutex_unlock(&r->lock);
}

/* --- warnings, rate-limited --------------------------------------------------- */

static void warn_down(gw_replicas *r, const char *why) {
  double now = lupin_now();
  r->failures++;
  if (r->warned_at && now - r->warned_at < WARN_EVERY) return;
  gw_log(r->gw, LUPIN_LOG_WARN,
         "replicas: Redis at %s:%d: %s (%llu failures since the last warning); routing on the "
         "local index, retrying in %.1fs",
         r->host, r->port, why, (unsigned long long)r->failures, r->backoff);
  r->warned_at = now;
  r->failures = 0;
}

/* --- the connection ------------------------------------------------------------ */

static void lost(gw_replicas *r, const char *why) {
  r->ac = NULL;
  r->connected = 0;
  r->xadd_out = r->xread_out = 0;
  r->backoff = r->backoff ? r->backoff * 2 : BACKOFF_MIN;
  if (r->backoff > BACKOFF_MAX) r->backoff = BACKOFF_MAX;
  r->next_try = lupin_now() + r->backoff;
  if (!r->stopping) warn_down(r, why);
}

static void on_connect(const redisAsyncContext *ac, int status) {
  gw_replicas *r = ac->data;
  if (status != REDIS_OK) {
    lost(r, ac->errstr[0] ? ac->errstr : "cannot connect");
    return;
  }
  r->connected = 1;
  r->backoff = 0;
  r->reconnects++;
  r->warned_at = 0;
  gw_log(r->gw, LUPIN_LOG_INFO, "replicas: connected to Redis at %s:%d, stream %s from %s", r->host,
         r->port, r->stream, r->last_id);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  gw_replicas *r = ac->data;
  if (r->ac == ac) lost(r, status == REDIS_OK ? "disconnected" : ac->errstr);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  gw_replicas *r = req->data;
  r->resolving_now = 0;
  char ip[INET6_ADDRSTRLEN] = "";
  if (status == 0 && res) {
    if (res->ai_family == AF_INET6)
      uv_ip6_name((struct sockaddr_in6 *)res->ai_addr, ip, sizeof ip);
    else
      uv_ip4_name((struct sockaddr_in *)res->ai_addr, ip, sizeof ip);
  }
  uv_freeaddrinfo(res);
  if (r->stopping) return;
  if (!ip[0]) {
    lost(r, "cannot resolve the host name");
    return;
  }
  redisAsyncContext *ac = redisAsyncConnect(ip, r->port);
  if (!ac || ac->err) {
    lost(r, ac ? ac->errstr : "out of memory");
    if (ac) redisAsyncFree(ac);
    return;
  }
  ac->data = r;
  if (redisLibuvAttach(ac, r->gw->loop) != REDIS_OK) {
    redisAsyncFree(ac);
    lost(r, "cannot watch the socket");
    return;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  r->ac = ac;
  r->since = lupin_now();
}

static void connect_now(gw_replicas *r) {
  char port[8];
  snprintf(port, sizeof port, "%d", r->port);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
  r->resolving.data = r;
  if (uv_getaddrinfo(r->gw->loop, &r->resolving, on_resolved, r->host, port, &hints) == 0)
    r->resolving_now = 1;
  else
    lost(r, "cannot resolve the host name");
}

/* --- publishing ------------------------------------------------------------------ */

/* Records lost on the leader's side: the count is the hook's too. */
static void add_dropped(gw_replicas *r, uint64_t n) {
  pthread_mutex_lock(&r->lock);
  r->dropped += n;
  pthread_mutex_unlock(&r->lock);
}

static void on_xadd(redisAsyncContext *ac, void *reply, void *priv) {
  (void)priv;
  gw_replicas *r = ac->data;
  redisReply *rep = reply;
  r->xadd_out = 0;
  if (rep && rep->type != REDIS_REPLY_ERROR) {
    r->published += r->sending_records;
    r->batches++;
  } else { /* the connection went (its records are lost) or Redis refused */
    add_dropped(r, r->sending_records);
    if (rep) warn_down(r, rep->str);
  }
  r->sending_records = 0;
}

static void publish(gw_replicas *r) {
  if (r->xadd_out) return;
  pthread_mutex_lock(&r->lock);
  lh_buf b = r->batch;
  r->batch = r->sending; /* the spent buffer back, emptied: no allocation per batch */
  r->batch.len = 0;
  r->sending = b;
  r->sending_records = r->batch_records;
  r->batch_records = 0;
  double t = r->batch_t;
  pthread_mutex_unlock(&r->lock);
  if (!r->sending.len) return;
  char maxlen[24], ts[32];
  snprintf(maxlen, sizeof maxlen, "%llu", (unsigned long long)r->set.stream_max);
  snprintf(ts, sizeof ts, "%.0f", t);
  const char *argv[] = {"XADD", r->stream, "MAXLEN", "~", maxlen, "*", "v",
                        FORMAT, "r",       r->id,    "t", ts,     "b", r->sending.data};
  size_t lens[14];
  for (int i = 0; i < 13; i++)
    lens[i] = strlen(argv[i]);
  lens[13] = r->sending.len;
  if (redisAsyncCommandArgv(r->ac, on_xadd, NULL, 14, argv, lens) == REDIS_OK) {
    r->xadd_out = 1;
    r->since = lupin_now();
  } else {
    add_dropped(r, r->sending_records);
    r->sending_records = 0;
  }
}

/* --- applying ---------------------------------------------------------------------- */

static const redisReply *field(const redisReply *kv, const char *name) {
  for (size_t i = 0; i + 1 < kv->elements; i += 2)
    if (kv->element[i]->type == REDIS_REPLY_STRING && !strcmp(kv->element[i]->str, name))
      return kv->element[i + 1];
  return NULL;
}

static void note_lag(gw_replicas *r, double seconds) {
  r->lag = seconds;
  r->lags[r->n_lags++ % LAGS] = seconds;
}

/* Checks every record of b first: an entry is applied whole or counted bad. */
static int well_formed(const unsigned char *p, size_t len) {
  for (size_t at = 0, k; at < len; at += k)
    if (!(k = record_size(p + at, len - at))) return 0;
  return len > 0;
}

static void apply_entry(gw_replicas *r, const redisReply *kv) {
  const redisReply *v = field(kv, "v"), *who = field(kv, "r"), *t = field(kv, "t"),
                   *b = field(kv, "b");
  if (!v || !who || !t || !b || v->type != REDIS_REPLY_STRING || strcmp(v->str, FORMAT) ||
      b->type != REDIS_REPLY_STRING || !well_formed((const unsigned char *)b->str, b->len)) {
    r->bad++;
    return;
  }
  if (who->type == REDIS_REPLY_STRING && !strcmp(who->str, r->id)) {
    r->skipped_own++;
    return;
  }
  double base = t->type == REDIS_REPLY_STRING ? strtod(t->str, NULL) : 0, now = wall_us();
  const unsigned char *p = (const unsigned char *)b->str;
  uint64_t hashes[1024];
  char key[0x10000], name[0x10000];
  for (size_t at = 0; at < b->len;) {
    size_t size = record_size(p + at, b->len - at), o = at + 4;
    double age = (double)get(p + at, 4);
    size_t kl = get(p + o, 2);
    memcpy(key, p + o + 2, kl);
    key[kl] = 0;
    o += 2 + kl;
    size_t nl = get(p + o, 2);
    memcpy(name, p + o + 2, nl);
    name[nl] = 0;
    o += 2 + nl;
    size_t n = get(p + o, 4);
    o += 4;
    int rc = 1;
    for (size_t done = 0; done < n && rc == 1;) { /* in slices: no allocation */
      size_t k = n - done < 1024 ? n - done : 1024;
      for (size_t i = 0; i < k; i++)
        hashes[i] = get(p + o + (done + i) * 8, 8);
      rc = lupin_shared_prefix_apply(r->gw->shared, key, name, hashes, k);
      done += k;
    }
    if (rc == 1)
      r->applied++;
    else
      r->ignored++;
    if (r->caught_up && base > 0) note_lag(r, (now - base - age) / 1e6);
    at += size;
  }
}

static void on_xread(redisAsyncContext *ac, void *reply, void *priv) {
  (void)priv;
  gw_replicas *r = ac->data;
  redisReply *rep = reply;
  r->xread_out = 0;
  if (!rep) return; /* the connection went */
  if (rep->type == REDIS_REPLY_ERROR) {
    warn_down(r, rep->str);
    return;
  }
  size_t got = 0;
  /* [[stream, [[id, [field, value, ...]], ...]]], or nil when nothing is new */
  if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
      rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 2) {
    const redisReply *entries = rep->element[0]->element[1];
    for (size_t i = 0; entries->type == REDIS_REPLY_ARRAY && i < entries->elements; i++) {
      const redisReply *e = entries->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
          e->element[0]->type != REDIS_REPLY_STRING)
        continue;
      snprintf(r->last_id, sizeof r->last_id, "%s", e->element[0]->str);
      got++;
      if (e->element[1]->type == REDIS_REPLY_ARRAY)
        apply_entry(r, e->element[1]);
      else
        r->bad++;
    }
  }
  if (got < READ_COUNT && !r->caught_up) {
    r->caught_up = 1;
    gw_log(r->gw, LUPIN_LOG_INFO, "replicas: caught up with %s at %s (%llu records applied)",
           r->stream, r->last_id, (unsigned long long)r->applied);
  }
}

static void poll_stream(gw_replicas *r) {
  if (r->xread_out) return;
  char count[16];
  snprintf(count, sizeof count, "%d", READ_COUNT);
  const char *argv[] = {"XREAD", "COUNT", count, "STREAMS", r->stream, r->last_id};
  size_t lens[6];
  for (int i = 0; i < 6; i++)
    lens[i] = strlen(argv[i]);
  if (redisAsyncCommandArgv(r->ac, on_xread, NULL, 6, argv, lens) == REDIS_OK) {
    r->xread_out = 1;
    r->since = lupin_now();
  }
}

/* --- the tick ------------------------------------------------------------------------ */

static void on_tick(uv_timer_t *t) {
  gw_replicas *r = t->data;
  double now = lupin_now();
  if (!r->ac) {
    /* no Redis: the batch waits, bounded by maxPendingBytes */
    if (!r->resolving_now && now >= r->next_try) connect_now(r);
    return;
  }
  /* a connect or a command Redis does not answer: drop the connection */
  if ((!r->connected || r->xadd_out || r->xread_out) && now - r->since > r->set.timeout_ms / 1e3) {
    redisAsyncContext *ac = r->ac;
    lost(r, r->connected ? "no answer within timeoutMs" : "connect timed out");
    redisAsyncFree(ac); /* outstanding callbacks get NULL */
    return;
  }
  if (!r->connected) return;
  publish(r);
  poll_stream(r);
}

/* --- start, stop ------------------------------------------------------------------------ */

int gw_replicas_start(lupin_gateway *gw, char *err, size_t errlen) {
  gw_replicas probe = {0};
  if (read_settings(gw, &probe, err, errlen)) return -1;
  if (!probe.set.enabled) return 0;
  gw_replicas *r = malloc(sizeof *r);
  if (!r) {
    lh_errf(err, errlen, "out of memory");
    return -1;
  }
  *r = probe;
  r->gw = gw;
  pthread_mutex_init(&r->lock, NULL);
  uint64_t a = uv_hrtime() ^ ((uint64_t)getpid() << 32), b = (uint64_t)wall_us();
  a ^= a >> 29;
  a *= 0xBF58476D1CE4E5B9ull;
  snprintf(r->id, sizeof r->id, "%016llx%08llx", (unsigned long long)a,
           (unsigned long long)(b & 0xffffffffu));
  snprintf(r->last_id, sizeof r->last_id, "0-0"); /* the retained stream first: catch up */
  uv_timer_init(gw->loop, &r->tick);
  r->tick.data = r;
  uv_timer_start(&r->tick, on_tick, 0, r->set.batch_ms);
  uv_unref((uv_handle_t *)&r->tick); /* a drain does not wait for it */
  if (r->set.share_prefix) lupin_shared_on_prefix_record(gw->shared, record_heard, r);
  gw->replicas = r;
  gw_log(gw, LUPIN_LOG_INFO, "replicas: sharing prefix records through Redis at %s:%d as %s",
         r->host, r->port, r->id);
  return 0;
}

void gw_replicas_stop(lupin_gateway *gw) {
  gw_replicas *r = gw->replicas;
  if (!r || r->stopping) return;
  r->stopping = 1;
  uv_close((uv_handle_t *)&r->tick, NULL);
  if (r->resolving_now) uv_cancel((uv_req_t *)&r->resolving);
  if (r->ac) {
    redisAsyncContext *ac = r->ac;
    r->ac = NULL;
    redisAsyncFree(ac);
  }
}

void gw_replicas_free(lupin_gateway *gw) {
  gw_replicas *r = gw->replicas;
  if (!r) return;
  lupin_shared_on_prefix_record(gw->shared, NULL, NULL); /* every worker has stopped */
  lh_buf_free(&r->batch);
  lh_buf_free(&r->sending);
  pthread_mutex_destroy(&r->lock);
  free(r);
  gw->replicas = NULL;
}

/* --- views ------------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void quantiles(const gw_replicas *r, double *p50, double *p99) {
  size_t n = r->n_lags < LAGS ? r->n_lags : LAGS;
  *p50 = *p99 = 0;
  if (!n) return;
  double sorted[LAGS];
  memcpy(sorted, r->lags, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, cmp_double);
  *p50 = sorted[n / 2];
  *p99 = sorted[n * 99 / 100];
}

static void counts(gw_replicas *r, uint64_t *dropped, uint64_t *pending) {
  pthread_mutex_lock(&r->lock);
  *dropped = r->dropped;
  *pending = r->batch_records;
  pthread_mutex_unlock(&r->lock);
}

void gw_replicas_metrics(lupin_gateway *gw, lh_expo *e) {
  gw_replicas *r = gw->replicas;
  if (!r || gw->worker != 0) return;
  uint64_t dropped, pending;
  counts(r, &dropped, &pending);
  const struct {
    lh_family_id id;
    double v;
  } rows[] = {
      {LH_M_REPLICA_CONNECTED, r->connected},     {LH_M_REPLICA_PUBLISHED, (double)r->published},
      {LH_M_REPLICA_APPLIED, (double)r->applied}, {LH_M_REPLICA_IGNORED, (double)r->ignored},
      {LH_M_REPLICA_DROPPED, (double)dropped},    {LH_M_REPLICA_BAD, (double)r->bad},
      {LH_M_REPLICA_PENDING, (double)pending},    {LH_M_REPLICA_LAG, r->lag},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    lh_expo_family(e, rows[i].id);
    lh_expo_sample(e, NULL, rows[i].v);
  }
}

void gw_replicas_admin(lupin_gateway *gw, gw_conn *c) {
  gw_replicas *r = gw->replicas;
  lh_buf b = {0};
  if (!r) {
    lh_buf_printf(&b, "{\"enabled\":false}\n");
  } else {
    uint64_t dropped, pending;
    double p50, p99;
    counts(r, &dropped, &pending);
    quantiles(r, &p50, &p99);
    lh_buf_printf(&b, "{\"enabled\":true,\"id\":\"%s\",\"address\":", r->id);
    char addr[300];
    snprintf(addr, sizeof addr, "%s:%d", r->host, r->port);
    lh_buf_json(&b, addr);
    lh_buf_printf(&b, ",\"stream\":");
    lh_buf_json(&b, r->stream);
    lh_buf_printf(&b, ",\"connected\":%s,\"caught_up\":%s,\"last_id\":\"%s\",",
                  r->connected ? "true" : "false", r->caught_up ? "true" : "false", r->last_id);
    lh_buf_printf(&b,
                  "\"batch_interval_ms\":%llu,\"stream_max_len\":%llu,\"share_prefix\":%s,"
                  "\"published\":%llu,\"batches\":%llu,\"applied\":%llu,\"ignored\":%llu,"
                  "\"dropped\":%llu,\"bad\":%llu,\"skipped_own\":%llu,\"pending\":%llu,"
                  "\"connects\":%llu,\"lag_seconds\":{\"last\":",
                  (unsigned long long)r->set.batch_ms, (unsigned long long)r->set.stream_max,
                  r->set.share_prefix ? "true" : "false", (unsigned long long)r->published,
                  (unsigned long long)r->batches, (unsigned long long)r->applied,
                  (unsigned long long)r->ignored, (unsigned long long)dropped,
                  (unsigned long long)r->bad, (unsigned long long)r->skipped_own,
                  (unsigned long long)pending, (unsigned long long)r->reconnects);
    lh_buf_number(&b, r->lag);
    lh_buf_printf(&b, ",\"p50\":");
    lh_buf_number(&b, p50);
    lh_buf_printf(&b, ",\"p99\":");
    lh_buf_number(&b, p99);
    lh_buf_printf(&b, ",\"samples\":%zu}}\n", r->n_lags < LAGS ? r->n_lags : (size_t)LAGS);
  }
  lupin_header h = {"content-type", "application/json"};
  gw_conn_respond(c, 200, &h, 1, b.data, b.len);
  lh_buf_free(&b);
}
