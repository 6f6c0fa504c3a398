/* vLLM's KV-cache events (--kv-events-port): what vLLM's ZmqEventPublisher
 * sends, from the prefix cache's changes (kvcache.c's listener).
 *
 * Each endpoint binds a PUB socket on --kv-events-port + its index. The events
 * of one loop turn (an engine step) make one batch, sent as three frames: the
 * topic "kv@<host:port>@<model>", the batch's sequence number (8 bytes
 * big-endian, per endpoint, from 0, counting batches) and the msgpack payload
 * [ts, [events...], 0]. An event is vLLM's tagged struct, positional
 * (["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
 * lora_id, medium, lora_name]) or, with --kv-events-shape map, a map with its
 * tag under "type" and its fields by name (map-batch: the batch a map
 * {ts, events, data_parallel_rank} too, as the newest upstream declares
 * EventBatch without array_like). Block hashes are uint64 (vLLM's
 * default) or, with --kv-hash-encoding bytes, 32-byte bins whose last 8 bytes
 * are that integer, big-endian.
 *
 * With --kv-replay-port, a ROUTER socket on that port + index answers vLLM's
 * replay requests [identity, "", start_seq] with every batch kept (the last
 * --kv-buffer-steps) whose seq >= start_seq, [identity, "", seq, payload]
 * each, then [identity, "", -1, ""]. Batches dropped by
 * --kv-events-drop-rate are kept too: a gap a subscriber can heal by replay.
 * Whether a batch is dropped is a function of --seed, the endpoint and its
 * sequence number, so a run repeats the same gaps.
 *
 * ZMQ in the libuv loop: the ROUTER's ZMQ_FD is edge-triggered, so its
 * callback drains until ZMQ_EVENTS shows no input (sends included, since a
 * send can consume the edge). PUB sends never block (ZMQ_DONTWAIT; past the
 * high-water mark ZMQ drops, and a refused send is counted). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>
#include <xxhash.h>
#include <zmq.h>

#include "sim.h"

#define PUB_HWM 100000 /* vLLM's default `hwm` */

typedef struct kept_batch {
  uint64_t seq;
  char *data;
  size_t len;
} kept_batch;

struct kv_publisher {
  endpoint *ep;
  void *pub, *router;
  char topic[256];
  uv_poll_t poll; /* the ROUTER's ZMQ_FD */
  bool polling;
  msgpack_sbuffer pending; /* the events of this loop turn, packed one after another */
  msgpack_packer pk;
  uint32_t npending;
  uint64_t next_seq;
  uint64_t rng;     /* --kv-events-drop-rate: seq's draw is a function of this, --seed's */
  kept_batch *kept; /* a ring of the last --kv-buffer-steps batches */
  int kept_cap, kept_head, kept_count;
  /* counts for /metrics */
  uint64_t published, dropped, refused, events, replays, malformed;
};

/* ---- packing ------------------------------------------------------------------ */

static void pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

static void pack_hash(kv_publisher *p, uint64_t h) {
  if (!p->ep->sim->cfg.kv_hash_bytes) {
    msgpack_pack_uint64(&p->pk, h);
    return;
  }
  /* a sha256-sized digest: 24 bytes derived from h, then h big-endian */
  unsigned char b[32];
  for (int k = 0; k < 3; k++) {
    uint64_t x = XXH64(&h, sizeof h, (uint64_t)k + 1);
    for (int i = 0; i < 8; i++)
      b[k * 8 + i] = (unsigned char)(x >> (56 - 8 * i));
  }
  for (int i = 0; i < 8; i++)
    b[24 + i] = (unsigned char)(h >> (56 - 8 * i));
  msgpack_pack_bin(&p->pk, sizeof b);
  msgpack_pack_bin_body(&p->pk, b, sizeof b);
}

/* An event's head: the positional array and its tag, or the map and "type". */
static void event_begin(kv_publisher *p, const char *tag, uint32_t nfields) {
  if (p->ep->sim->cfg.kv_shape_map) {
    msgpack_pack_map(&p->pk, nfields + 1);
    pack_str(&p->pk, "type");
  } else {
    msgpack_pack_array(&p->pk, nfields + 1);
  }
  pack_str(&p->pk, tag);
  p->npending++;
  p->events++;
}

static void field(kv_publisher *p, const char *name) {
  if (p->ep->sim->cfg.kv_shape_map) pack_str(&p->pk, name);
}

static void on_stored(void *ctx, const uint64_t *hashes, int n, const uint64_t *parent,
                      const uint32_t *tokens, int lora) {
  kv_publisher *p = ctx;
  const sim_config *cfg = &p->ep->sim->cfg;
  event_begin(p, "BlockStored", 7);
  field(p, "block_hashes");
  msgpack_pack_array(&p->pk, (size_t)n);
  for (int i = 0; i < n; i++)
    pack_hash(p, hashes[i]);
  field(p, "parent_block_hash");
  if (parent)
    pack_hash(p, *parent);
  else
    msgpack_pack_nil(&p->pk);
  field(p, "token_ids");
  size_t ntok = (size_t)n * (size_t)cfg->block_size;
  msgpack_pack_array(&p->pk, ntok);
  for (size_t i = 0; i < ntok; i++)
    msgpack_pack_uint32(&p->pk, tokens[i]);
  field(p, "block_size");
  msgpack_pack_int(&p->pk, cfg->block_size);
  field(p, "lora_id"); /* vLLM's lora_int_id: adapters count from 1 */
  if (lora >= 0)
    msgpack_pack_int(&p->pk, lora + 1);
  else
    msgpack_pack_nil(&p->pk);
  field(p, "medium");
  pack_str(&p->pk, "GPU");
  field(p, "lora_name");
  if (lora >= 0)
    pack_str(&p->pk, cfg->loras[lora]);
  else
    msgpack_pack_nil(&p->pk);
}

static void on_removed(void *ctx, uint64_t hash) {
  kv_publisher *p = ctx;
  event_begin(p, "BlockRemoved", 2);
  field(p, "block_hashes");
  msgpack_pack_array(&p->pk, 1);
  pack_hash(p, hash);
  field(p, "medium");
  pack_str(&p->pk, "GPU");
}

static void on_cleared(void *ctx) { event_begin(ctx, "AllBlocksCleared", 0); }

/* ---- publishing ------------------------------------------------------------------- */

static void put_be64(unsigned char *b, uint64_t v) {
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)(v >> (56 - 8 * i));
}

static void keep(kv_publisher *p, uint64_t seq, char *data, size_t len) {
  int limit = p->ep->sim->cfg.kv_buffer_steps;
  if (p->kept_count == p->kept_cap && p->kept_cap < limit) { /* grow, oldest first */
    int cap = p->kept_cap ? p->kept_cap * 2 : 64;
    if (cap > limit) cap = limit;
    kept_batch *k = malloc((size_t)cap * sizeof *k);
    if (!k) abort();
    for (int i = 0; i < p->kept_count; i++)
      k[i] = p->kept[(p->kept_head + i) % p->kept_cap];
    free(p->kept);
    p->kept = k;
    p->kept_cap = cap;
    p->kept_head = 0;
  }
  if (p->kept_count == p->kept_cap) { /* full: forget the oldest */
    free(p->kept[p->kept_head].data);
    p->kept_head = (p->kept_head + 1) % p->kept_cap;
    p->kept_count--;
  }
  kept_batch *b = &p->kept[(p->kept_head + p->kept_count) % p->kept_cap];
  b->seq = seq;
  b->data = data;
  b->len = len;
  p->kept_count++;
}

static void forget_kept(kv_publisher *p) {
  for (int i = 0; i < p->kept_count; i++)
    free(p->kept[(p->kept_head + i) % p->kept_cap].data);
  p->kept_head = p->kept_count = 0;
}

/* One multipart message without blocking; false when ZMQ refused a frame. */
static bool send_frames(void *sock, const void *const *data, const size_t *len, int n) {
  for (int i = 0; i < n; i++)
    if (zmq_send(sock, data[i], len[i], ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0)) < 0)
      return false;
  return true;
}

static void publish(kv_publisher *p) {
  const sim_config *cfg = &p->ep->sim->cfg;
  msgpack_sbuffer out;
  msgpack_sbuffer_init(&out);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &out, msgpack_sbuffer_write);
  bool map = cfg->kv_batch_map; /* EventBatch: ts, events, data_parallel_rank */
  if (map)
    msgpack_pack_map(&pk, 3);
  else
    msgpack_pack_array(&pk, 3);
  if (map) pack_str(&pk, "ts");
  msgpack_pack_double(&pk, wall_seconds());
  if (map) pack_str(&pk, "events");
  msgpack_pack_array(&pk, p->npending);
  msgpack_sbuffer_write(&out, p->pending.data, p->pending.size);
  if (map) pack_str(&pk, "data_parallel_rank");
  msgpack_pack_int(&pk, 0);
  msgpack_sbuffer_clear(&p->pending);
  p->npending = 0;

  uint64_t seq = p->next_seq++;
  /* whether batch seq is dropped depends on --seed, the endpoint and seq only */
  uint64_t draw = p->rng + seq * 0xd1b54a32d192ed03ULL;
  if (cfg->kv_events_drop_rate > 0 && rng_unit(&draw) < cfg->kv_events_drop_rate) {
    p->dropped++;
  } else {
    unsigned char seqb[8];
    put_be64(seqb, seq);
    const void *data[] = {p->topic, seqb, out.data};
    size_t len[] = {strlen(p->topic), sizeof seqb, out.size};
    if (send_frames(p->pub, data, len, 3))
      p->published++;
    else
      p->refused++;
  }
  if (p->router) {
    size_t size = out.size;
    keep(p, seq, msgpack_sbuffer_release(&out), size);
  }
  msgpack_sbuffer_destroy(&out);
}

/* After every callback of a loop turn: each endpoint's events as one batch. */
static void on_flush(uv_check_t *h) {
  sim *s = h->data;
  for (int i = 0; i < s->cfg.endpoints; i++) {
    kv_publisher *p = s->eps[i].pub;
    if (p && p->npending) publish(p);
  }
}

/* ---- replay ----------------------------------------------------------------------- */

static void replay(kv_publisher *p, const void *id, size_t idlen, uint64_t start) {
  p->replays++;
  unsigned char seqb[8];
  for (int i = 0; i < p->kept_count; i++) {
    const kept_batch *b = &p->kept[(p->kept_head + i) % p->kept_cap];
    if (b->seq < start) continue;
    put_be64(seqb, b->seq);
    const void *data[] = {id, "", seqb, b->data};
    size_t len[] = {idlen, 0, sizeof seqb, b->len};
    if (!send_frames(p->router, data, len, 4)) return;
  }
  put_be64(seqb, UINT64_MAX); /* -1: the end */
  const void *data[] = {id, "", seqb, ""};
  size_t len[] = {idlen, 0, sizeof seqb, 0};
  send_frames(p->router, data, len, 4);
}

/* One request off the ROUTER, all its frames; false when there is none. */
static bool serve_one(kv_publisher *p) {
  zmq_msg_t f[3], extra;
  int n = 0, more = 1;
  while (more) {
    zmq_msg_t *m = n < 3 ? &f[n] : &extra;
    zmq_msg_init(m);
    if (zmq_msg_recv(m, p->router, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(m);
      break;
    }
    more = zmq_msg_more(m);
    if (n++ >= 3) zmq_msg_close(m);
  }
  if (n == 3 && zmq_msg_size(&f[2]) == 8) {
    const unsigned char *b = zmq_msg_data(&f[2]);
    uint64_t start = 0;
    for (int i = 0; i < 8; i++)
      start = start << 8 | b[i];
    replay(p, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), start);
  } else if (n > 0) {
    p->malformed++; /* vLLM logs and ignores a request of other than 3 frames */
  }
  for (int i = 0; i < n && i < 3; i++)
    zmq_msg_close(&f[i]);
  return n > 0;
}

static void on_router(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  kv_publisher *p = h->data;
  for (;;) {
    int ev = 0;
    size_t sz = sizeof ev;
    if (zmq_getsockopt(p->router, ZMQ_EVENTS, &ev, &sz) < 0 || !(ev & ZMQ_POLLIN)) break;
    if (!serve_one(p)) break;
  }
}

/* ---- sockets ------------------------------------------------------------------------ */

/* tcp://host:port; an IPv6 host in brackets, with ZMQ_IPV6 on. */
static int bind_at(void *sock, const char *host, int port) {
  char h[80];
  bool v6 = strchr(host, ':') != NULL;
  if (v6 && host[0] != '[')
    snprintf(h, sizeof h, "[%s]", host);
  else
    snprintf(h, sizeof h, "%s", host);
  int on = 1, zero = 0;
  if (v6) zmq_setsockopt(sock, ZMQ_IPV6, &on, sizeof on);
  zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
  char url[128];
  snprintf(url, sizeof url, "tcp://%s:%d", h, port);
  return zmq_bind(sock, url);
}

static int publisher_start(sim *s, endpoint *ep) {
  const sim_config *cfg = &s->cfg;
  kv_publisher *p = calloc(1, sizeof *p);
  if (!p) abort();
  ep->pub = p;
  p->ep = ep;
  p->rng = cfg->seed * 0x9e3779b97f4a7c15ULL + 0x6b76u + (uint64_t)ep->index;
  snprintf(p->topic, sizeof p->topic, "kv@%s@%s", ep->addr, cfg->model);
  msgpack_sbuffer_init(&p->pending);
  msgpack_packer_init(&p->pk, &p->pending, msgpack_sbuffer_write);

  p->pub = zmq_socket(s->zmq, ZMQ_PUB);
  int hwm = PUB_HWM;
  zmq_setsockopt(p->pub, ZMQ_SNDHWM, &hwm, sizeof hwm);
  int port = cfg->kv_events_port + ep->index;
  if (bind_at(p->pub, cfg->host, port) < 0) {
    fprintf(stderr, "lupin-sim: endpoint %d: cannot publish KV events on %s port %d: %s\n",
            ep->index, cfg->host, port, zmq_strerror(errno));
    return -1;
  }
  if (cfg->kv_replay_port) {
    p->router = zmq_socket(s->zmq, ZMQ_ROUTER);
    int unlimited = 0; /* a replay is never cut by the high-water mark */
    zmq_setsockopt(p->router, ZMQ_SNDHWM, &unlimited, sizeof unlimited);
    port = cfg->kv_replay_port + ep->index;
    if (bind_at(p->router, cfg->host, port) < 0) {
      fprintf(stderr, "lupin-sim: endpoint %d: cannot answer KV replay on %s port %d: %s\n",
              ep->index, cfg->host, port, zmq_strerror(errno));
      return -1;
    }
    int fd;
    size_t sz = sizeof fd;
    zmq_getsockopt(p->router, ZMQ_FD, &fd, &sz);
    uv_poll_init(s->loop, &p->poll, fd);
    p->poll.data = p;
    p->polling = true;
    uv_poll_start(&p->poll, UV_READABLE, on_router);
  }
  kv_listener l = {.ctx = p, .stored = on_stored, .removed = on_removed, .cleared = on_cleared};
  kv_listen(ep->kv, &l);
  return 0;
}

int kvev_start(sim *s) {
  if (!s->cfg.kv_events_port) return 0;
  s->zmq = zmq_ctx_new();
  if (!s->zmq) {
    fprintf(stderr, "lupin-sim: cannot start ZMQ: %s\n", zmq_strerror(errno));
    return -1;
  }
  uv_check_init(s->loop, &s->flush);
  s->flush.data = s;
  s->flushing = true;
  uv_check_start(&s->flush, on_flush);
  uv_unref((uv_handle_t *)&s->flush);
  for (int i = 0; i < s->cfg.endpoints; i++)
    if (publisher_start(s, &s->eps[i]) < 0) return -1;
  for (int i = 0; i < s->cfg.endpoints; i++)
    if (s->eps[i].pub && s->eps[i].pub->router) on_router(&s->eps[i].pub->poll, 0, 0);
  return 0;
}

void kvev_stop(sim *s) {
  if (s->flushing) uv_close((uv_handle_t *)&s->flush, NULL);
  s->flushing = false;
  for (int i = 0; s->eps && i < s->cfg.endpoints; i++) {
    kv_publisher *p = s->eps[i].pub;
    if (p && p->polling) uv_close((uv_handle_t *)&p->poll, NULL);
    if (p) p->polling = false;
  }
}

void kvev_free(sim *s) {
  for (int i = 0; s->eps && i < s->cfg.endpoints; i++) {
    kv_publisher *p = s->eps[i].pub;
    if (!p) continue;
    if (p->pub) zmq_close(p->pub);
    if (p->router) zmq_close(p->router);
    forget_kept(p);
    free(p->kept);
    msgpack_sbuffer_destroy(&p->pending);
    free(p);
    s->eps[i].pub = NULL;
  }
  if (s->zmq) zmq_ctx_term(s->zmq);
  s->zmq = NULL;
}

void kvev_restart(endpoint *ep) {
  kv_publisher *p = ep->pub;
  if (!p) return;
  msgpack_sbuffer_clear(&p->pending);
  p->npending = 0;
  p->next_seq = 0;
  forget_kept(p);
}

uint64_t kvev_next_seq(const endpoint *ep) { return ep->pub ? ep->pub->next_seq : 0; }

void kvev_metrics(const endpoint *ep, strbuf *out) {
  const kv_publisher *p = ep->pub;
  if (!p) return;
  sb_adds(out, "# HELP lupin_sim_kv_event_batches_total KV-event batches by outcome: published, "
               "dropped (--kv-events-drop-rate), refused (ZMQ would block).\n"
               "# TYPE lupin_sim_kv_event_batches_total counter\n");
  const char *what[] = {"published", "dropped", "refused"};
  uint64_t v[] = {p->published, p->dropped, p->refused};
  for (int i = 0; i < 3; i++)
    sb_printf(out, "lupin_sim_kv_event_batches_total{endpoint=\"%s\",result=\"%s\"} %llu.0\n",
              ep->addr, what[i], (unsigned long long)v[i]);
  sb_printf(out,
            "# HELP lupin_sim_kv_events_total KV events (BlockStored, BlockRemoved, "
            "AllBlocksCleared) put in batches.\n# TYPE lupin_sim_kv_events_total counter\n"
            "lupin_sim_kv_events_total{endpoint=\"%s\"} %llu.0\n"
            "# HELP lupin_sim_kv_replay_requests_total Replay requests answered (malformed: "
            "ignored).\n# TYPE lupin_sim_kv_replay_requests_total counter\n"
            "lupin_sim_kv_replay_requests_total{endpoint=\"%s\",result=\"ok\"} %llu.0\n"
            "lupin_sim_kv_replay_requests_total{endpoint=\"%s\",result=\"malformed\"} %llu.0\n",
            ep->addr, (unsigned long long)p->events, ep->addr, (unsigned long long)p->replays,
            ep->addr, (unsigned long long)p->malformed);
}
