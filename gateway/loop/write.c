/* Writing to a socket without libuv's write request when the socket takes the
 * bytes at once, which on loopback and on most replies it does.  A uv_write
 * that completes at once still costs a request, a copy kept for it, and an
 * epoll_ctl on the next loop turn (libuv drops and re-arms POLLOUT); most of
 * the gateway's writes need none of that.  Only what the socket did not take
 * is copied and queued, behind which later writes queue too (uv_try_write
 * refuses while a write is queued), so the order of bytes holds. */
#include "loop/loop.h"

#include <stdlib.h>
#include <string.h>

typedef struct queued {
  uv_write_t w;
  gw_written_fn cb;
  void *data;
  char bytes[];
} queued;

static void on_queued_written(uv_write_t *w, int status) {
  queued *q = (queued *)w;
  gw_written_fn cb = q->cb;
  void *data = q->data;
  uv_stream_t *s = w->handle;
  free(q);
  if (cb) cb(s, status, data);
}

static size_t total(const uv_buf_t *parts, unsigned n) {
  size_t len = 0;
  for (unsigned i = 0; i < n; i++)
    len += parts[i].len;
  return len;
}

/* Queues the parts' bytes from offset skip on: one copy, one request. */
static int queue_rest(uv_stream_t *s, const uv_buf_t *parts, unsigned n, size_t skip,
                      gw_written_fn cb, void *data) {
  size_t len = total(parts, n) - skip;
  queued *q = malloc(sizeof *q + len);
  if (!q) return UV_ENOMEM;
  q->cb = cb;
  q->data = data;
  size_t off = 0;
  for (unsigned i = 0; i < n; i++) {
    size_t from = skip < parts[i].len ? skip : parts[i].len;
    skip -= from;
    memcpy(q->bytes + off, parts[i].base + from, parts[i].len - from);
    off += parts[i].len - from;
  }
  uv_buf_t b = uv_buf_init(q->bytes, (unsigned)len);
  int rc = uv_write(&q->w, s, &b, 1, on_queued_written);
  if (rc) free(q);
  return rc;
}

typedef struct kept {
  uv_write_t w;
  gw_written_fn cb;
  void *data;
} kept;

static void on_kept_written(uv_write_t *w, int status) {
  kept *k = (kept *)w;
  gw_written_fn cb = k->cb;
  void *data = k->data;
  uv_stream_t *s = w->handle;
  free(k);
  if (cb) cb(s, status, data);
}

enum { KEPT_PARTS = 4 };

int gw_write_kept(uv_stream_t *s, const uv_buf_t *parts, unsigned n, gw_written_fn cb, void *data) {
  size_t len = total(parts, n);
  if (len == 0) return 0;
  if (n > KEPT_PARTS) return UV_EINVAL;
  int rc = uv_try_write(s, parts, n);
  if (rc >= 0 && (size_t)rc == len) return 0;
  if (rc < 0 && rc != UV_EAGAIN) return rc;
  /* the parts from the first byte the socket did not take; libuv keeps
   * this list, the bytes stay the caller's */
  size_t skip = rc < 0 ? 0 : (size_t)rc;
  uv_buf_t rest[KEPT_PARTS];
  unsigned m = 0;
  for (unsigned i = 0; i < n; i++) {
    size_t from = skip < parts[i].len ? skip : parts[i].len;
    skip -= from;
    if (parts[i].len > from)
      rest[m++] = uv_buf_init(parts[i].base + from, (unsigned)(parts[i].len - from));
  }
  kept *k = malloc(sizeof *k);
  if (!k) return UV_ENOMEM;
  k->cb = cb;
  k->data = data;
  rc = uv_write(&k->w, s, rest, m, on_kept_written);
  if (rc) free(k);
  return rc;
}

int gw_write(uv_stream_t *s, const uv_buf_t *parts, unsigned n, gw_written_fn cb, void *data) {
  size_t len = total(parts, n);
  if (len == 0) return 0;
  int rc = uv_try_write(s, parts, n);
  if (rc >= 0 && (size_t)rc == len) return 0;
  if (rc < 0 && rc != UV_EAGAIN) return rc;
  return queue_rest(s, parts, n, rc < 0 ? 0 : (size_t)rc, cb, data);
}
