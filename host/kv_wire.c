/* kv_wire.c -- vLLM's KV-cache events, decoded (lupin_host.h).
 *
 * One payload of vLLM's ZMQ KV-event publisher (the third frame of a
 * message: vllm/distributed/kv_events.py) into flat C arrays.  A pure
 * function: no I/O, no threads, no state between calls.
 *
 * Three steps over the payload, one allocation:
 *   1. scan: a walk over the bytes (no allocation) that checks the payload
 *      is exactly one msgpack value, that no container declares more
 *      elements than bytes are left (each needs one at least) and that it
 *      nests at most 32 deep (msgpack-c's limit), and counts what the next
 *      steps will need.  msgpack-c allocates a container's element array
 *      from its declared length before reading any element: a 5-byte
 *      array32 header would ask it for 96 GB.  After the scan it is never
 *      asked for more than the payload holds.
 *   2. msgpack_unpack (msgpack-c 4.x's C API) builds the object tree in a
 *      zone whose one chunk is sized from the scan: the tree, this
 *      decoder's output and its own bookkeeping all fit in it.
 *   3. the tree is read into lh_kv_event records; the hashes, tokens and
 *      strings are copied into the same chunk, so the batch depends on
 *      nothing of the payload once decoded.
 *
 * The chunk is at most 32 bytes per payload byte plus a few hundred
 * (lh_kv_batch_mem; spec/host/kv_wire_spec.lua and the fuzz harness check
 * 40 x len + 1 KiB): 24 bytes of tree per element of one byte, 8 more if it
 * is an integer that could be a hash.  A batch of 64 BlockStored of 16
 * tokens below 65536 (3 bytes each) takes 12 times its length, the tree
 * most of it.  The tree stays until lh_kv_batch_free: free a batch once
 * applied.  A subscriber bounds the payload itself (ZMQ_MAXMSGSIZE).
 *
 * What is accepted, after the design note (issue 43, section 1):
 *   batch   [ts, events, dp_rank?, ...] or {ts, events, data_parallel_rank};
 *           ts an integer or a finite float; dp_rank absent or nil: -1.
 *   events  positional ["BlockStored", block_hashes, parent_block_hash,
 *           token_ids, block_size, lora_id, medium, lora_name, extra_keys,
 *           group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
 *           (at least up to block_size: older versions stop after lora_id or
 *           medium), ["BlockRemoved", block_hashes, medium?, group_idx?],
 *           ["AllBlocksCleared"], more trailing elements ignored; or maps
 *           with the tag under "type" and the same fields by name, any of
 *           them absent but block_hashes (and BlockStored's token_ids),
 *           unknown keys ignored.  Both shapes may mix in one batch.  An
 *           unknown tag is skipped and counted.
 *   hashes  a non-negative integer as is, a negative one as its two's
 *           complement, bin or str: the last 8 bytes big-endian (fewer:
 *           left-padded); an empty one is an error.
 *   salt    vLLM's extra keys of a block are (lora name, multimodal
 *           (identifier, offset) pairs, cache_salt, prompt-embedding hashes
 *           as bytes), in that order, and the salt only in a request's first
 *           block (kv_cache_utils.py, generate_block_hash_extra_keys).  So
 *           the salt is the LAST str of extra_keys[0] that is not the event's
 *           lora_name: pairs are arrays and embedding hashes bin, skipped.
 *           Two misreadings are possible, both costing misses and never
 *           false hits: a salt equal to the LoRA name is not seen, and an
 *           old publisher whose multimodal keys were bare strings gives one
 *           of those as the salt of a block without one.
 *   groups  group_idx > 0, or a kv_cache_spec_kind other than full_attention,
 *           mla_attention or sink_full_attention (vLLM's KVCacheSpecKind
 *           for full attention): other_group, decoded but not indexed.
 * Everything else of the wrong type is LH_KV_ESHAPE, the event's index and
 * the field named. */
#include "lupin_host.h"

#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KV_DEPTH 32 /* msgpack-c's nesting limit (MSGPACK_EMBED_STACK_SIZE) */

/* What lh_kv_batch.mem_ points at: the zone, copied into its own chunk. */
typedef struct kv_mem {
  msgpack_zone zone;
  void *head;       /* the first chunk: still the head when nothing else was allocated */
  const char *base; /* the first chunk's memory, size bytes */
  size_t size;
} kv_mem;

/* --- 1. the scan ---------------------------------------------------------- */

typedef struct kv_scan {
  size_t tree;      /* bytes of msgpack-c's tree: element arrays of arrays and maps */
  size_t scalars;   /* integers, bins and strs: each could become a hash (8 bytes) */
  size_t str_bytes; /* bytes of strs: what strings copied can take */
  size_t tags;      /* strs spelling an event type: the most events there can be */
} kv_scan;

static uint64_t be(const uint8_t *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++)
    v = v << 8 | p[i];
  return v;
}

static int is_tag(const uint8_t *p, size_t n) {
  return (n == 11 && !memcmp(p, "BlockStored", 11)) ||
         (n == 12 && !memcmp(p, "BlockRemoved", 12)) ||
         (n == 16 && !memcmp(p, "AllBlocksCleared", 16));
}

/* 0, or an LH_KV_E* code with err set. */
static int scan(const uint8_t *p, size_t len, kv_scan *s, char *err, size_t errlen) {
  uint64_t left[KV_DEPTH + 1]; /* elements still to read: the top value, then per open container */
  uint64_t pending = 1;        /* their sum: each needs a byte at least */
  int depth = 0;
  size_t i = 0;
  left[0] = 1;
  memset(s, 0, sizeof *s);
  while (pending) {
    while (!left[depth])
      depth--;
    left[depth]--;
    pending--;
    if (i >= len) {
      lh_errf(err, errlen, "truncated: %zu bytes, a value expected at byte %zu", len, i);
      return LH_KV_EMSGPACK;
    }
    size_t at = i;
    uint8_t b = p[i++];
    size_t lenbytes = 0; /* a length of that many bytes follows */
    uint64_t fixed = 0;  /* then payload bytes */
    int kind = 0;        /* 0 scalar, 'a' array, 'm' map, 's' str, 'b' bin, 'e' ext */
    uint64_t n = 0;
    int is_int = 0;
    if (b <= 0x7f || b >= 0xe0) {
      is_int = 1;
    } else if (b <= 0x8f) {
      kind = 'm', n = b & 0x0f;
    } else if (b <= 0x9f) {
      kind = 'a', n = b & 0x0f;
    } else if (b <= 0xbf) {
      kind = 's', n = b & 0x1f;
    } else {
      switch (b) {
      case 0xc0: /* nil */
      case 0xc2: /* false */
      case 0xc3: /* true */
        break;
      case 0xc4:
      case 0xc5:
      case 0xc6: /* bin 8, 16, 32 */
        kind = 'b', lenbytes = (size_t)1 << (b - 0xc4);
        break;
      case 0xc7:
      case 0xc8:
      case 0xc9: /* ext 8, 16, 32: the length, a type byte */
        kind = 'e', lenbytes = (size_t)1 << (b - 0xc7);
        break;
      case 0xca: /* float 32 */
        fixed = 4;
        break;
      case 0xcb: /* float 64 */
        fixed = 8;
        break;
      case 0xcc:
      case 0xcd:
      case 0xce:
      case 0xcf: /* uint 8 .. 64 */
        is_int = 1, fixed = (size_t)1 << (b - 0xcc);
        break;
      case 0xd0:
      case 0xd1:
      case 0xd2:
      case 0xd3: /* int 8 .. 64 */
        is_int = 1, fixed = (size_t)1 << (b - 0xd0);
        break;
      case 0xd4:
      case 0xd5:
      case 0xd6:
      case 0xd7:
      case 0xd8: /* fixext 1 .. 16, a type byte */
        fixed = 1 + ((size_t)1 << (b - 0xd4));
        break;
      case 0xd9:
      case 0xda:
      case 0xdb: /* str 8, 16, 32 */
        kind = 's', lenbytes = (size_t)1 << (b - 0xd9);
        break;
      case 0xdc:
      case 0xdd: /* array 16, 32 */
        kind = 'a', lenbytes = (size_t)2 << (b - 0xdc);
        break;
      case 0xde:
      case 0xdf: /* map 16, 32 */
        kind = 'm', lenbytes = (size_t)2 << (b - 0xde);
        break;
      default: /* 0xc1, never used */
        lh_errf(err, errlen, "not msgpack: byte 0x%02x at %zu", b, at);
        return LH_KV_EMSGPACK;
      }
    }
    if (lenbytes) {
      if (len - i < lenbytes) {
        lh_errf(err, errlen, "truncated: %zu bytes, the length at byte %zu cut", len, at);
        return LH_KV_EMSGPACK;
      }
      n = be(p + i, lenbytes);
      i += lenbytes;
    }
    if (kind == 'e') fixed = 1 + n; /* the type byte, the data */
    if (kind == 's' || kind == 'b') fixed = n;
    if (fixed > len - i) {
      lh_errf(err, errlen, "truncated: %zu bytes, the value at byte %zu needs %llu more", len, at,
              (unsigned long long)fixed);
      return LH_KV_EMSGPACK;
    }
    if (kind == 's') {
      s->str_bytes += (size_t)fixed;
      s->tags += is_tag(p + i, (size_t)fixed);
    }
    if (is_int || kind == 's' || kind == 'b') s->scalars++;
    i += (size_t)fixed;
    if (kind == 'a' || kind == 'm') {
      if (depth >= KV_DEPTH) {
        lh_errf(err, errlen, "nested deeper than %d at byte %zu", KV_DEPTH, at);
        return LH_KV_ESHAPE;
      }
      uint64_t elements = kind == 'm' ? 2 * n : n;
      if (pending > len - i || elements > len - i - pending) {
        lh_errf(err, errlen,
                "truncated: the %s at byte %zu declares %llu elements, %zu bytes are left",
                kind == 'm' ? "map" : "array", at, (unsigned long long)n, len - i);
        return LH_KV_EMSGPACK;
      }
      s->tree +=
          kind == 'm' ? (size_t)n * sizeof(msgpack_object_kv) : (size_t)n * sizeof(msgpack_object);
      left[++depth] = elements;
      pending += elements;
    }
    if (pending > len - i) {
      lh_errf(err, errlen, "truncated: %zu bytes, %llu values still expected at byte %zu", len,
              (unsigned long long)pending, i);
      return LH_KV_EMSGPACK;
    }
  }
  if (i != len) {
    lh_errf(err, errlen, "trailing bytes: the batch ends at byte %zu of %zu", i, len);
    return LH_KV_EMSGPACK;
  }
  return 0;
}

/* --- 3. the tree read ----------------------------------------------------- */

enum {
  F_HASHES,
  F_PARENT,
  F_TOKENS,
  F_BLOCK_SIZE,
  F_LORA_ID,
  F_MEDIUM,
  F_LORA_NAME,
  F_EXTRA_KEYS,
  F_GROUP_IDX,
  F_SPEC_KIND,
  F_SLIDING_WINDOW,
  F_N
};

static const char *const field_names[F_N] = {"block_hashes",
                                             "parent_block_hash",
                                             "token_ids",
                                             "block_size",
                                             "lora_id",
                                             "medium",
                                             "lora_name",
                                             "extra_keys",
                                             "group_idx",
                                             "kv_cache_spec_kind",
                                             "kv_cache_spec_sliding_window"};

/* The fields by position after the tag, in vLLM's declaration order. */
static const signed char stored_fields[] = {F_HASHES,    F_PARENT,    F_TOKENS,        F_BLOCK_SIZE,
                                            F_LORA_ID,   F_MEDIUM,    F_LORA_NAME,     F_EXTRA_KEYS,
                                            F_GROUP_IDX, F_SPEC_KIND, F_SLIDING_WINDOW};
static const signed char removed_fields[] = {F_HASHES, F_MEDIUM, F_GROUP_IDX};

/* Elements a positional event needs, the tag included. */
#define STORED_MIN  5 /* up to block_size */
#define REMOVED_MIN 2 /* up to block_hashes */

static const char *const type_names[] = {"", "BlockStored", "BlockRemoved", "AllBlocksCleared"};

typedef struct kv_read {
  lh_kv_batch *b;
  kv_mem *m;
  char *data, *data_end; /* where hashes, tokens and strings go */
  size_t cap;            /* events there is room for */
  char *err;
  size_t errlen;
} kv_read;

static int str_is(const msgpack_object *o, const char *s, size_t n) {
  return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && !memcmp(o->via.str.ptr, s, n);
}

static void *take(kv_read *r, size_t n, size_t align) {
  uintptr_t at = ((uintptr_t)r->data + (align - 1)) & ~(uintptr_t)(align - 1);
  if (at > (uintptr_t)r->data_end || n > (uintptr_t)r->data_end - at) {
    /* the scan's bound fell short (a bug): the zone grows, correctly */
    void *p = msgpack_zone_malloc(&r->m->zone, n ? n : 1);
    return p;
  }
  r->data = (char *)(at + n);
  return (void *)at;
}

/* A NUL-terminated copy of a str. */
static int copy_str(kv_read *r, const msgpack_object *o, const char **out, size_t *len) {
  char *s = take(r, o->via.str.size + 1, 1);
  if (!s) return LH_KV_ENOMEM;
  if (o->via.str.size) memcpy(s, o->via.str.ptr, o->via.str.size);
  s[o->via.str.size] = 0;
  *out = s;
  *len = o->via.str.size;
  return 0;
}

/* A block hash: 0, -1 (not an integer, bin or str), -2 (empty). */
static int hash_of(const msgpack_object *o, uint64_t *h) {
  const char *p;
  size_t n;
  switch (o->type) {
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    *h = o->via.u64;
    return 0;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    *h = (uint64_t)o->via.i64;
    return 0;
  case MSGPACK_OBJECT_BIN:
    p = o->via.bin.ptr, n = o->via.bin.size;
    break;
  case MSGPACK_OBJECT_STR:
    p = o->via.str.ptr, n = o->via.str.size;
    break;
  default:
    return -1;
  }
  if (!n) return -2;
  if (n > 8) p += n - 8, n = 8;
  *h = be((const uint8_t *)p, n);
  return 0;
}

static const char *what(const msgpack_object *o) {
  switch (o->type) {
  case MSGPACK_OBJECT_NIL:
    return "nil";
  case MSGPACK_OBJECT_BOOLEAN:
    return "a boolean";
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    return "an integer";
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    return "a float";
  case MSGPACK_OBJECT_STR:
    return "a str";
  case MSGPACK_OBJECT_BIN:
    return "a bin";
  case MSGPACK_OBJECT_EXT:
    return "an ext";
  case MSGPACK_OBJECT_ARRAY:
    return "an array";
  case MSGPACK_OBJECT_MAP:
    return "a map";
  }
  return "something";
}

/* LH_KV_ESHAPE, err saying which event and what of it. */
static int bad(kv_read *r, size_t idx, int type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(kv_read *r, size_t idx, int type, const char *fmt, ...) {
  if (!r->err || !r->errlen) return LH_KV_ESHAPE;
  int n = snprintf(r->err, r->errlen, "event %zu (%s): ", idx, type_names[type]);
  if (n >= 0 && (size_t)n < r->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return LH_KV_ESHAPE;
}

static int is_int(const msgpack_object *o) {
  return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}

static int full_attention(const msgpack_object *o) {
  return str_is(o, "full_attention", 14) || str_is(o, "mla_attention", 13) ||
         str_is(o, "sink_full_attention", 19);
}

/* Reads the hashes of f into the data area. */
static int read_hashes(kv_read *r, size_t idx, int type, const msgpack_object *f, lh_kv_event *ev) {
  if (f->type != MSGPACK_OBJECT_ARRAY)
    return bad(r, idx, type, "block_hashes: %s, not an array", what(f));
  size_t n = f->via.array.size;
  uint64_t *h = take(r, n * sizeof *h, sizeof *h);
  if (!h) return LH_KV_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    int rc = hash_of(&f->via.array.ptr[i], &h[i]);
    if (rc == -1)
      return bad(r, idx, type, "block_hashes[%zu]: %s, not an integer, bin or str", i,
                 what(&f->via.array.ptr[i]));
    if (rc == -2) return bad(r, idx, type, "block_hashes[%zu]: an empty hash", i);
  }
  ev->hashes = h;
  ev->n_hashes = n;
  return 0;
}

/* One event whose fields are gathered in f (NULL: absent). */
static int read_event(kv_read *r, size_t idx, int type, const msgpack_object *const *f,
                      lh_kv_event *ev) {
  static const msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
  const msgpack_object *v[F_N];
  for (int k = 0; k < F_N; k++)
    v[k] = f[k] ? f[k] : &nil;
  memset(ev, 0, sizeof *ev);
  ev->type = (lh_kv_type)type;
  if (type == LH_KV_CLEARED) return 0;

  if (!f[F_HASHES]) return bad(r, idx, type, "no block_hashes");
  int rc = read_hashes(r, idx, type, v[F_HASHES], ev);
  if (rc) return rc;

  if (type == LH_KV_STORED) {
    if (v[F_PARENT]->type != MSGPACK_OBJECT_NIL) {
      rc = hash_of(v[F_PARENT], &ev->parent);
      if (rc == -1)
        return bad(r, idx, type, "parent_block_hash: %s, not nil, an integer, bin or str",
                   what(v[F_PARENT]));
      if (rc == -2) return bad(r, idx, type, "parent_block_hash: an empty hash");
      ev->has_parent = 1;
    }
    const msgpack_object *t = v[F_TOKENS];
    if (!f[F_TOKENS]) return bad(r, idx, type, "no token_ids");
    if (t->type != MSGPACK_OBJECT_ARRAY)
      return bad(r, idx, type, "token_ids: %s, not an array", what(t));
    size_t n = t->via.array.size;
    uint32_t *tok = take(r, n * sizeof *tok, sizeof *tok);
    if (!tok) return LH_KV_ENOMEM;
    for (size_t i = 0; i < n; i++) {
      const msgpack_object *o = &t->via.array.ptr[i];
      if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
        return bad(r, idx, type, "token_ids[%zu]: %s, not an integer in [0, 2^32)", i, what(o));
      tok[i] = (uint32_t)o->via.u64;
    }
    ev->tokens = tok;
    ev->n_tokens = n;

    const msgpack_object *bs = v[F_BLOCK_SIZE];
    if (bs->type != MSGPACK_OBJECT_NIL) {
      if (bs->type != MSGPACK_OBJECT_POSITIVE_INTEGER || bs->via.u64 > UINT32_MAX)
        return bad(r, idx, type, "block_size: %s, not an integer in [0, 2^32)", what(bs));
      ev->block_size = (uint32_t)bs->via.u64;
    }
    if (v[F_LORA_ID]->type != MSGPACK_OBJECT_NIL && !is_int(v[F_LORA_ID]))
      return bad(r, idx, type, "lora_id: %s, not nil or an integer", what(v[F_LORA_ID]));
    const msgpack_object *ln = v[F_LORA_NAME];
    if (ln->type == MSGPACK_OBJECT_STR) {
      if ((rc = copy_str(r, ln, &ev->lora_name, &ev->lora_name_len))) return rc;
    } else if (ln->type != MSGPACK_OBJECT_NIL) {
      return bad(r, idx, type, "lora_name: %s, not nil or a str", what(ln));
    }
    const msgpack_object *ek = v[F_EXTRA_KEYS];
    if (ek->type == MSGPACK_OBJECT_ARRAY) {
      /* the salt: the last str of the first block's keys that is not the
       * LoRA name (the file's comment says why) */
      const msgpack_object *salt = NULL;
      if (ek->via.array.size && ek->via.array.ptr[0].type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *keys = &ek->via.array.ptr[0].via.array;
        for (size_t i = 0; i < keys->size; i++) {
          const msgpack_object *k = &keys->ptr[i];
          if (k->type != MSGPACK_OBJECT_STR) continue;
          if (ln->type == MSGPACK_OBJECT_STR && str_is(k, ln->via.str.ptr, ln->via.str.size))
            continue;
          salt = k;
        }
      }
      if (salt && (rc = copy_str(r, salt, &ev->salt, &ev->salt_len))) return rc;
    } else if (ek->type != MSGPACK_OBJECT_NIL) {
      return bad(r, idx, type, "extra_keys: %s, not nil or an array", what(ek));
    }
    const msgpack_object *kind = v[F_SPEC_KIND];
    if (kind->type == MSGPACK_OBJECT_STR) {
      if (!full_attention(kind)) ev->other_group = 1;
    } else if (kind->type != MSGPACK_OBJECT_NIL) {
      return bad(r, idx, type, "kv_cache_spec_kind: %s, not nil or a str", what(kind));
    }
    if (v[F_SLIDING_WINDOW]->type != MSGPACK_OBJECT_NIL && !is_int(v[F_SLIDING_WINDOW]))
      return bad(r, idx, type, "kv_cache_spec_sliding_window: %s, not nil or an integer",
                 what(v[F_SLIDING_WINDOW]));
  }

  const msgpack_object *md = v[F_MEDIUM];
  if (md->type == MSGPACK_OBJECT_STR) {
    if ((rc = copy_str(r, md, &ev->medium, &ev->medium_len))) return rc;
  } else if (md->type != MSGPACK_OBJECT_NIL) {
    return bad(r, idx, type, "medium: %s, not nil or a str", what(md));
  }
  const msgpack_object *g = v[F_GROUP_IDX];
  if (g->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    if (g->via.u64 > 0) ev->other_group = 1;
  } else if (g->type != MSGPACK_OBJECT_NIL) {
    return bad(r, idx, type, "group_idx: %s, not nil or a non-negative integer", what(g));
  }
  return 0;
}

static int tag_type(const msgpack_object *o) {
  if (o->type != MSGPACK_OBJECT_STR) return -1;
  const char *s = o->via.str.ptr;
  switch (o->via.str.size) {
  case 11:
    return memcmp(s, "BlockStored", 11) ? 0 : LH_KV_STORED;
  case 12:
    return memcmp(s, "BlockRemoved", 12) ? 0 : LH_KV_REMOVED;
  case 16:
    return memcmp(s, "AllBlocksCleared", 16) ? 0 : LH_KV_CLEARED;
  }
  return 0;
}

static int field_of(const msgpack_object *key) {
  if (key->type != MSGPACK_OBJECT_STR) return -1;
  for (int k = 0; k < F_N; k++)
    if (str_is(key, field_names[k], strlen(field_names[k]))) return k;
  return -1;
}

/* Whether field k belongs to events of type: the others are ignored. */
static int applies(int type, int k) {
  if (type == LH_KV_STORED) return 1;
  return type == LH_KV_REMOVED && (k == F_HASHES || k == F_MEDIUM || k == F_GROUP_IDX);
}

static int read_events(kv_read *r, const msgpack_object *events) {
  lh_kv_batch *b = r->b;
  for (size_t idx = 0; idx < events->via.array.size; idx++) {
    const msgpack_object *e = &events->via.array.ptr[idx];
    const msgpack_object *f[F_N] = {0};
    int type;
    if (e->type == MSGPACK_OBJECT_ARRAY) {
      b->event_shape |= LH_KV_SHAPE_ARRAY;
      const msgpack_object_array *a = &e->via.array;
      if (!a->size) {
        lh_errf(r->err, r->errlen, "event %zu: an empty array, no type", idx);
        return LH_KV_ESHAPE;
      }
      type = tag_type(&a->ptr[0]);
      if (type < 0) {
        lh_errf(r->err, r->errlen, "event %zu: its type is %s, not a str", idx, what(&a->ptr[0]));
        return LH_KV_ESHAPE;
      }
      if (!type) {
        b->skipped++;
        continue;
      }
      size_t min = type == LH_KV_STORED ? STORED_MIN : type == LH_KV_REMOVED ? REMOVED_MIN : 1;
      if (a->size < min) {
        lh_errf(r->err, r->errlen, "event %zu (%s): %u elements, %zu at least", idx,
                type_names[type], a->size, min);
        return LH_KV_ESHAPE;
      }
      const signed char *pos = type == LH_KV_STORED ? stored_fields : removed_fields;
      size_t npos = type == LH_KV_STORED    ? sizeof stored_fields
                    : type == LH_KV_REMOVED ? sizeof removed_fields
                                            : 0;
      for (size_t i = 1; i < a->size && i - 1 < npos; i++)
        f[pos[i - 1]] = &a->ptr[i];
    } else if (e->type == MSGPACK_OBJECT_MAP) {
      b->event_shape |= LH_KV_SHAPE_MAP;
      const msgpack_object_map *m = &e->via.map;
      const msgpack_object *tag = NULL;
      for (size_t i = 0; i < m->size; i++)
        if (str_is(&m->ptr[i].key, "type", 4)) tag = &m->ptr[i].val;
      if (!tag) {
        lh_errf(r->err, r->errlen, "event %zu: a map without \"type\"", idx);
        return LH_KV_ESHAPE;
      }
      type = tag_type(tag);
      if (type < 0) {
        lh_errf(r->err, r->errlen, "event %zu: its type is %s, not a str", idx, what(tag));
        return LH_KV_ESHAPE;
      }
      if (!type) {
        b->skipped++;
        continue;
      }
      for (size_t i = 0; i < m->size; i++) {
        int k = field_of(&m->ptr[i].key);
        if (k >= 0 && applies(type, k)) f[k] = &m->ptr[i].val;
      }
    } else {
      lh_errf(r->err, r->errlen, "event %zu: %s, not an array or a map", idx, what(e));
      return LH_KV_ESHAPE;
    }
    lh_kv_event *ev;
    if (b->n < r->cap) {
      ev = &b->events[b->n];
    } else { /* more events than tag strs: cannot be, but stay in bounds */
      lh_errf(r->err, r->errlen, "event %zu: more events than the scan counted", idx);
      return LH_KV_ENOMEM;
    }
    int rc = read_event(r, idx, type, f, ev);
    if (rc) return rc;
    b->n++;
  }
  return 0;
}

static int read_batch(kv_read *r, const msgpack_object *top) {
  lh_kv_batch *b = r->b;
  const msgpack_object *ts = NULL, *events = NULL, *rank = NULL;
  if (top->type == MSGPACK_OBJECT_ARRAY) {
    b->batch_shape = LH_KV_SHAPE_ARRAY;
    if (top->via.array.size < 2) {
      lh_errf(r->err, r->errlen, "batch: an array of %u elements, not [ts, events, dp_rank]",
              top->via.array.size);
      return LH_KV_ESHAPE;
    }
    ts = &top->via.array.ptr[0];
    events = &top->via.array.ptr[1];
    if (top->via.array.size > 2) rank = &top->via.array.ptr[2];
  } else if (top->type == MSGPACK_OBJECT_MAP) {
    b->batch_shape = LH_KV_SHAPE_MAP;
    for (size_t i = 0; i < top->via.map.size; i++) {
      const msgpack_object *k = &top->via.map.ptr[i].key, *v = &top->via.map.ptr[i].val;
      if (str_is(k, "ts", 2))
        ts = v;
      else if (str_is(k, "events", 6))
        events = v;
      else if (str_is(k, "data_parallel_rank", 18))
        rank = v;
    }
    if (!ts || !events) {
      lh_errf(r->err, r->errlen, "batch: a map without \"%s\"", ts ? "events" : "ts");
      return LH_KV_ESHAPE;
    }
  } else {
    lh_errf(r->err, r->errlen, "batch: %s, not an array or a map", what(top));
    return LH_KV_ESHAPE;
  }
  switch (ts->type) {
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    b->ts = (double)ts->via.u64;
    break;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    b->ts = (double)ts->via.i64;
    break;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    b->ts = ts->via.f64;
    break;
  default:
    lh_errf(r->err, r->errlen, "batch: ts is %s, not a number", what(ts));
    return LH_KV_ESHAPE;
  }
  if (!isfinite(b->ts)) {
    lh_errf(r->err, r->errlen, "batch: ts is not finite");
    return LH_KV_ESHAPE;
  }
  if (rank && rank->type != MSGPACK_OBJECT_NIL) {
    if (rank->type != MSGPACK_OBJECT_POSITIVE_INTEGER || rank->via.u64 > INT32_MAX) {
      lh_errf(r->err, r->errlen,
              "batch: data_parallel_rank is %s, not nil or an integer in [0, 2^31)", what(rank));
      return LH_KV_ESHAPE;
    }
    b->dp_rank = (int)rank->via.u64;
  }
  if (events->type != MSGPACK_OBJECT_ARRAY) {
    lh_errf(r->err, r->errlen, "batch: events is %s, not an array", what(events));
    return LH_KV_ESHAPE;
  }
  return read_events(r, events);
}

/* --- the API ---------------------------------------------------------------- */

static void release(kv_mem *m) {
  msgpack_zone z = m->zone; /* m lives in the zone's chunk */
  msgpack_zone_destroy(&z);
}

void lh_kv_batch_free(lh_kv_batch *b) {
  if (!b) return;
  if (b->mem_) release(b->mem_);
  memset(b, 0, sizeof *b);
  b->dp_rank = -1;
}

static void unset(lh_kv_batch *b) {
  memset(b, 0, sizeof *b);
  b->dp_rank = -1;
}

#define ALIGN_SLACK 16

int lh_kv_decode(lh_kv_batch *b, const void *payload, size_t len, char *err, size_t errlen) {
  unset(b);
  if (err && errlen) err[0] = 0;
  if (!len) {
    lh_errf(err, errlen, "an empty payload");
    return LH_KV_EMSGPACK;
  }
  /* everything counted is at most a multiple of len: no sum overflows
   * unless len is within a factor of 64 of SIZE_MAX */
  if (len > SIZE_MAX / 64) {
    lh_errf(err, errlen, "a payload of %zu bytes", len);
    return LH_KV_ENOMEM;
  }
  kv_scan s;
  int rc = scan(payload, len, &s, err, errlen);
  if (rc) return rc;
  size_t events_bytes = s.tags * sizeof(lh_kv_event);
  /* per event: its hashes 8-aligned, three NULs */
  size_t data_bytes = s.scalars * sizeof(uint64_t) + s.str_bytes + s.tags * (8 + 3);
  size_t size = sizeof(kv_mem) + s.tree + events_bytes + data_bytes + 4 * ALIGN_SLACK;

  msgpack_zone z;
  if (!msgpack_zone_init(&z, size)) {
    lh_errf(err, errlen, "no memory for %zu bytes", size);
    return LH_KV_ENOMEM;
  }
  const char *base = z.chunk_list.ptr;
  void *head = z.chunk_list.head;
  kv_mem *m = msgpack_zone_malloc(&z, sizeof *m);
  m->zone = z; /* from here on the zone is m->zone */
  m->head = head;
  m->base = base;
  m->size = size;

  msgpack_object top;
  size_t off = 0;
  msgpack_unpack_return u = msgpack_unpack((const char *)payload, len, &off, &m->zone, &top);
  if (u != MSGPACK_UNPACK_SUCCESS) { /* the scan accepted it: not expected */
    lh_errf(err, errlen, "msgpack-c: %s",
            u == MSGPACK_UNPACK_NOMEM_ERROR ? "out of memory" : "not msgpack");
    release(m);
    return u == MSGPACK_UNPACK_NOMEM_ERROR ? LH_KV_ENOMEM : LH_KV_EMSGPACK;
  }

  kv_read r = {.b = b, .m = m, .cap = s.tags, .err = err, .errlen = errlen};
  b->events = msgpack_zone_malloc(&m->zone, events_bytes ? events_bytes : 1);
  r.data = msgpack_zone_malloc(&m->zone, data_bytes + ALIGN_SLACK);
  if (!b->events || !r.data) {
    lh_errf(err, errlen, "no memory");
    release(m);
    unset(b);
    return LH_KV_ENOMEM;
  }
  r.data_end = r.data + data_bytes + ALIGN_SLACK;
  rc = read_batch(&r, &top);
  if (rc) {
    release(m);
    unset(b);
    return rc;
  }
  b->mem_ = m;
  return 0;
}

size_t lh_kv_batch_mem(const lh_kv_batch *b, int *one_allocation) {
  const kv_mem *m = b->mem_;
  if (one_allocation) *one_allocation = !m || m->zone.chunk_list.head == m->head;
  return m ? m->size : 0;
}

int lh_kv_batch_holds(const lh_kv_batch *b, const void *p, size_t len) {
  const kv_mem *m = b->mem_;
  if (!m || !p) return 0;
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)m->base;
  return a >= lo && a - lo <= m->size && len <= m->size - (a - lo);
}

int lh_kv_seq(const void *frame, size_t len, int64_t *seq) {
  if (len != 8 || !frame) return -1;
  uint64_t v = be(frame, 8);
  /* two's complement without an implementation-defined conversion */
  *seq = v >> 63 ? -(int64_t)(~v) - 1 : (int64_t)v;
  return 0;
}
