/* The native reference's JSON decode: simdjson's On-Demand API (Debian's
 * libsimdjson-dev), the fastest C/C++ parser Debian packages -- what a careful
 * C engineer would reach for, so lupin is measured against it rather than
 * against a slower parser.  C++ behind a C interface (bench.h) so native.c
 * stays C. */
#include "bench.h"

#include <simdjson.h>

#include <cstdlib>
#include <cstring>
#include <new>

struct native_json {
  simdjson::ondemand::parser parser;
  /* simdjson reads up to SIMDJSON_PADDING bytes past the text: bodies are
   * copied here, as a server would read them into a padded buffer */
  char *buf = nullptr;
  size_t cap = 0;
};

extern "C" native_json *native_json_new(void) { return new (std::nothrow) native_json(); }

extern "C" void native_json_free(native_json *j) {
  if (!j) return;
  std::free(j->buf);
  delete j;
}

/* A string field, or "" when absent or not a string. */
static void field(simdjson::ondemand::object &o, const char *k, const char **s, size_t *len) {
  std::string_view v;
  if (o.find_field_unordered(k).get_string().get(v)) {
    *s = "", *len = 0;
  } else {
    *s = v.data(), *len = v.size();
  }
}

extern "C" int native_json_decode(native_json *j, const char *text, size_t len,
                                  native_fields *out) {
  if (len + simdjson::SIMDJSON_PADDING > j->cap) {
    j->cap = 2 * (len + simdjson::SIMDJSON_PADDING);
    std::free(j->buf);
    j->buf = static_cast<char *>(std::malloc(j->cap));
    if (!j->buf) return j->cap = 0, -1;
  }
  std::memcpy(j->buf, text, len);
  simdjson::ondemand::document doc;
  if (j->parser.iterate(j->buf, len, j->cap).get(doc)) return -1;
  simdjson::ondemand::object o;
  if (doc.get_object().get(o)) return -1;
  field(o, "model", &out->model, &out->model_len);
  field(o, "cache_salt", &out->salt, &out->salt_len);
  field(o, "prompt", &out->prompt, &out->prompt_len);
  return 0;
}
