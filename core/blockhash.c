/* Chained block hashing of a prompt, the key of the prefix index.
 *
 * A prompt is cut into blocks of block_size characters; only full blocks are
 * hashed (a model server caches only full blocks, so a trailing partial block
 * can never be a hit).  Each block's hash covers the previous one, so equal
 * hashes at position i mean equal prompts up to the end of block i:
 *
 *   seed  = xxh64(model ‖ cache_salt)
 *   h[i]  = xxh64(block[i] ‖ le64(h[i-1])),  h[-1] = seed
 *
 * every xxh64 with seed 0.  The model and salt go into the seed, so two
 * models (or two tenants with different cache_salt) never share a block. */
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack: no malloc per block */
#include "internal.h"

#include <limits.h>
#include <string.h>
#include <xxhash.h>

/* Blocks up to this size are hashed in one call over a stack buffer; this is
 * faster than the streaming state for the usual 64-256 character blocks. */
#define SMALL_BLOCK 512

/* One store (GCC left a loop of byte stores a loop: ~45 instructions a
 * block); the bytes swapped first on a big-endian host. */
static void le64(unsigned char out[8], uint64_t v) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  memcpy(out, &v, 8);
}

uint64_t lupin_block_seed(const char *model, size_t model_len, const char *salt, size_t salt_len) {
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  if (model_len) XXH64_update(&st, model, model_len);
  if (salt_len) XXH64_update(&st, salt, salt_len);
  return XXH64_digest(&st);
}

static uint64_t chain_small(const char *block, size_t n, uint64_t prev) {
  unsigned char buf[SMALL_BLOCK + 8];
  memcpy(buf, block, n);
  le64(buf + n, prev);
  return XXH64(buf, n + 8, 0);
}

static uint64_t chain_stream(const char *block, size_t n, uint64_t prev) {
  unsigned char tail[8];
  XXH64_state_t st;
  le64(tail, prev);
  XXH64_reset(&st, 0);
  XXH64_update(&st, block, n);
  XXH64_update(&st, tail, 8);
  return XXH64_digest(&st);
}

long lupin_block_hashes(const lupin_hash_input *in, uint64_t *out, size_t cap) {
  if (!in || in->block_size == 0 || (cap && !out) || (in->prompt_len && !in->prompt)) return -1;
  size_t n = in->prompt_len / in->block_size;
  if (n > in->max_blocks) n = in->max_blocks;
  if (n > cap) n = cap;
  uint64_t h = lupin_block_seed(in->model, in->model_len, in->salt, in->salt_len);
  size_t bs = in->block_size;
  for (size_t i = 0; i < n; i++) {
    const char *block = in->prompt + i * bs;
    h = bs <= SMALL_BLOCK ? chain_small(block, bs, h) : chain_stream(block, bs, h);
    out[i] = h;
  }
  return (long)n;
}

/* --- token-id blocks ---------------------------------------------------------
 *
 * The same chain over a prompt's token ids, the key the engines' KV-cache
 * events can be mapped to (docs/prefix-index.md): an event carries the token
 * ids of the block it stored, so lupin hashes them itself instead of trusting
 * the engine's random-seeded hash.
 *
 *   seed  = xxh64("lupin-tokens\0" ‖ le64(len) hash_seed ‖ le64(len) lora ‖ le64(len) salt)
 *   h[i]  = xxh64(le32(id) … of block i ‖ le64(h[i-1])),  h[-1] = prev
 *
 * The tag keeps a token chain from ever meeting a character chain; the
 * lengths keep ("ab", "c") apart from ("a", "bc"). */

static const char TOKEN_TAG[] = "lupin-tokens"; /* hashed with its NUL */

static void update_field(XXH64_state_t *st, const char *p, size_t n) {
  unsigned char len[8];
  le64(len, (uint64_t)n);
  XXH64_update(st, len, 8);
  if (n) XXH64_update(st, p, n);
}

uint64_t lupin_token_seed(const char *hash_seed, size_t hash_seed_len, const char *lora,
                          size_t lora_len, const char *salt, size_t salt_len) {
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  XXH64_update(&st, TOKEN_TAG, sizeof TOKEN_TAG);
  update_field(&st, hash_seed, hash_seed ? hash_seed_len : 0);
  update_field(&st, lora, lora ? lora_len : 0);
  update_field(&st, salt, salt ? salt_len : 0);
  return XXH64_digest(&st);
}

/* Token blocks up to this many ids go through one buffer on the stack (the
 * engines' 16-64 token blocks); longer ones through the streaming state. */
#define SMALL_TOKENS 128

static void le32s(unsigned char *out, const uint32_t *ids, size_t n) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (size_t i = 0; i < n; i++) {
    uint32_t v = __builtin_bswap32(ids[i]);
    memcpy(out + 4 * i, &v, 4);
  }
#else
  memcpy(out, ids, n * 4);
#endif
}

static uint64_t token_chain_small(const uint32_t *ids, size_t n, uint64_t prev) {
  unsigned char buf[SMALL_TOKENS * 4 + 8];
  le32s(buf, ids, n);
  le64(buf + n * 4, prev);
  return XXH64(buf, n * 4 + 8, 0);
}

static uint64_t token_chain_stream(const uint32_t *ids, size_t n, uint64_t prev) {
  unsigned char buf[SMALL_TOKENS * 4];
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  for (size_t i = 0; i < n; i += SMALL_TOKENS) {
    size_t k = n - i < SMALL_TOKENS ? n - i : SMALL_TOKENS;
    le32s(buf, ids + i, k);
    XXH64_update(&st, buf, k * 4);
  }
  le64(buf, prev);
  XXH64_update(&st, buf, 8);
  return XXH64_digest(&st);
}

long lupin_token_block_hashes(uint64_t prev, const uint32_t *ids, size_t n, size_t block_size,
                              uint64_t *out, size_t cap) {
  if (block_size == 0 || (n && !ids) || (cap && !out)) return -1;
  size_t blocks = n / block_size;
  if (blocks > cap) blocks = cap;
  if (blocks > LONG_MAX) blocks = LONG_MAX;
  uint64_t h = prev;
  for (size_t i = 0; i < blocks; i++) {
    const uint32_t *block = ids + i * block_size;
    h = block_size <= SMALL_TOKENS ? token_chain_small(block, block_size, h)
                                   : token_chain_stream(block, block_size, h);
    out[i] = h;
  }
  return (long)blocks;
}
