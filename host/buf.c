/* Growable byte buffers and header lists: the gateway's two containers. */
#include "lupin_host.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <utf8proc.h>

void lh_errf(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static int reserve(lh_buf *b, size_t more) {
  if (b->len + more + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + more + 1)
    cap *= 2;
  char *d = realloc(b->data, cap);
  if (!d) return -1;
  b->data = d;
  b->cap = cap;
  return 0;
}

int lh_buf_reserve(lh_buf *b, size_t more) {
  if (b->len + more + 1 <= b->cap) return 0;
  char *d = realloc(b->data, b->len + more + 1);
  if (!d) return -1;
  b->data = d;
  b->cap = b->len + more + 1;
  return 0;
}

/* Keeps a NUL after the data so texts can be read as C strings. */
int lh_buf_append(lh_buf *b, const char *data, size_t len) {
  if (reserve(b, len)) return -1;
  if (len) memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = 0;
  return 0;
}

int lh_buf_str(lh_buf *b, const char *s) { return lh_buf_append(b, s, strlen(s)); }

int lh_buf_uint(lh_buf *b, unsigned long long v) {
  char d[20];
  size_t k = sizeof d;
  do
    d[--k] = (char)('0' + v % 10);
  while (v /= 10);
  return lh_buf_append(b, d + k, sizeof d - k);
}

int lh_buf_fixed(lh_buf *b, double v, unsigned decimals) {
  static const double scale[] = {1, 10, 100, 1e3, 1e4, 1e5, 1e6};
  if (decimals >= sizeof scale / sizeof *scale) decimals = sizeof scale / sizeof *scale - 1;
  /* past 2^53 a double has no fraction left to show: %g's exponent form */
  if (!isfinite(v) || fabs(v) * scale[decimals] >= 9007199254740992.0) return lh_buf_number(b, v);
  if (v < 0 && lh_buf_append(b, "-", 1)) return -1;
  unsigned long long n = (unsigned long long)llround(fabs(v) * scale[decimals]);
  unsigned long long unit = (unsigned long long)scale[decimals];
  if (lh_buf_uint(b, n / unit)) return -1;
  if (!decimals) return 0;
  char d[8] = {'.'};
  unsigned long long frac = n % unit;
  for (unsigned i = decimals; i > 0; i--, frac /= 10)
    d[i] = (char)('0' + frac % 10);
  return lh_buf_append(b, d, decimals + 1);
}

int lh_buf_header(lh_buf *b, const char *name, const char *value) {
  size_t n = strlen(name), v = strlen(value);
  if (reserve(b, n + v + 4)) return -1;
  char *p = b->data + b->len;
  memcpy(p, name, n);
  memcpy(p + n, ": ", 2);
  memcpy(p + n + 2, value, v);
  memcpy(p + n + 2 + v, "\r\n", 3); /* the NUL too */
  b->len += n + v + 4;
  return 0;
}

/* Formats into the room left when it fits (the common case: a buffer reused
 * from request to request), measuring and growing only when it does not. */
int lh_buf_printf(lh_buf *b, const char *fmt, ...) {
  va_list ap;
  size_t room = b->cap > b->len ? b->cap - b->len : 0;
  va_start(ap, fmt);
  int n = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap);
  va_end(ap);
  if (n < 0) return -1;
  if ((size_t)n >= room) {
    if (reserve(b, (size_t)n)) {
      if (b->data) b->data[b->len] = 0;
      return -1;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  b->len += (size_t)n;
  return 0;
}

/* The length of the valid UTF-8 sequence at p (utf8proc decides: no
 * overlong forms, no surrogates, nothing past U+10FFFF), 0 when invalid. */
static size_t utf8_seq(const unsigned char *p, size_t left) {
  utf8proc_int32_t cp;
  utf8proc_ssize_t n = utf8proc_iterate(p, (utf8proc_ssize_t)(left < 4 ? left : 4), &cp);
  return n > 0 ? (size_t)n : 0;
}

/* Control characters escaped; bytes that are not UTF-8 become U+FFFD, so the
 * text stays valid JSON whatever a client sent (a request id, a path). */
int lh_buf_json(lh_buf *b, const char *s) {
  if (lh_buf_append(b, "\"", 1)) return -1;
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  size_t left = strlen((const char *)p);
  while (left) {
    size_t run = 0;
    while (run < left && p[run] >= 0x20 && p[run] < 0x80 && p[run] != '"' && p[run] != '\\')
      run++;
    int rc = lh_buf_append(b, (const char *)p, run);
    p += run;
    left -= run;
    if (rc) return -1;
    if (!left) break;
    size_t n = *p >= 0x80 ? utf8_seq(p, left) : 1;
    if (*p == '"' || *p == '\\')
      rc = lh_buf_printf(b, "\\%c", *p);
    else if (*p == '\n')
      rc = lh_buf_append(b, "\\n", 2);
    else if (*p < 0x20)
      rc = lh_buf_printf(b, "\\u%04x", *p);
    else if (n)
      rc = lh_buf_append(b, (const char *)p, n);
    else
      rc = lh_buf_append(b, "\\ufffd", 6);
    p += n ? n : 1;
    left -= n ? n : 1;
    if (rc) return -1;
  }
  return lh_buf_append(b, "\"", 1);
}

int lh_buf_label(lh_buf *b, const char *s) {
  if (lh_buf_append(b, "\"", 1)) return -1;
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  size_t left = strlen((const char *)p);
  while (left) {
    size_t n = *p >= 0x80 ? utf8_seq(p, left) : 1;
    int rc = *p == '\\'   ? lh_buf_append(b, "\\\\", 2)
             : *p == '"'  ? lh_buf_append(b, "\\\"", 2)
             : *p == '\n' ? lh_buf_append(b, "\\n", 2)
             : n          ? lh_buf_append(b, (const char *)p, n)
                          : lh_buf_append(b, "\xef\xbf\xbd", 3); /* U+FFFD */
    p += n ? n : 1;
    left -= n ? n : 1;
    if (rc) return -1;
  }
  return lh_buf_append(b, "\"", 1);
}

int lh_buf_number(lh_buf *b, double v) {
  return isfinite(v) ? lh_buf_printf(b, "%.17g", v) : lh_buf_append(b, "null", 4);
}

void lh_buf_free(lh_buf *b) {
  free(b->data);
  *b = (lh_buf){0};
}

struct lh_text_block {
  lh_text_block *next;
  size_t len, cap;
  char data[];
};

enum { TEXT_BLOCK = 1024 };

/* Appends data to the string *s, which is "" (a new string) or the last one
 * in the newest block: in place when the block has room, else the string
 * moves to a new block (the older block keeps the strings before it). */
static int text_append(lh_headers *h, const char **s, const char *data, size_t len) {
  lh_text_block *b = h->mem;
  size_t old = **s ? (size_t)(b->data + b->len - 1 - *s) : 0;
  if (!b || b->cap - b->len < len + (old ? 0 : 1)) {
    size_t cap = TEXT_BLOCK;
    while (cap < old + len + 1)
      cap *= 2;
    lh_text_block *nb = malloc(sizeof *nb + cap);
    if (!nb) return -1;
    nb->cap = cap;
    memcpy(nb->data, *s, old);
    nb->len = old + 1;
    nb->data[old] = 0;
    nb->next = b;
    h->mem = b = nb;
    *s = nb->data;
  } else if (!old) {
    *s = b->data + b->len;
    b->len++;
  }
  char *end = b->data + b->len - 1; /* the string's NUL */
  memcpy(end, data, len);
  end[len] = 0;
  b->len += len;
  return 0;
}

int lh_headers_add(lh_headers *h, const char *name, size_t nlen, const char *value, size_t vlen) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 16;
    lupin_header *v = realloc(h->v, cap * sizeof *v);
    if (!v) return -1;
    h->v = v;
    h->cap = cap;
  }
  lupin_header *e = &h->v[h->n];
  *e = (lupin_header){"", ""};
  if (text_append(h, &e->name, name, nlen) || (vlen && text_append(h, &e->value, value, vlen)))
    return -1;
  h->n++;
  return 0;
}

int lh_headers_field(lh_headers *h, const char *data, size_t len) {
  /* "content-length :5": http_parser frames by it, the other side may not */
  if (memchr(data, ' ', len) || memchr(data, '\t', len)) return 1;
  int rc = h->in_value || !h->n ? lh_headers_add(h, data, len, "", 0)
                                : text_append(h, &h->v[h->n - 1].name, data, len);
  h->in_value = 0;
  return rc;
}

int lh_headers_value(lh_headers *h, const char *data, size_t len) {
  if (!h->n) return -1;
  h->in_value = 1;
  return len ? text_append(h, &h->v[h->n - 1].value, data, len) : 0;
}

/* name in lower case, as every caller writes it */
const char *lh_headers_get(const lh_headers *h, const char *name) {
  for (size_t i = 0; i < h->n; i++)
    if (lh_name_is(h->v[i].name, name)) return h->v[i].value;
  return NULL;
}

void lh_headers_clear(lh_headers *h) {
  lh_text_block *b = h->mem;
  while (b && b->next) { /* keep the oldest block, unless a long header grew it */
    lh_text_block *next = b->next;
    free(b);
    b = next;
  }
  if (b && b->cap > TEXT_BLOCK) {
    free(b);
    b = NULL;
  }
  h->mem = b;
  if (b) b->len = 0;
  h->n = 0;
  h->in_value = 0;
}

void lh_headers_free(lh_headers *h) {
  lh_headers_clear(h);
  free(h->mem);
  free(h->v);
  *h = (lh_headers){0};
}

int lh_name_in(const char *name, const lh_name *set, size_t n) {
  size_t len = strlen(name);
  for (size_t i = 0; i < n; i++)
    if (set[i].len == len && lh_name_is(name, set[i].s)) return 1;
  return 0;
}

/* Every header of every message on both sides comes here: looked up by
 * length, each length having two names at most. */
int lh_hop_by_hop(const char *name) {
  static const char *const by_length[18][2] = {
      [2] = {"te"},
      [4] = {"host"},
      [6] = {"expect"},
      [7] = {"upgrade", "trailer"},
      [10] = {"connection", "keep-alive"},
      [14] = {"content-length"},
      [16] = {"proxy-connection"},
      [17] = {"transfer-encoding"},
  };
  size_t len = strnlen(name, 18);
  if (len == 18) return 0;
  for (int i = 0; i < 2 && by_length[len][i]; i++)
    if (lh_name_is(name, by_length[len][i])) return 1;
  return 0;
}
