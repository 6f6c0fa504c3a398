/* bench-kv-publish: a fake vLLM engine for the KV-events benchmark
 * (bench/kv_events/README.md).
 *
 * Binds a ZMQ publisher and sends synthetic, valid event batches in vLLM's
 * wire format (docs/kv-events.md): three frames, topic / 8-byte big-endian
 * sequence (one per batch, from 0) / msgpack [ts, [events...], dp_rank].
 *
 * The events are what a busy engine's look like to a subscriber: chains of
 * BlockStored (a chain's first event has no parent, each next one names the
 * previous event's last block), and BlockRemoved of blocks of chains already
 * finished, so no later event names a removed block as its parent (that
 * would make lupin count an orphan instead of a block stored).  About 63% of
 * the events store and 37% remove, more removals once --resident blocks are
 * held, so the engine's cache stays bounded as a real one does.
 *
 * --restart-after N: after N events the sequence starts again at 0, with
 * AllBlocksCleared first, as a restarted engine's (its chains forgotten).
 * --gap-after N: after N events one sequence number is skipped, as a batch
 * lost.  Each prints a line `restart_at=` / `gap_at=` with the wall clock,
 * so a script can time how long the subscriber takes to heal.
 *
 * The socket is an XPUB (a PUB that also reports subscriptions): it waits
 * for the first subscriber before sending, then --settle-ms more, because a
 * PUB drops what it sends before a subscriber has joined (the slow
 * joiner).  Its send high-water mark is unlimited: the publisher never
 * drops; whatever is lost, the subscriber lost.
 *
 * Prints key=value lines on stdout: what it sent (events, batches, blocks
 * stored and removed), in how many seconds. */
#include <errno.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define P_REMOVE  0.37 /* the share of removals while under --resident */
#define CHAIN_MAX 8    /* stored events a chain grows to, at most */
#define TOKEN_IDS 128000

typedef struct options {
  int port;
  double rate; /* events/s, 0: as fast as possible */
  uint64_t events;
  int per_batch, blocks;
  int map;                           /* the map shape (vLLM >= 0.26) instead of positional arrays */
  uint64_t restart_after, gap_after; /* 0: never */
  size_t resident;
  int block_size;
  int wait_ms, settle_ms;
  const char *topic;
  uint64_t seed;
} options;

/* The blocks of finished chains, oldest first: what removals take. */
typedef struct fifo {
  uint64_t *h;
  size_t cap, head, n; /* cap a power of two */
} fifo;

typedef struct engine {
  uint64_t rng, next_hash;
  uint64_t parent; /* the chain's last block; has_parent 0: a chain starts */
  int has_parent, chain_left;
  uint64_t *chain; /* the current chain's blocks, removable once it ends */
  size_t n_chain, cap_chain;
  fifo old;
  uint64_t stored, removed, cleared; /* blocks; cleared: events */
} engine;

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double mono(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static double uniform(engine *e) { return (double)(splitmix(&e->rng) >> 11) / 9007199254740992.0; }

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n);
  if (!p) {
    fprintf(stderr, "bench-kv-publish: out of memory\n");
    exit(1);
  }
  return p;
}

static void fifo_push(fifo *f, uint64_t h) {
  if (f->n == f->cap) { /* grow, keeping the order: unwrap into the new room */
    size_t cap = f->cap ? 2 * f->cap : 1024;
    uint64_t *n = xrealloc(NULL, cap * sizeof *n);
    for (size_t i = 0; i < f->n; i++)
      n[i] = f->h[(f->head + i) & (f->cap - 1)];
    free(f->h);
    f->h = n, f->cap = cap, f->head = 0;
  }
  f->h[(f->head + f->n++) & (f->cap - 1)] = h;
}

static uint64_t fifo_pop(fifo *f) {
  uint64_t h = f->h[f->head];
  f->head = (f->head + 1) & (f->cap - 1);
  f->n--;
  return h;
}

/* The current chain ends: its blocks may now be removed. */
static void chain_end(engine *e) {
  for (size_t i = 0; i < e->n_chain; i++)
    fifo_push(&e->old, e->chain[i]);
  e->n_chain = 0;
  e->has_parent = 0;
}

/* A restarted engine holds nothing and remembers no chain. */
static void engine_forget(engine *e) {
  e->n_chain = 0;
  e->has_parent = 0;
  e->chain_left = 0;
  e->old.n = e->old.head = 0;
}

static void pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

/* Starts an event: its tag, then in the map shape each field's name comes
 * before its value (key() is a no-op in the array shape). */
static void event_begin(msgpack_packer *pk, const options *o, const char *type, size_t fields) {
  if (o->map) {
    msgpack_pack_map(pk, fields + 1);
    pack_str(pk, "type");
  } else {
    msgpack_pack_array(pk, fields + 1);
  }
  pack_str(pk, type);
}

static void key(msgpack_packer *pk, const options *o, const char *name) {
  if (o->map) pack_str(pk, name);
}

static void pack_stored(engine *e, msgpack_packer *pk, const options *o) {
  if (e->chain_left == 0) {
    chain_end(e);
    e->chain_left = 1 + (int)(splitmix(&e->rng) % CHAIN_MAX);
  }
  e->chain_left--;
  uint64_t first = e->next_hash;
  event_begin(pk, o, "BlockStored", o->map ? 7 : 6);
  key(pk, o, "block_hashes");
  msgpack_pack_array(pk, (size_t)o->blocks);
  for (int i = 0; i < o->blocks; i++)
    msgpack_pack_uint64(pk, splitmix(&(uint64_t){first + (uint64_t)i}));
  key(pk, o, "parent_block_hash");
  if (e->has_parent) {
    msgpack_pack_uint64(pk, e->parent);
  } else {
    msgpack_pack_nil(pk);
  }
  key(pk, o, "token_ids");
  msgpack_pack_array(pk, (size_t)o->blocks * (size_t)o->block_size);
  for (int i = 0; i < o->blocks * o->block_size; i++)
    msgpack_pack_uint32(pk, (uint32_t)(splitmix(&e->rng) % TOKEN_IDS));
  key(pk, o, "block_size");
  msgpack_pack_int(pk, o->block_size);
  key(pk, o, "lora_id");
  msgpack_pack_nil(pk);
  key(pk, o, "medium");
  pack_str(pk, "GPU");
  if (o->map) { /* required in the map shape even when nil */
    key(pk, o, "lora_name");
    msgpack_pack_nil(pk);
  }
  /* the hashes again, for the chain (cheaper than keeping them above) */
  if (e->n_chain + (size_t)o->blocks > e->cap_chain) {
    e->cap_chain = 2 * (e->n_chain + (size_t)o->blocks);
    e->chain = xrealloc(e->chain, e->cap_chain * sizeof *e->chain);
  }
  for (int i = 0; i < o->blocks; i++)
    e->chain[e->n_chain++] = splitmix(&(uint64_t){first + (uint64_t)i});
  e->next_hash += (uint64_t)o->blocks;
  e->parent = e->chain[e->n_chain - 1];
  e->has_parent = 1;
  e->stored += (uint64_t)o->blocks;
}

static void pack_removed(engine *e, msgpack_packer *pk, const options *o) {
  size_t n = e->old.n < (size_t)o->blocks ? e->old.n : (size_t)o->blocks;
  event_begin(pk, o, "BlockRemoved", 2);
  key(pk, o, "block_hashes");
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++)
    msgpack_pack_uint64(pk, fifo_pop(&e->old));
  key(pk, o, "medium");
  pack_str(pk, "GPU");
  e->removed += n;
}

static void pack_cleared(engine *e, msgpack_packer *pk, const options *o) {
  event_begin(pk, o, "AllBlocksCleared", 0);
  e->cleared++;
}

/* One event: a removal when there are finished chains to take from and the
 * dice say so (always past --resident), else a block stored. */
static void pack_event(engine *e, msgpack_packer *pk, const options *o) {
  size_t held = e->old.n + e->n_chain;
  int remove = e->old.n > 0 && (held >= o->resident || uniform(e) < P_REMOVE);
  if (remove) {
    pack_removed(e, pk, o);
  } else {
    pack_stored(e, pk, o);
  }
}

typedef struct publisher {
  void *ctx, *sock;
  msgpack_sbuffer events, batch;
  uint64_t seq, batches, sent;
  int restarted, gapped;
} publisher;

/* Sends the events packed (n of them) as one batch, ts the wall clock now. */
static int send_batch(publisher *p, const options *o, size_t n) {
  msgpack_packer pk;
  unsigned char seq[8];
  msgpack_sbuffer_clear(&p->batch);
  msgpack_packer_init(&pk, &p->batch, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_double(&pk, wall());
  msgpack_pack_array(&pk, n);
  msgpack_sbuffer_write(&p->batch, p->events.data, p->events.size);
  msgpack_pack_int(&pk, 0); /* data_parallel_rank */
  for (int i = 0; i < 8; i++)
    seq[i] = (unsigned char)(p->seq >> (56 - 8 * i));
  if (zmq_send(p->sock, o->topic, strlen(o->topic), ZMQ_SNDMORE) < 0 ||
      zmq_send(p->sock, seq, 8, ZMQ_SNDMORE) < 0 ||
      zmq_send(p->sock, p->batch.data, p->batch.size, 0) < 0) {
    fprintf(stderr, "bench-kv-publish: send: %s\n", zmq_strerror(errno));
    return -1;
  }
  msgpack_sbuffer_clear(&p->events);
  p->seq++;
  p->batches++;
  return 0;
}

/* Binds the XPUB and waits for a subscriber (at most --wait-ms), then
 * --settle-ms. */
static int publisher_open(publisher *p, const options *o) {
  char addr[64];
  int hwm = 0, linger = 2000, timeout = o->wait_ms;
  snprintf(addr, sizeof addr, "tcp://127.0.0.1:%d", o->port);
  p->ctx = zmq_ctx_new();
  p->sock = p->ctx ? zmq_socket(p->ctx, ZMQ_XPUB) : NULL;
  if (!p->sock) goto fail;
  zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(p->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(p->sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
  if (zmq_bind(p->sock, addr)) goto fail;
  char sub[256];
  if (zmq_recv(p->sock, sub, sizeof sub, 0) < 0)
    fprintf(stderr, "bench-kv-publish: no subscriber within %d ms; sending anyway\n", o->wait_ms);
  struct timespec settle = {o->settle_ms / 1000, (long)(o->settle_ms % 1000) * 1000000L};
  nanosleep(&settle, NULL);
  msgpack_sbuffer_init(&p->events);
  msgpack_sbuffer_init(&p->batch);
  return 0;
fail:
  fprintf(stderr, "bench-kv-publish: cannot bind %s: %s\n", addr, zmq_strerror(errno));
  return -1;
}

/* Waits until the batch after `events_before` events is due at --rate (open loop: a batch
 * late is sent at once, the ones after keep their times). */
static void pace(const options *o, double t0, uint64_t events_before) {
  if (o->rate <= 0) return;
  double due = t0 + (double)events_before / o->rate, now = mono();
  if (due <= now) return;
  double d = due - now;
  struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
  nanosleep(&ts, NULL);
}

/* What happens before the batch that starts with event number `at`: the
 * restart and the gap, each once, when its turn has come. */
static void incidents(publisher *p, engine *e, msgpack_packer *pk, const options *o, uint64_t at,
                      size_t *n) {
  if (o->restart_after && at >= o->restart_after && !p->restarted) {
    p->restarted = 1;
    p->seq = 0;
    engine_forget(e);
    pack_cleared(e, pk, o);
    (*n)++;
    printf("restart_at=%.6f events=%llu\n", wall(), (unsigned long long)at);
  }
  if (o->gap_after && at >= o->gap_after && !p->gapped) {
    p->gapped = 1;
    printf("gap_at=%.6f events=%llu skipped_seq=%llu\n", wall(), (unsigned long long)at,
           (unsigned long long)p->seq++);
  }
  fflush(stdout);
}

static int run(const options *o) {
  publisher p = {0};
  engine e = {.rng = o->seed, .next_hash = o->seed << 32};
  if (publisher_open(&p, o)) return 1;
  msgpack_packer pk;
  msgpack_packer_init(&pk, &p.events, msgpack_sbuffer_write);
  double t0 = mono(), w0 = wall();
  uint64_t done = 0;
  while (done < o->events) {
    size_t n = 0;
    uint64_t before = done;
    incidents(&p, &e, &pk, o, done, &n);
    for (; (int)n < o->per_batch && done < o->events; n++, done++)
      pack_event(&e, &pk, o);
    pace(o, t0, before);
    if (send_batch(&p, o, n)) return 1;
    p.sent += n;
  }
  double secs = mono() - t0;
  printf("sent events=%llu batches=%llu stored_blocks=%llu removed_blocks=%llu cleared=%llu "
         "resident=%zu first_wall=%.6f last_wall=%.6f seconds=%.3f events_per_s=%.0f\n",
         (unsigned long long)p.sent, (unsigned long long)p.batches, (unsigned long long)e.stored,
         (unsigned long long)e.removed, (unsigned long long)e.cleared, e.old.n + e.n_chain, w0,
         w0 + secs, secs, secs > 0 ? (double)p.sent / secs : 0);
  fflush(stdout);    /* a script waits for this line, not for the linger below */
  zmq_close(p.sock); /* lingers up to 2 s for what is still queued */
  zmq_ctx_term(p.ctx);
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench-kv-publish [--port 5557] [--rate 0 (events/s, 0: flat out)]\n"
          "  [--events 100000] [--events-per-batch 64] [--blocks-per-event 4]\n"
          "  [--shape array|map] [--restart-after N] [--gap-after N] [--resident 100000]\n"
          "  [--block-size 16] [--topic ''] [--wait-ms 5000] [--settle-ms 300] [--seed 1]\n");
}

/* 0, or -1: a flag unknown or without its value. */
static int parse(options *o, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return -1;
    i++;
    if (!strcmp(f, "--port"))
      o->port = atoi(v);
    else if (!strcmp(f, "--rate"))
      o->rate = atof(v);
    else if (!strcmp(f, "--events"))
      o->events = strtoull(v, NULL, 10);
    else if (!strcmp(f, "--events-per-batch"))
      o->per_batch = atoi(v);
    else if (!strcmp(f, "--blocks-per-event"))
      o->blocks = atoi(v);
    else if (!strcmp(f, "--shape"))
      o->map = !strcmp(v, "map");
    else if (!strcmp(f, "--restart-after"))
      o->restart_after = strtoull(v, NULL, 10);
    else if (!strcmp(f, "--gap-after"))
      o->gap_after = strtoull(v, NULL, 10);
    else if (!strcmp(f, "--resident"))
      o->resident = strtoull(v, NULL, 10);
    else if (!strcmp(f, "--block-size"))
      o->block_size = atoi(v);
    else if (!strcmp(f, "--topic"))
      o->topic = v;
    else if (!strcmp(f, "--wait-ms"))
      o->wait_ms = atoi(v);
    else if (!strcmp(f, "--settle-ms"))
      o->settle_ms = atoi(v);
    else if (!strcmp(f, "--seed"))
      o->seed = strtoull(v, NULL, 10);
    else
      return -1;
    if (!strcmp(f, "--shape") && strcmp(v, "map") && strcmp(v, "array")) return -1;
  }
  return o->port > 0 && o->per_batch > 0 && o->blocks > 0 && o->block_size > 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  options o = {.port = 5557,
               .events = 100000,
               .per_batch = 64,
               .blocks = 4,
               .resident = 100000,
               .block_size = 16,
               .wait_ms = 5000,
               .settle_ms = 300,
               .topic = "",
               .seed = 1};
  if (parse(&o, argc, argv)) {
    usage();
    return 2;
  }
  return run(&o);
}
