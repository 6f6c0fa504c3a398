/* The EPP's model-name rewrite (x-llm-d-model-name-rewrite, formerly
 * x-gateway-model-name-rewrite): the body forwarded names the model the
 * request was scheduled for, not the one the client sent.  Every host
 * forwarding a body does it the same way (lupin serve, the nginx module).
 *
 * The model's value is replaced where it stands and every other byte is the
 * client's: decoding and encoding the JSON again would reformat its numbers
 * (0.7 as 0.69999999999999996) and reorder nothing useful.  The runtime has
 * already checked the body as strict JSON (lupin_request_desc.check_body),
 * so the scan below tracks structure only; a body it cannot follow is
 * forwarded unchanged. */
#include "lupin_host.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
  const char *p, *end;
} cursor;

static void ws(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
    c->p++;
}

/* A string from its opening quote; c->p ends past the closing one. */
static int skip_string(cursor *c) {
  if (c->p >= c->end || *c->p != '"') return -1;
  for (c->p++; c->p < c->end; c->p++) {
    if (*c->p == '\\') {
      if (++c->p >= c->end) return -1;
    } else if (*c->p == '"') {
      c->p++;
      return 0;
    }
  }
  return -1;
}

/* Any value: strings, nested objects and arrays (brackets outside strings
 * counted), literals and numbers up to the next delimiter. */
static int skip_value(cursor *c) {
  if (c->p >= c->end) return -1;
  if (*c->p == '"') return skip_string(c);
  int depth = 0;
  while (c->p < c->end) {
    char ch = *c->p;
    if (ch == '"') {
      if (skip_string(c)) return -1;
      continue;
    }
    if (ch == '{' || ch == '[') depth++;
    if (ch == '}' || ch == ']') {
      if (depth == 0) return 0; /* the enclosing object's end */
      depth--;
    }
    if (ch == ',' && depth == 0) return 0;
    c->p++;
    if (depth == 0 && (ch == '}' || ch == ']')) return 0;
  }
  return depth ? -1 : 0;
}

/* The span of the top-level "model" string value (its quotes included): the
 * last one, as the runtime's decoder keeps the last of duplicate keys. */
static int find_model(const char *text, size_t len, size_t *at, size_t *n) {
  cursor c = {text, text + len};
  int found = 0;
  ws(&c);
  if (c.p >= c.end || *c.p++ != '{') return -1;
  for (;;) {
    ws(&c);
    if (c.p < c.end && *c.p == '}') return found ? 0 : -1;
    const char *key = c.p;
    if (skip_string(&c)) return -1;
    int is_model = c.p - key == 7 && !memcmp(key, "\"model\"", 7);
    ws(&c);
    if (c.p >= c.end || *c.p++ != ':') return -1;
    ws(&c);
    const char *value = c.p;
    if (skip_value(&c)) return -1;
    if (is_model && *value == '"') {
      *at = (size_t)(value - text);
      *n = (size_t)(c.p - value);
      found = 1;
    }
    ws(&c);
    if (c.p < c.end && *c.p == ',') {
      c.p++;
      continue;
    }
    if (c.p < c.end && *c.p == '}') return found ? 0 : -1;
    return -1;
  }
}

/* The first occurrence of needle in hay[0..len), or NULL (memmem is GNU). */
static const char *find(const char *hay, size_t len, const char *needle, size_t n) {
  for (const char *p = hay; n <= len && p <= hay + len - n; p++) {
    p = memchr(p, needle[0], (size_t)(hay + len - n - p) + 1);
    if (!p) return NULL;
    if (!memcmp(p, needle, n)) return p;
  }
  return NULL;
}

/* Whether s[0..len) holds word, ignoring case. */
static int has(const char *s, size_t len, const char *word) {
  size_t n = strlen(word);
  for (size_t i = 0; i + n <= len; i++)
    if (!strncasecmp(s + i, word, n)) return 1;
  return 0;
}

/* The span of the value of a multipart/form-data body's "model" field
 * (RFC 7578): between its part's blank line and the next delimiter. */
static int find_form_model(const char *text, size_t len, const char *content_type, size_t *at,
                           size_t *n) {
  const char *b = NULL;
  for (const char *p = content_type; *p && !b; p++)
    if (!strncasecmp(p, "boundary=", 9)) b = p + 9;
  if (!b) return -1;
  int quoted = *b == '"';
  b += quoted;
  size_t blen = strcspn(b, quoted ? "\"" : "; \t");
  if (!blen || blen > 200) return -1;
  char delim[210] = "\r\n--";
  memcpy(delim + 4, b, blen);
  size_t dlen = blen + 4;
  const char *end = text + len, *part;
  if (len >= dlen - 2 && !memcmp(text, delim + 2, dlen - 2)) /* no CRLF before the first */
    part = text + dlen - 2;
  else if ((part = find(text, len, delim, dlen)))
    part += dlen;
  while (part && part < end) {
    const char *head_end = find(part, (size_t)(end - part), "\r\n\r\n", 4);
    if (!head_end) return -1;
    const char *value = head_end + 4;
    const char *next = find(value, (size_t)(end - value), delim, dlen);
    if (!next) return -1;
    size_t hlen = (size_t)(head_end - part);
    if (has(part, hlen, "name=\"model\"") && !has(part, hlen, "filename=")) {
      *at = (size_t)(value - text);
      *n = (size_t)(next - value);
      return 0;
    }
    part = next + dlen;
  }
  return -1;
}

int lh_model_rewrite(lh_buf *body, const char *content_type, const char *model, char **was) {
  size_t at = 0, n = 0; /* set by the find on success; -O1 cannot tell */
  int form = content_type && !strncasecmp(content_type, "multipart/form-data", 19);
  if (!body->data || (form ? find_form_model(body->data, body->len, content_type, &at, &n)
                           : find_model(body->data, body->len, &at, &n)))
    return -1;
  lh_buf out = {0};
  lh_buf_append(&out, body->data, at);
  if (form)
    lh_buf_append(&out, model, strlen(model));
  else
    lh_buf_json(&out, model);
  lh_buf_append(&out, body->data + at + n, body->len - at - n);
  if (!out.data) return -1;
  /* the name replaced, for the metrics' model_name: a JSON string's escapes
   * kept as they are (a label, not a key) */
  size_t q = form ? 0 : 1;
  *was = strndup(body->data + at + q, n - 2 * q);
  lh_buf_free(body);
  *body = out;
  return 0;
}
