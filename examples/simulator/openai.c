/* The OpenAI request and response shapes, as vLLM's server produces them.
 *
 * Parsing validates like vLLM (types, bounds, context length) and turns the
 * prompt into what the engine needs: its token ids (tokens.c), the cache salt
 * and a seed for the generated text. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <xxhash.h>

#include "sim.h"

/* ---- errors ------------------------------------------------------------------- */

void openai_error(http_reply *r, int status, const char *type, const char *param, const char *code,
                  const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", msg, "type", type, "param",
                        param ? json_string(param) : json_null(), "code",
                        code ? json_string(code) : json_null());
  char *s = json_dumps(o, JSON_COMPACT);
  r->status = status;
  r->body.len = 0;
  sb_adds(&r->body, s);
  free(s);
  json_decref(o);
}

const char *openai_type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return "an object";
  case JSON_ARRAY:
    return "an array";
  case JSON_STRING:
    return "a string";
  case JSON_INTEGER:
    return "an integer";
  case JSON_REAL:
    return "a number";
  case JSON_TRUE:
  case JSON_FALSE:
    return "a boolean";
  default:
    return "null";
  }
}

bool openai_bad_type(http_reply *err, const char *param, const char *want, const json_t *v) {
  openai_error(err, 400, "invalid_request_error", param, NULL, "'%s' must be %s, got %s", param,
               want, openai_type_name(v));
  return false;
}

/* ---- parameters --------------------------------------------------------------- */

static bool get_bool(json_t *body, const char *key, bool *out, http_reply *err) {
  json_t *v = json_object_get(body, key);
  if (!v || json_is_null(v)) return true;
  if (!json_is_boolean(v)) return openai_bad_type(err, key, "a boolean", v);
  *out = json_is_true(v);
  return true;
}

static bool get_max_tokens(json_t *body, const char *key, int *out, http_reply *err) {
  json_t *v = json_object_get(body, key);
  if (!v || json_is_null(v)) return true;
  if (!json_is_integer(v)) return openai_bad_type(err, key, "an integer", v);
  json_int_t n = json_integer_value(v);
  if (n < 1) {
    openai_error(err, 400, "invalid_request_error", key, NULL, "'%s' must be at least 1, got %lld",
                 key, (long long)n);
    return false;
  }
  *out = n > 1000000 ? 1000000 : (int)n;
  return true;
}

/* n: how many choices, 1 to 128 (each as long as the first: the engine runs
 * the request once and the choices differ by their token seed). */
static bool get_n(json_t *body, int *out, http_reply *err) {
  json_t *v = json_object_get(body, "n");
  if (!v || json_is_null(v)) return true;
  if (!json_is_integer(v)) return openai_bad_type(err, "n", "an integer", v);
  json_int_t n = json_integer_value(v);
  if (n < 1 || n > 128) {
    openai_error(err, 400, "invalid_request_error", "n", NULL,
                 "'n' must be from 1 to 128, got %lld", (long long)n);
    return false;
  }
  *out = (int)n;
  return true;
}

static bool stream_flags(json_t *body, job *j, http_reply *err) {
  if (!get_bool(body, "stream", &j->stream, err)) return false;
  json_t *so = json_object_get(body, "stream_options");
  if (!so || json_is_null(so)) return true;
  if (!json_is_object(so)) return openai_bad_type(err, "stream_options", "an object", so);
  if (!j->stream) {
    openai_error(err, 400, "invalid_request_error", "stream_options", NULL,
                 "'stream_options' can only be set when 'stream' is true");
    return false;
  }
  json_t *iu = json_object_get(so, "include_usage");
  if (iu && !json_is_null(iu) && !json_is_boolean(iu))
    return openai_bad_type(err, "stream_options.include_usage", "a boolean", iu);
  j->include_usage = json_is_true(iu);
  return true;
}

/* The base model or one of the adapters; -2 when unknown. */
static int model_index(const sim_config *cfg, const char *name) {
  if (strcmp(name, cfg->model) == 0) return -1;
  for (int i = 0; i < cfg->nloras; i++)
    if (strcmp(name, cfg->loras[i]) == 0) return i;
  return -2;
}

static bool resolve_model(const endpoint *ep, json_t *body, job *j, http_reply *err) {
  const sim_config *cfg = &ep->sim->cfg;
  json_t *m = json_object_get(body, "model");
  if (!m) {
    openai_error(err, 400, "invalid_request_error", "model", NULL,
                 "Missing required parameter 'model'");
    return false;
  }
  if (!json_is_string(m)) return openai_bad_type(err, "model", "a string", m);
  const char *name = json_string_value(m);
  j->lora = model_index(cfg, name);
  if (j->lora == -2) {
    strbuf known = {0};
    sb_printf(&known, "'%s'", cfg->model);
    for (int i = 0; i < cfg->nloras; i++)
      sb_printf(&known, ", '%s'", cfg->loras[i]);
    openai_error(err, 404, "invalid_request_error", "model", "model_not_found",
                 "The model '%.200s' does not exist: this endpoint serves %.700s", name,
                 known.data);
    sb_free(&known);
    return false;
  }
  j->model = strdup(name);
  return true;
}

static bool check_length(const endpoint *ep, job *j, http_reply *err) {
  int limit = ep->sim->cfg.max_model_len;
  if ((long)j->prompt_tokens + j->max_tokens <= limit) return true;
  openai_error(err, 400, "invalid_request_error", j->kind == JOB_CHAT ? "messages" : "prompt", NULL,
               "This model's maximum context length is %d tokens. However, you requested %ld "
               "tokens (%d in the prompt, %d in the completion). Please reduce the length of "
               "the prompt or completion.",
               limit, (long)j->prompt_tokens + j->max_tokens, j->prompt_tokens, j->max_tokens);
  return false;
}

static bool parse_body(endpoint *ep, json_t *body, job *j, http_reply *err) {
  if (!resolve_model(ep, body, j, err)) return false;
  if (!(j->kind == JOB_CHAT ? tok_chat_prompt(body, &j->prompt, err)
                            : tok_completion_prompt(body, &j->prompt, err)))
    return false;
  if (!stream_flags(body, j, err)) return false;
  j->n = 1;
  if (!get_n(body, &j->n, err)) return false;
  j->max_tokens = ep->sim->cfg.default_max_tokens;
  if (!get_max_tokens(body, "max_tokens", &j->max_tokens, err)) return false;
  if (j->kind == JOB_CHAT && !get_max_tokens(body, "max_completion_tokens", &j->max_tokens, err))
    return false;
  json_t *salt = json_object_get(body, "cache_salt");
  if (salt && !json_is_null(salt) && !json_is_string(salt))
    return openai_bad_type(err, "cache_salt", "a string", salt);
  if (json_is_string(salt)) j->salt = strdup(json_string_value(salt));
  j->prompt_tokens = j->prompt.n ? j->prompt.n : 1;
  if (!check_length(ep, j, err)) return false;
  j->text_seed = XXH64(j->prompt.ids ? (const void *)j->prompt.ids : "",
                       (size_t)j->prompt.n * sizeof *j->prompt.ids, ep->sim->cfg.seed);
  return true;
}

job *openai_parse(endpoint *ep, enum job_kind kind, const char *body, size_t len, http_reply *err) {
  json_error_t jerr;
  json_t *root = json_loadb(body, len, 0, &jerr);
  if (!root) {
    openai_error(err, 400, "invalid_request_error", NULL, NULL,
                 "Invalid JSON in request body: %s (line %d, column %d)", jerr.text, jerr.line,
                 jerr.column);
    return NULL;
  }
  if (!json_is_object(root)) {
    openai_error(err, 400, "invalid_request_error", NULL, NULL,
                 "The request body must be a JSON object, got %s", openai_type_name(root));
    json_decref(root);
    return NULL;
  }
  job *j = calloc(1, sizeof *j);
  if (!j) abort();
  j->ep = ep;
  j->kind = kind;
  j->drop_at = -1;
  bool ok = parse_body(ep, root, j, err);
  json_decref(root);
  if (!ok) {
    job_free(j);
    return NULL;
  }
  char id[64];
  snprintf(id, sizeof id, "%s-%d-%llu", kind == JOB_CHAT ? "chatcmpl" : "cmpl", ep->index,
           (unsigned long long)++ep->seq);
  j->id = strdup(id);
  j->created = (uint64_t)wall_seconds();
  return j;
}

/* ---- responses ------------------------------------------------------------------ */

/* Short words, about four characters each, so output tokens ~ characters / 4 too. */
static const char *const vocab[] = {
    " the",   " lupin", " sim",  " data",  " node", " fast", " cache", " load",
    " token", " path",  " gate", " plan",  " pick", " run",  " flow",  " seed",
    " hash",  " time",  " lane", " queue", " and",  " of",   " to",    " in",
    " a",     " is",    " on",   " by",    " it",   " we",   ".",      ",",
};

/* Token index of choice c: choice 0 is the text openai_token gives. */
static const char *choice_token(const job *j, int c, int index) {
  uint64_t s =
      j->text_seed + (uint64_t)c * 0xd1b54a32d192ed03ULL + (uint64_t)index * 0x9e3779b97f4a7c15ULL;
  return vocab[rng_next(&s) % (sizeof vocab / sizeof vocab[0])];
}

const char *openai_token(const job *j, int index) { return choice_token(j, 0, index); }

static json_t *usage_json(const job *j) {
  int completion = j->generated * j->n;
  return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", j->prompt_tokens,
                   "completion_tokens", completion, "total_tokens", j->prompt_tokens + completion,
                   "prompt_tokens_details", "cached_tokens", j->cached_tokens);
}

static json_t *envelope(const job *j, const char *object) {
  return json_pack("{s:s, s:s, s:I, s:s}", "id", j->id, "object", object, "created",
                   (json_int_t)j->created, "model", j->model);
}

/* Appends one SSE event; the events of one engine tick go out in one write. */
static void add_event(strbuf *out, json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT);
  sb_adds(out, "data: ");
  sb_adds(out, s);
  sb_adds(out, "\n\n");
  free(s);
  json_decref(o);
}

static json_t *chunk_choice(const job *j, int c, const char *text, bool role, bool last) {
  json_t *reason = last ? json_string("length") : json_null();
  if (j->kind == JOB_COMPLETION)
    return json_pack("{s:i, s:s, s:n, s:o}", "index", c, "text", text, "logprobs", "finish_reason",
                     reason);
  json_t *delta = role ? json_pack("{s:s, s:s}", "role", "assistant", "content", text)
                       : json_pack("{s:s}", "content", text);
  return json_pack("{s:i, s:o, s:n, s:o}", "index", c, "delta", delta, "logprobs", "finish_reason",
                   reason);
}

static void add_chunk(strbuf *out, const job *j, int c, const char *text, bool role, bool last) {
  json_t *o = envelope(j, j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion");
  json_object_set_new(o, "choices", json_pack("[o]", chunk_choice(j, c, text, role, last)));
  add_event(out, o);
}

/* Each token step as one chunk per choice, choices in order (as vLLM
 * interleaves them). */
void openai_stream_tokens(job *j, int from, int to, bool finished) {
  if (!j->conn) return;
  strbuf out = {0};
  /* vLLM's chat stream opens with the assistant role and empty content. */
  if (from == 0 && j->kind == JOB_CHAT)
    for (int c = 0; c < j->n; c++)
      add_chunk(&out, j, c, "", true, false);
  for (int i = from; i < to; i++)
    for (int c = 0; c < j->n; c++)
      add_chunk(&out, j, c, choice_token(j, c, i), false, finished && i == to - 1);
  if (out.len) conn_stream_chunk(j->conn, out.data, out.len);
  sb_free(&out);
}

static void finish_stream(job *j) {
  strbuf out = {0};
  if (j->include_usage) {
    json_t *o = envelope(j, j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_json(j));
    add_event(&out, o);
  }
  sb_adds(&out, "data: [DONE]\n\n");
  conn_stream_end(j->conn, out.data, out.len);
  sb_free(&out);
}

static json_t *full_choice(const job *j, int c, const char *text) {
  if (j->kind == JOB_CHAT)
    return json_pack("{s:i, s:{s:s, s:s}, s:n, s:s}", "index", c, "message", "role", "assistant",
                     "content", text, "logprobs", "finish_reason", "length");
  return json_pack("{s:i, s:s, s:n, s:s}", "index", c, "text", text, "logprobs", "finish_reason",
                   "length");
}

static void finish_body(job *j) {
  json_t *choices = json_array();
  json_array_append_new(choices, full_choice(j, 0, j->text.data ? j->text.data : ""));
  for (int c = 1; c < j->n; c++) { /* the first choice's text was kept as it was generated */
    strbuf text = {0};
    for (int i = 0; i < j->generated; i++)
      sb_adds(&text, choice_token(j, c, i));
    json_array_append_new(choices, full_choice(j, c, text.data ? text.data : ""));
    sb_free(&text);
  }
  json_t *o = envelope(j, j->kind == JOB_CHAT ? "chat.completion" : "text_completion");
  json_object_set_new(o, "choices", choices);
  json_object_set_new(o, "usage", usage_json(j));
  char *s = json_dumps(o, JSON_COMPACT);
  conn_reply(j->conn, 200, "application/json", s, strlen(s));
  free(s);
  json_decref(o);
}

void openai_finish(job *j) {
  if (!j->conn) return;
  if (j->stream)
    finish_stream(j);
  else
    finish_body(j);
}

void openai_models(const endpoint *ep, strbuf *out) {
  const sim_config *cfg = &ep->sim->cfg;
  json_int_t created = (json_int_t)wall_seconds();
  json_t *data = json_array();
  json_array_append_new(data,
                        json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i}", "id", cfg->model, "object",
                                  "model", "created", created, "owned_by", "vllm", "root",
                                  cfg->model, "parent", "max_model_len", cfg->max_model_len));
  for (int i = 0; i < cfg->nloras; i++)
    json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "id", cfg->loras[i],
                                          "object", "model", "created", created, "owned_by", "vllm",
                                          "root", cfg->loras[i], "parent", cfg->model));
  json_t *o = json_pack("{s:s, s:o}", "object", "list", "data", data);
  char *s = json_dumps(o, JSON_COMPACT);
  sb_adds(out, s);
  free(s);
  json_decref(o);
}
