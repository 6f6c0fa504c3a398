/* Fuzz target "kv_wire": a payload of vLLM's KV-event publisher.
 *
 * lh_kv_decode (host/kv_wire.c) alone: no gateway, no I/O.  After each
 * input: the answer is 0, LH_KV_EMSGPACK or LH_KV_ESHAPE (never ENOMEM
 * at these sizes) with a message; a refused batch is left empty; a decoded
 * one is one allocation of at most 40 x len + 1 KiB, every array and string
 * of it lies inside that allocation, strings are NUL-terminated, the counts
 * agree with the types and with the payload's length (an event takes 13
 * bytes at least, a hash or a token one), and decoding the same bytes
 * again, with a short error buffer, gives the same events. */
#include "fuzz.h"

#include <math.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_setup();
  return 0;
}

static void check_string(const lh_kv_batch *b, size_t i, const char *what, const char *s,
                         size_t n) {
  if (!s) {
    if (n) fz_fail("event %zu: %s is NULL with a length of %zu", i, what, n);
    return;
  }
  if (!lh_kv_batch_holds(b, s, n + 1)) fz_fail("event %zu: %s outside the batch", i, what);
  if (s[n]) fz_fail("event %zu: %s not NUL-terminated", i, what);
}

static void check(const lh_kv_batch *b, size_t len) {
  int one;
  size_t mem = lh_kv_batch_mem(b, &one);
  if (!one) fz_fail("the batch took more than one allocation (%zu bytes first)", mem);
  if (mem > 40 * len + 1024) fz_fail("%zu bytes held for a payload of %zu", mem, len);
  if (b->batch_shape != LH_KV_SHAPE_ARRAY && b->batch_shape != LH_KV_SHAPE_MAP)
    fz_fail("batch_shape %d", b->batch_shape);
  if (b->event_shape < 0 || b->event_shape > (LH_KV_SHAPE_ARRAY | LH_KV_SHAPE_MAP))
    fz_fail("event_shape %d", b->event_shape);
  if (!b->event_shape != !(b->n + b->skipped))
    fz_fail("event_shape %d for %zu events, %zu skipped", b->event_shape, b->n, b->skipped);
  if (b->dp_rank < -1) fz_fail("dp_rank %d", b->dp_rank);
  if (!isfinite(b->ts)) fz_fail("ts not finite");
  if (b->n * 13 > len) fz_fail("%zu events in %zu bytes", b->n, len);
  if (b->n && !lh_kv_batch_holds(b, b->events, b->n * sizeof *b->events))
    fz_fail("the events outside the batch");
  size_t hashes = 0, tokens = 0;
  for (size_t i = 0; i < b->n; i++) {
    const lh_kv_event *e = &b->events[i];
    if (e->type < LH_KV_STORED || e->type > LH_KV_CLEARED)
      fz_fail("event %zu: type %d", i, e->type);
    if (e->n_hashes && !lh_kv_batch_holds(b, e->hashes, e->n_hashes * sizeof *e->hashes))
      fz_fail("event %zu: hashes outside the batch", i);
    if (e->n_tokens && !lh_kv_batch_holds(b, e->tokens, e->n_tokens * sizeof *e->tokens))
      fz_fail("event %zu: tokens outside the batch", i);
    check_string(b, i, "medium", e->medium, e->medium_len);
    check_string(b, i, "lora_name", e->lora_name, e->lora_name_len);
    check_string(b, i, "salt", e->salt, e->salt_len);
    if (e->type != LH_KV_STORED &&
        (e->n_tokens || e->has_parent || e->block_size || e->lora_name || e->salt))
      fz_fail("event %zu: a %d with BlockStored's fields", i, e->type);
    if (e->type == LH_KV_CLEARED && (e->n_hashes || e->medium || e->other_group))
      fz_fail("event %zu: AllBlocksCleared with fields", i);
    hashes += e->n_hashes;
    tokens += e->n_tokens;
  }
  if (hashes + tokens > len) fz_fail("%zu hashes and %zu tokens in %zu bytes", hashes, tokens, len);
}

static int same_string(const char *a, size_t na, const char *b, size_t nb) {
  return !a == !b && na == nb && (!a || !memcmp(a, b, na));
}

/* The values of two decodings of one payload, pointers aside. */
static void compare(const lh_kv_batch *a, const lh_kv_batch *b) {
  if (a->n != b->n || a->skipped != b->skipped || a->dp_rank != b->dp_rank ||
      memcmp(&a->ts, &b->ts, sizeof a->ts) || a->batch_shape != b->batch_shape ||
      a->event_shape != b->event_shape)
    fz_fail("two decodings of one payload differ");
  for (size_t i = 0; i < a->n; i++) {
    const lh_kv_event *x = &a->events[i], *y = &b->events[i];
    if (x->type != y->type || x->n_hashes != y->n_hashes || x->n_tokens != y->n_tokens ||
        x->has_parent != y->has_parent || (x->has_parent && x->parent != y->parent) ||
        x->block_size != y->block_size || x->other_group != y->other_group ||
        (x->n_hashes && memcmp(x->hashes, y->hashes, x->n_hashes * sizeof *x->hashes)) ||
        (x->n_tokens && memcmp(x->tokens, y->tokens, x->n_tokens * sizeof *x->tokens)) ||
        !same_string(x->medium, x->medium_len, y->medium, y->medium_len) ||
        !same_string(x->lora_name, x->lora_name_len, y->lora_name, y->lora_name_len) ||
        !same_string(x->salt, x->salt_len, y->salt, y->salt_len))
      fz_fail("event %zu differs between two decodings", i);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_kv_batch b, again;
  char err[256], short_err[12];
  memset(err, 'x', sizeof err);
  int rc = lh_kv_decode(&b, data, size, err, sizeof err);
  if (rc != 0 && rc != LH_KV_EMSGPACK && rc != LH_KV_ESHAPE) fz_fail("lh_kv_decode: %d", rc);
  if (rc) {
    if (!memchr(err, 0, sizeof err) || !err[0]) fz_fail("error %d without a message", rc);
    if (b.n || b.events || b.mem_) fz_fail("a refused batch left filled");
  } else {
    check(&b, size);
  }
  memset(short_err, 'x', sizeof short_err);
  int rc2 = lh_kv_decode(&again, data, size, short_err, sizeof short_err);
  if (rc2 != rc) fz_fail("decoded twice: %d then %d", rc, rc2);
  if (rc2 && !memchr(short_err, 0, sizeof short_err)) fz_fail("a short error buffer overrun");
  if (!rc) {
    compare(&b, &again);
    lh_kv_batch_free(&again);
    lh_kv_batch_free(&b);
    if (b.mem_ || b.events || b.n) fz_fail("a freed batch left filled");
  }
  int64_t seq;
  if (lh_kv_seq(data, size, &seq) != (size == 8 ? 0 : -1)) fz_fail("lh_kv_seq of %zu bytes", size);
  return 0;
}
