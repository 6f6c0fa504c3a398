/* vLLM's KV-event payloads through lh_kv_decode (host/kv_wire.c), printed
 * for spec/host/kv_wire_spec.lua:
 *
 *   kv-wire [FILE...]           each payload (stdin without FILE): one line,
 *                               the batch as JSON or "error <code> <message>"
 *   kv-wire --seq [FILE]        a sequence frame: "seq <n>" or "error -1 ..."
 *   kv-wire --truncate [FILE]   every strict prefix of the payload decoded:
 *                               "<len> <code> <message>" a line
 *   kv-wire --bench N [FILE]    the payload decoded N times: events/s, MB/s
 *
 * The JSON: ts, dp_rank, batch_shape and event_shape ("array", "map",
 * "both", null), skipped, mem (bytes held) and one_allocation, events with
 * type, hashes and parent as decimal strings, tokens, block_size, medium,
 * lora_name, salt (null when absent) and other_group.  Every pointer is
 * checked to lie in the batch's memory first ("invariant ..." otherwise). */
#include "lupin_host.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int read_all(const char *path, lh_buf *out) {
  FILE *f = path ? fopen(path, "rb") : stdin;
  if (!f) {
    perror(path);
    return -1;
  }
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
    if (lh_buf_append(out, chunk, n)) return -1;
  if (path) fclose(f);
  return 0;
}

static const char *shape(int s) {
  return s == LH_KV_SHAPE_ARRAY                       ? "\"array\""
         : s == LH_KV_SHAPE_MAP                       ? "\"map\""
         : s == (LH_KV_SHAPE_ARRAY | LH_KV_SHAPE_MAP) ? "\"both\""
                                                      : "null";
}

static const char *type_name(lh_kv_type t) {
  return t == LH_KV_STORED    ? "BlockStored"
         : t == LH_KV_REMOVED ? "BlockRemoved"
         : t == LH_KV_CLEARED ? "AllBlocksCleared"
                              : "?";
}

/* What the fuzz harness checks too: each array and string in the batch's
 * memory, strings NUL-terminated, one allocation within the bound. */
static const char *broken(const lh_kv_batch *b, size_t len) {
  int one;
  size_t mem = lh_kv_batch_mem(b, &one);
  if (!one) return "more than one allocation";
  if (mem > 40 * len + 1024) return "more memory than 40 x len + 1 KiB";
  if (b->n && !lh_kv_batch_holds(b, b->events, b->n * sizeof *b->events)) return "events";
  for (size_t i = 0; i < b->n; i++) {
    const lh_kv_event *e = &b->events[i];
    if (e->n_hashes && !lh_kv_batch_holds(b, e->hashes, e->n_hashes * sizeof *e->hashes))
      return "hashes";
    if (e->n_tokens && !lh_kv_batch_holds(b, e->tokens, e->n_tokens * sizeof *e->tokens))
      return "tokens";
    const char *s[] = {e->medium, e->lora_name, e->salt};
    size_t n[] = {e->medium_len, e->lora_name_len, e->salt_len};
    for (int k = 0; k < 3; k++)
      if (s[k] && (!lh_kv_batch_holds(b, s[k], n[k] + 1) || s[k][n[k]])) return "a string";
  }
  return NULL;
}

static void str_or_null(lh_buf *o, const char *s) {
  if (s)
    lh_buf_json(o, s);
  else
    lh_buf_str(o, "null");
}

static void print_batch(const lh_kv_batch *b, size_t len) {
  const char *bad = broken(b, len);
  if (bad) {
    printf("invariant broken: %s\n", bad);
    return;
  }
  int one;
  lh_buf o = {0};
  lh_buf_printf(&o, "{\"ts\":%.17g,\"dp_rank\":%d,\"batch_shape\":%s,\"event_shape\":%s,", b->ts,
                b->dp_rank, shape(b->batch_shape), shape(b->event_shape));
  lh_buf_printf(&o, "\"skipped\":%zu,\"mem\":%zu,", b->skipped, lh_kv_batch_mem(b, &one));
  lh_buf_printf(&o, "\"one_allocation\":%s,\"events\":[", one ? "true" : "false");
  for (size_t i = 0; i < b->n; i++) {
    const lh_kv_event *e = &b->events[i];
    lh_buf_printf(&o, "%s{\"type\":\"%s\",\"hashes\":[", i ? "," : "", type_name(e->type));
    for (size_t k = 0; k < e->n_hashes; k++)
      lh_buf_printf(&o, "%s\"%" PRIu64 "\"", k ? "," : "", e->hashes[k]);
    lh_buf_str(&o, "],\"parent\":");
    if (e->has_parent)
      lh_buf_printf(&o, "\"%" PRIu64 "\"", e->parent);
    else
      lh_buf_str(&o, "null");
    lh_buf_str(&o, ",\"tokens\":[");
    for (size_t k = 0; k < e->n_tokens; k++)
      lh_buf_printf(&o, "%s%" PRIu32, k ? "," : "", e->tokens[k]);
    lh_buf_printf(&o, "],\"block_size\":%" PRIu32 ",\"medium\":", e->block_size);
    str_or_null(&o, e->medium);
    lh_buf_str(&o, ",\"lora_name\":");
    str_or_null(&o, e->lora_name);
    lh_buf_str(&o, ",\"salt\":");
    str_or_null(&o, e->salt);
    lh_buf_printf(&o, ",\"other_group\":%s}", e->other_group ? "true" : "false");
  }
  lh_buf_str(&o, "]}");
  printf("%s\n", o.data);
  lh_buf_free(&o);
}

static void decode_one(const char *data, size_t len) {
  lh_kv_batch b;
  char err[256];
  int rc = lh_kv_decode(&b, data, len, err, sizeof err);
  if (rc) {
    printf("error %d %s\n", rc, err);
    return;
  }
  print_batch(&b, len);
  lh_kv_batch_free(&b);
}

/* a copy of exactly len bytes, so ASan sees a read past the end */
static char *exact(const char *data, size_t len) {
  char *c = malloc(len ? len : 1);
  if (len) memcpy(c, data, len);
  return c;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 && !strncmp(argv[1], "--", 2) ? argv[1] : NULL;
  int first = mode ? 2 : 1;
  long runs = 0;
  if (mode && !strcmp(mode, "--bench")) {
    if (argc < 3) {
      fprintf(stderr, "usage: kv-wire --bench N [FILE]\n");
      return 2;
    }
    runs = atol(argv[2]);
    first = 3;
  }
  if (mode && strcmp(mode, "--seq") && strcmp(mode, "--truncate") && strcmp(mode, "--bench")) {
    fprintf(stderr, "usage: kv-wire [--seq | --truncate | --bench N] [FILE...]\n");
    return 2;
  }
  int nfiles = argc - first;
  for (int i = 0; i < (nfiles ? nfiles : 1); i++) {
    lh_buf in = {0};
    if (read_all(nfiles ? argv[first + i] : NULL, &in)) return 1;
    char *data = exact(in.data, in.len);
    size_t len = in.len;
    lh_buf_free(&in);
    if (!mode) {
      decode_one(data, len);
    } else if (!strcmp(mode, "--seq")) {
      int64_t seq;
      if (lh_kv_seq(data, len, &seq))
        printf("error -1 a sequence frame of %zu bytes, not 8\n", len);
      else
        printf("seq %" PRId64 "\n", seq);
    } else if (!strcmp(mode, "--truncate")) {
      for (size_t n = 0; n < len; n++) {
        char *cut = exact(data, n);
        lh_kv_batch b;
        char err[256];
        int rc = lh_kv_decode(&b, cut, n, err, sizeof err);
        printf("%zu %d %s\n", n, rc, rc ? err : "ok");
        if (!rc) lh_kv_batch_free(&b);
        free(cut);
      }
    } else { /* --bench */
      size_t events = 0;
      double t0 = now();
      for (long k = 0; k < runs; k++) {
        lh_kv_batch b;
        char err[256];
        if (lh_kv_decode(&b, data, len, err, sizeof err)) {
          printf("error %s\n", err);
          return 1;
        }
        events += b.n;
        lh_kv_batch_free(&b);
      }
      double s = now() - t0;
      printf("bench %zu events, %ld batches of %zu bytes in %.3f s: %.0f events/s, %.1f MB/s\n",
             events, runs, len, s, s > 0 ? (double)events / s : 0,
             s > 0 ? (double)len * (double)runs / s / 1e6 : 0);
    }
    free(data);
  }
  return 0;
}
