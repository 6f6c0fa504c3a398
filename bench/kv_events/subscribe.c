/* bench-kv-subscribe: a plain subscriber for the KV-events benchmark
 * (bench/kv_events/README.md).
 *
 * Checks bench-kv-publish alone, without lupin: connects a ZMQ SUB,
 * receives vLLM's three frames, unpacks each payload with msgpack-c and
 * counts what a subscriber would (batches, events, blocks stored and
 * removed, clears, sequence gaps and restarts, malformed messages, the lag
 * from the batch's ts).  Its rate and CPU time are a floor for lupin's: the
 * wire and msgpack alone, no index.
 *
 * Stops after --batches N, or when nothing has arrived for --idle-ms once
 * something has.  Prints key=value pairs on stdout. */
#include <errno.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <zmq.h>

#define LAGS 65536 /* the last lags kept for the quantiles */

typedef struct counts {
  uint64_t batches, events, stored, removed, cleared, gaps, lost, restarts, bad;
  int64_t last; /* the last sequence, -1: none */
  double lags[LAGS];
  size_t n_lags;
} counts;

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_seconds(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

/* The string o is, or NULL. */
static int str_is(const msgpack_object *o, const char *s) {
  return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
         !memcmp(o->via.str.ptr, s, o->via.str.size);
}

/* An event's tag and its block hashes, in either shape; -1: not vLLM's. */
static int event_parts(const msgpack_object *ev, const msgpack_object **tag,
                       const msgpack_object **hashes) {
  *hashes = NULL;
  if (ev->type == MSGPACK_OBJECT_ARRAY && ev->via.array.size >= 1) {
    *tag = &ev->via.array.ptr[0];
    if (ev->via.array.size >= 2) *hashes = &ev->via.array.ptr[1];
    return 0;
  }
  if (ev->type != MSGPACK_OBJECT_MAP) return -1;
  *tag = NULL;
  for (uint32_t i = 0; i < ev->via.map.size; i++) {
    const msgpack_object_kv *kv = &ev->via.map.ptr[i];
    if (str_is(&kv->key, "type")) *tag = &kv->val;
    if (str_is(&kv->key, "block_hashes")) *hashes = &kv->val;
  }
  return *tag ? 0 : -1;
}

static int count_event(counts *c, const msgpack_object *ev) {
  const msgpack_object *tag, *hashes;
  if (event_parts(ev, &tag, &hashes)) return -1;
  size_t n = hashes && hashes->type == MSGPACK_OBJECT_ARRAY ? hashes->via.array.size : 0;
  if (str_is(tag, "BlockStored")) {
    c->stored += n;
  } else if (str_is(tag, "BlockRemoved")) {
    c->removed += n;
  } else if (str_is(tag, "AllBlocksCleared")) {
    c->cleared++;
  } else {
    return -1;
  }
  c->events++;
  return 0;
}

/* A payload [ts, [events...], dp_rank]; -1: not that. */
static int count_payload(counts *c, const void *data, size_t len) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  int rc = -1;
  if (msgpack_unpack_next(&u, data, len, NULL) != MSGPACK_UNPACK_SUCCESS) goto out;
  const msgpack_object *b = &u.data;
  if (b->type != MSGPACK_OBJECT_ARRAY || b->via.array.size < 2) goto out;
  const msgpack_object *ts = &b->via.array.ptr[0], *evs = &b->via.array.ptr[1];
  if (ts->type != MSGPACK_OBJECT_FLOAT64 || evs->type != MSGPACK_OBJECT_ARRAY) goto out;
  for (uint32_t i = 0; i < evs->via.array.size; i++)
    if (count_event(c, &evs->via.array.ptr[i])) goto out;
  c->lags[c->n_lags++ % LAGS] = wall() - ts->via.f64;
  rc = 0;
out:
  msgpack_unpacked_destroy(&u);
  return rc;
}

static void count_seq(counts *c, const unsigned char *b) {
  int64_t seq = 0;
  for (int i = 0; i < 8; i++)
    seq = (int64_t)((uint64_t)seq << 8 | b[i]);
  if (c->last >= 0 && seq <= c->last) {
    c->restarts++;
  } else if (c->last >= 0 && seq > c->last + 1) {
    c->gaps++;
    c->lost += (uint64_t)(seq - c->last - 1);
  }
  c->last = seq;
}

/* One message of any number of frames; 0, or -1: none within the timeout. */
static int receive(void *z, counts *c) {
  zmq_msg_t m[3];
  int n = 0, more = 1;
  while (more) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, z, 0) < 0) {
      zmq_msg_close(&part);
      for (int i = 0; i < n; i++)
        zmq_msg_close(&m[i]);
      return n ? 0 : -1;
    }
    more = zmq_msg_more(&part);
    if (n < 3)
      m[n] = part;
    else
      zmq_msg_close(&part);
    n++;
  }
  c->batches++;
  if (n != 3 || zmq_msg_size(&m[1]) != 8) {
    c->bad++;
  } else {
    count_seq(c, zmq_msg_data(&m[1]));
    if (count_payload(c, zmq_msg_data(&m[2]), zmq_msg_size(&m[2]))) c->bad++;
  }
  for (int i = 0; i < n && i < 3; i++)
    zmq_msg_close(&m[i]);
  return 0;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void report(counts *c, double secs, double cpu) {
  size_t n = c->n_lags < LAGS ? c->n_lags : LAGS;
  qsort(c->lags, n, sizeof *c->lags, by_value);
  double p50 = n ? c->lags[(size_t)(0.5 * (double)(n - 1))] : 0;
  double p99 = n ? c->lags[(size_t)(0.99 * (double)(n - 1))] : 0;
  printf("received batches=%llu events=%llu stored_blocks=%llu removed_blocks=%llu cleared=%llu "
         "gaps=%llu lost=%llu restarts=%llu bad=%llu seconds=%.3f events_per_s=%.0f "
         "cpu_seconds=%.3f events_per_cpu_s=%.0f lag_p50_ms=%.3f lag_p99_ms=%.3f\n",
         (unsigned long long)c->batches, (unsigned long long)c->events,
         (unsigned long long)c->stored, (unsigned long long)c->removed,
         (unsigned long long)c->cleared, (unsigned long long)c->gaps, (unsigned long long)c->lost,
         (unsigned long long)c->restarts, (unsigned long long)c->bad, secs,
         secs > 0 ? (double)c->events / secs : 0, cpu, cpu > 0 ? (double)c->events / cpu : 0,
         p50 * 1e3, p99 * 1e3);
}

int main(int argc, char **argv) {
  const char *addr = "tcp://127.0.0.1:5557";
  uint64_t want = 0;
  int idle = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--connect"))
      addr = argv[i + 1];
    else if (!strcmp(argv[i], "--batches"))
      want = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--idle-ms"))
      idle = atoi(argv[i + 1]);
    else
      argc = 0; /* unknown: usage */
  }
  if (argc % 2 == 0) {
    fprintf(stderr, "usage: bench-kv-subscribe [--connect tcp://127.0.0.1:5557] "
                    "[--batches N] [--idle-ms 2000]\n");
    return 2;
  }
  void *ctx = zmq_ctx_new(), *z = zmq_socket(ctx, ZMQ_SUB);
  int hwm = 0, wait = 60000;
  zmq_setsockopt(z, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(z, ZMQ_SUBSCRIBE, "", 0);
  zmq_setsockopt(z, ZMQ_RCVTIMEO, &wait, sizeof wait);
  if (zmq_connect(z, addr)) {
    fprintf(stderr, "bench-kv-subscribe: cannot connect %s: %s\n", addr, zmq_strerror(errno));
    return 1;
  }
  static counts c = {.last = -1};
  if (receive(z, &c)) return 1; /* the first batch starts the clocks */
  double t0 = wall(), cpu0 = cpu_seconds(), t1 = t0;
  zmq_setsockopt(z, ZMQ_RCVTIMEO, &idle, sizeof idle);
  while ((!want || c.batches < want) && receive(z, &c) == 0)
    t1 = wall();
  report(&c, t1 - t0, cpu_seconds() - cpu0);
  zmq_close(z);
  zmq_ctx_term(ctx);
  return c.bad ? 1 : 0;
}
