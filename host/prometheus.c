/* Reading the Prometheus text exposition format (version 0.0.4): one sample
 * per line, `name{label="value",...} value [timestamp]`, comments with #.
 * Only what scraping needs: names, labels, values. */
#include "lupin_host.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LABELS 32

static const char *skip_spaces(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t'))
    p++;
  return p;
}

/* Reads a quoted label value with its escapes (\\, \", \n) into out: the
 * runs between escapes are copied whole. */
static const char *read_quoted(const char *p, const char *end, lh_buf *out) {
  if (p >= end || *p != '"') return NULL;
  p++;
  while (p < end && *p != '"') {
    const char *run = p;
    while (p < end && *p != '"' && *p != '\\')
      p++;
    if (lh_buf_append(out, run, (size_t)(p - run))) return NULL;
    if (p < end && *p == '\\' && p + 1 < end) {
      char ch = p[1] == 'n' ? '\n' : p[1];
      if (lh_buf_append(out, &ch, 1)) return NULL;
      p += 2;
    } else if (p < end && *p == '\\') {
      p++; /* a backslash ending the line: unterminated anyway */
    }
  }
  if (lh_buf_append(out, "", 0)) return NULL;
  return p < end ? p + 1 : NULL;
}

/* Labels go into one buffer as name\0value\0... pairs. */
static const char *read_labels(const char *p, const char *end, lh_buf *store, size_t *offsets,
                               size_t *n) {
  p++; /* '{' */
  for (;;) {
    p = skip_spaces(p, end);
    if (p < end && *p == '}') return p + 1;
    const char *name = p;
    while (p < end && (isalnum((unsigned char)*p) || *p == '_'))
      p++;
    if (p == name || *n >= MAX_LABELS) return NULL;
    offsets[2 * *n] = store->len;
    if (lh_buf_append(store, name, (size_t)(p - name)) || lh_buf_append(store, "", 1)) return NULL;
    p = skip_spaces(p, end);
    if (p >= end || *p != '=') return NULL;
    p = skip_spaces(p + 1, end);
    offsets[2 * *n + 1] = store->len;
    p = read_quoted(p, end, store);
    if (!p) return NULL;
    store->len++; /* keep the NUL read_quoted left */
    (*n)++;
    p = skip_spaces(p, end);
    if (p < end && *p == ',') p++;
  }
}

static double read_value(const char *p, const char *end, int *ok) {
  char num[64];
  size_t k = 0;
  while (p < end && *p != ' ' && *p != '\t' && k < sizeof num - 1)
    num[k++] = *p++;
  num[k] = 0;
  char *stop;
  double v = strtod(num, &stop); /* takes NaN, +Inf, -Inf, exponents */
  *ok = k > 0 && *stop == 0;
  return v;
}

/* store: names and label texts of the line, emptied first (one buffer for
 * every line of a text, not an allocation per line). */
static int parse_line(const char *p, const char *end, lh_buf *store, lh_sample_fn fn, void *ud) {
  const char *name = p;
  while (p < end && (isalnum((unsigned char)*p) || *p == '_' || *p == ':'))
    p++;
  if (p == name) return -1;
  size_t offsets[2 * MAX_LABELS], n = 0;
  store->len = 0;
  lh_buf_append(store, name, (size_t)(p - name));
  lh_buf_append(store, "", 1);
  if (p < end && *p == '{') p = read_labels(p, end, store, offsets, &n);
  int ok = 0;
  double v = p ? read_value(skip_spaces(p, end), end, &ok) : 0;
  if (ok && store->data) {
    lupin_header labels[MAX_LABELS];
    for (size_t i = 0; i < n; i++)
      labels[i] = (lupin_header){store->data + offsets[2 * i], store->data + offsets[2 * i + 1]};
    fn(ud, store->data, labels, n, v);
  }
  return ok ? 0 : -1;
}

int lh_prometheus_parse(const char *text, size_t len, lh_sample_fn fn, void *ud) {
  int bad = 0;
  lh_buf store = {0};
  if (!len) return 0; /* an empty body: text may be NULL, and NULL + 0 is undefined */
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    const char *line_end = eol > p && eol[-1] == '\r' ? eol - 1 : eol;
    const char *s = skip_spaces(p, line_end);
    if (s < line_end && *s != '#' && parse_line(s, line_end, &store, fn, ud)) bad++;
    p = eol + 1;
  }
  lh_buf_free(&store);
  return bad;
}
