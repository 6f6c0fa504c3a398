/* The routes that generate no tokens: embeddings, pooling, classify, score,
 * rerank, tokenize, detokenize, the render routes (the token ids the engine
 * caches for a body, tokens.c); and minimal non-streaming answers for the
 * Responses API, Anthropic messages and the audio routes.
 *
 * They answer at once, outside the engine (no queue, no KV-cache blocks, not
 * in the metrics): enough for the gateway's specs to see each route proxied,
 * its model read and its answer relayed, in vLLM's response shapes.  Every
 * number is a pure function of the input and --seed (vectors, scores, token
 * ids), so a spec can compare two answers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <xxhash.h>

#include "sim.h"

#define MAX_DIMENSIONS     4096
#define DEFAULT_DIMENSIONS 32

typedef struct aux_call {
  endpoint *ep;
  json_t *body; /* the JSON body, or the form's text fields for multipart */
  char *model;  /* as requested, or the base model */
  http_reply *out;
} aux_call;

static bool fail(aux_call *a, int status, const char *param, const char *msg) {
  openai_error(a->out, status, "invalid_request_error", param, NULL, "%s", msg);
  return false;
}

/* The model: optional here (vLLM serves one), else the base model or an adapter. */
static bool model_of(aux_call *a) {
  const sim_config *cfg = &a->ep->sim->cfg;
  json_t *m = json_object_get(a->body, "model");
  if (!m || json_is_null(m)) {
    a->model = strdup(cfg->model);
    return true;
  }
  if (!json_is_string(m)) return fail(a, 400, "model", "'model' must be a string");
  const char *name = json_string_value(m);
  bool known = !strcmp(name, cfg->model);
  for (int i = 0; i < cfg->nloras && !known; i++)
    known = !strcmp(name, cfg->loras[i]);
  if (!known) {
    openai_error(a->out, 404, "invalid_request_error", "model", "model_not_found",
                 "The model '%.200s' does not exist: this endpoint serves '%s'", name, cfg->model);
    return false;
  }
  a->model = strdup(name);
  return true;
}

/* A value's text: strings as they are, anything else as its JSON. */
static void text_of(const json_t *v, strbuf *out) {
  if (json_is_string(v)) {
    sb_add(out, json_string_value(v), json_string_length(v));
    return;
  }
  char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (s) sb_adds(out, s);
  free(s);
}

static int tokens_in(const strbuf *t) { return t->len ? (int)((t->len + 3) / 4) : 1; }

static uint64_t seed_of(const aux_call *a, const strbuf *t, uint64_t salt) {
  return XXH64(t->data ? t->data : "", t->len, a->ep->sim->cfg.seed ^ salt);
}

/* A unit vector of dim numbers, a pure function of the text. */
static void vector(const aux_call *a, const strbuf *t, int dim, float *v) {
  uint64_t s = seed_of(a, t, 0x5eed);
  double norm = 0;
  for (int i = 0; i < dim; i++) {
    v[i] = (float)(rng_unit(&s) * 2 - 1);
    norm += (double)v[i] * v[i];
  }
  norm = sqrt(norm);
  for (int i = 0; i < dim && norm > 0; i++)
    v[i] = (float)(v[i] / norm);
}

/* The OpenAI SDK asks for base64: the little-endian float32 bytes. */
static json_t *base64_of(const float *v, int dim) {
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const unsigned char *b = (const unsigned char *)v; /* x86 and arm64 are little-endian */
  size_t n = (size_t)dim * 4;
  strbuf s = {0};
  for (size_t i = 0; i < n; i += 3) {
    unsigned x = (unsigned)b[i] << 16 | (i + 1 < n ? (unsigned)b[i + 1] << 8 : 0) |
                 (i + 2 < n ? b[i + 2] : 0);
    char q[4] = {abc[x >> 18 & 63], abc[x >> 12 & 63], i + 1 < n ? abc[x >> 6 & 63] : '=',
                 i + 2 < n ? abc[x & 63] : '='};
    sb_add(&s, q, 4);
  }
  json_t *o = json_stringn(s.data ? s.data : "", s.len);
  sb_free(&s);
  return o;
}

static json_t *floats(const float *v, int dim) {
  json_t *arr = json_array();
  for (int i = 0; i < dim; i++)
    json_array_append_new(arr, json_real(v[i]));
  return arr;
}

/* The items an input holds: a string, a list of strings, a list of token
 * ids (one item) or a list of such lists. */
static bool input_items(aux_call *a, const json_t *in, const char *param, json_t **items) {
  if (!in || json_is_null(in)) {
    char msg[80];
    snprintf(msg, sizeof msg, "Missing required parameter '%s'", param);
    return fail(a, 400, param, msg);
  }
  if (json_is_string(in) || (json_is_array(in) && json_is_integer(json_array_get(in, 0)))) {
    *items = json_pack("[O]", in);
    return true;
  }
  if (!json_is_array(in) || json_array_size(in) == 0)
    return fail(a, 400, param, "the input must be a string or a non-empty list");
  *items = json_incref((json_t *)in);
  return true;
}

static json_t *envelope(aux_call *a, const char *prefix, const char *object) {
  char id[64];
  snprintf(id, sizeof id, "%s-%d-%llu", prefix, a->ep->index, (unsigned long long)++a->ep->seq);
  return json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", object, "created",
                   (json_int_t)wall_seconds(), "model", a->model);
}

static json_t *usage(int prompt) {
  return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt, "total_tokens", prompt,
                   "completion_tokens", 0);
}

/* /v1/embeddings and /pooling: a vector per input item. */
static bool embed(aux_call *a, bool pooling) {
  json_t *in = json_object_get(a->body, "input");
  if (pooling && !in) in = json_object_get(a->body, "messages");
  json_t *items;
  if (!input_items(a, in, "input", &items)) return false;
  json_t *fmt = json_object_get(a->body, "encoding_format");
  bool b64 = json_is_string(fmt) && !strcmp(json_string_value(fmt), "base64");
  if (fmt && !json_is_null(fmt) && !b64 &&
      !(json_is_string(fmt) && !strcmp(json_string_value(fmt), "float"))) {
    json_decref(items);
    return fail(a, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
  }
  json_t *d = json_object_get(a->body, "dimensions");
  int dim = DEFAULT_DIMENSIONS;
  if (d && !json_is_null(d)) {
    if (!json_is_integer(d) || json_integer_value(d) < 1 ||
        json_integer_value(d) > MAX_DIMENSIONS) {
      json_decref(items);
      return fail(a, 400, "dimensions", "'dimensions' must be an integer from 1 to 4096");
    }
    dim = (int)json_integer_value(d);
  }
  float *v = malloc(sizeof *v * (size_t)dim);
  json_t *data = json_array();
  int prompt = 0;
  size_t i;
  json_t *item;
  json_array_foreach(items, i, item) {
    strbuf t = {0};
    text_of(item, &t);
    prompt += tokens_in(&t);
    vector(a, &t, dim, v);
    sb_free(&t);
    json_t *vec = b64 ? base64_of(v, dim) : floats(v, dim);
    json_array_append_new(data, json_pack("{s:i, s:s, s:o}", "index", (int)i, "object",
                                          pooling ? "pooling" : "embedding",
                                          pooling ? "data" : "embedding", vec));
  }
  free(v);
  json_decref(items);
  json_t *o = envelope(a, pooling ? "pool" : "embd", "list");
  json_object_set_new(o, "data", data);
  json_object_set_new(o, "usage", usage(prompt));
  a->out->status = 200;
  char *s = json_dumps(o, JSON_COMPACT);
  sb_adds(&a->out->body, s);
  free(s);
  json_decref(o);
  return true;
}

/* A number in [0, 1) for a pair of texts. */
static double pair_score(aux_call *a, const json_t *x, const json_t *y) {
  strbuf t = {0};
  text_of(x, &t);
  sb_adds(&t, "\x1f");
  text_of(y, &t);
  uint64_t s = seed_of(a, &t, 0x5c0e);
  sb_free(&t);
  return rng_unit(&s);
}

static json_t *first_of(json_t *body, const char *a, const char *b, const char *c) {
  json_t *v = json_object_get(body, a);
  if (!v) v = json_object_get(body, b);
  if (!v) v = json_object_get(body, c);
  return v;
}

static bool reply_json(aux_call *a, json_t *o) {
  a->out->status = 200;
  char *s = json_dumps(o, JSON_COMPACT);
  sb_adds(&a->out->body, s);
  free(s);
  json_decref(o);
  return true;
}

/* /score: text_1 against each of text_2 (or queries/documents, data_1/data_2). */
static bool score(aux_call *a) {
  json_t *q = first_of(a->body, "text_1", "queries", "data_1");
  json_t *docs = first_of(a->body, "text_2", "documents", "data_2");
  if (!q || !docs) return fail(a, 400, q ? "text_2" : "text_1", "score needs text_1 and text_2");
  json_t *items;
  if (!input_items(a, docs, "text_2", &items)) return false;
  json_t *data = json_array();
  size_t i;
  json_t *d;
  json_array_foreach(items, i, d) {
    json_array_append_new(data, json_pack("{s:i, s:s, s:f}", "index", (int)i, "object", "score",
                                          "score", pair_score(a, q, d)));
  }
  json_decref(items);
  json_t *o = envelope(a, "score", "list");
  json_object_set_new(o, "data", data);
  json_object_set_new(o, "usage", usage(1));
  return reply_json(a, o);
}

static int by_score(const void *x, const void *y) {
  double a = json_real_value(json_object_get(*(json_t *const *)x, "relevance_score"));
  double b = json_real_value(json_object_get(*(json_t *const *)y, "relevance_score"));
  return a < b ? 1 : a > b ? -1 : 0;
}

/* /rerank: the documents by relevance to the query, best first, top_n of them. */
static bool rerank(aux_call *a) {
  json_t *q = json_object_get(a->body, "query");
  if (!q) return fail(a, 400, "query", "Missing required parameter 'query'");
  json_t *items;
  if (!input_items(a, json_object_get(a->body, "documents"), "documents", &items)) return false;
  size_t n = json_array_size(items);
  json_t **res = calloc(n ? n : 1, sizeof *res);
  size_t i;
  json_t *d;
  json_array_foreach(items, i, d) {
    json_t *text = json_is_object(d) ? json_object_get(d, "text") : d;
    res[i] = json_pack("{s:i, s:{s:O}, s:f}", "index", (int)i, "document", "text",
                       text ? text : json_null(), "relevance_score", pair_score(a, q, d));
  }
  qsort(res, n, sizeof *res, by_score);
  json_int_t top = json_integer_value(json_object_get(a->body, "top_n"));
  json_t *results = json_array();
  for (i = 0; i < n; i++) {
    if (top <= 0 || (json_int_t)i < top) json_array_append(results, res[i]);
    json_decref(res[i]);
  }
  free(res);
  json_decref(items);
  json_t *o = envelope(a, "rerank", "list");
  json_object_del(o, "object");
  json_object_del(o, "created");
  json_object_set_new(o, "usage", json_pack("{s:i}", "total_tokens", (int)n));
  json_object_set_new(o, "results", results);
  return reply_json(a, o);
}

/* /classify: two classes, a probability from the input. */
static bool classify(aux_call *a) {
  json_t *items;
  json_t *in = json_object_get(a->body, "input");
  if (!input_items(a, in ? in : json_object_get(a->body, "messages"), "input", &items))
    return false;
  json_t *data = json_array();
  size_t i;
  json_t *item;
  json_array_foreach(items, i, item) {
    double p = pair_score(a, item, item);
    json_array_append_new(data, json_pack("{s:i, s:s, s:[f, f], s:i}", "index", (int)i, "label",
                                          p >= 0.5 ? "LABEL_0" : "LABEL_1", "probs", p, 1 - p,
                                          "num_classes", 2));
  }
  json_decref(items);
  json_t *o = envelope(a, "classify", "list");
  json_object_set_new(o, "data", data);
  json_object_set_new(o, "usage", usage((int)json_array_size(data)));
  return reply_json(a, o);
}

static json_t *ids_json(const token_ids *t) {
  json_t *arr = json_array();
  for (int i = 0; i < t->n; i++)
    json_array_append_new(arr, json_integer((json_int_t)t->ids[i]));
  return arr;
}

/* The ids the engine would cache for this body: a chat's rendered messages, or
 * a completion's prompt(s) one after another (tokens.c). */
static bool body_ids(aux_call *a, bool chat, token_ids *t) {
  bool ok = chat ? tok_chat_prompt(a->body, t, a->out) : tok_completion_prompt(a->body, t, a->out);
  if (!ok) tok_free(t);
  return ok;
}

/* /tokenize: vLLM's completion ({prompt}) or chat ({messages}) form. */
static bool tokenize(aux_call *a) {
  bool chat = json_object_get(a->body, "messages") != NULL;
  if (!chat && !json_object_get(a->body, "prompt"))
    return fail(a, 400, "prompt", "tokenize needs 'prompt' or 'messages'");
  token_ids t = {0};
  if (!body_ids(a, chat, &t)) return false;
  json_t *o = json_pack("{s:i, s:i, s:o}", "count", t.n, "max_model_len",
                        a->ep->sim->cfg.max_model_len, "tokens", ids_json(&t));
  tok_free(&t);
  return reply_json(a, o);
}

/* /v1/completions/render: [{"token_ids": [...]}], one per prompt (a list of
 * strings or of id lists is several; the engine serves them as one, their ids
 * one after another). */
static bool render_completion(aux_call *a) {
  token_ids *items;
  int n;
  if (!tok_completion_prompts(a->body, &items, &n, a->out)) return false;
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    json_array_append_new(arr, json_pack("{s:o}", "token_ids", ids_json(&items[i])));
    tok_free(&items[i]);
  }
  free(items);
  return reply_json(a, arr);
}

/* /v1/chat/completions/render: {"token_ids": [...]} of the rendered messages. */
static bool render_chat(aux_call *a) {
  token_ids t = {0};
  if (!body_ids(a, true, &t)) return false;
  json_t *o = json_pack("{s:o}", "token_ids", ids_json(&t));
  tok_free(&t);
  return reply_json(a, o);
}

static const char *const words[] = {" the",  " lupin", " sim",   " data",
                                    " node", " fast",  " cache", " load"};

/* /detokenize: a word per token id. */
static bool detokenize(aux_call *a) {
  json_t *tokens = json_object_get(a->body, "tokens");
  if (!json_is_array(tokens)) return fail(a, 400, "tokens", "'tokens' must be a list of ids");
  strbuf t = {0};
  size_t i;
  json_t *id;
  json_array_foreach(tokens, i, id) {
    if (!json_is_integer(id)) {
      sb_free(&t);
      return fail(a, 400, "tokens", "'tokens' must be a list of integer ids");
    }
    sb_adds(&t, words[(uint64_t)json_integer_value(id) % (sizeof words / sizeof words[0])]);
  }
  json_t *o = json_pack("{s:s%}", "prompt", t.data ? t.data : "", t.len);
  sb_free(&t);
  return reply_json(a, o);
}

/* Some words from the input, for the minimal generating answers. */
static char *short_text(aux_call *a, const json_t *in, int *prompt_tokens) {
  strbuf t = {0};
  text_of(in, &t);
  *prompt_tokens = tokens_in(&t);
  uint64_t s = seed_of(a, &t, 0x7e47);
  sb_free(&t);
  for (int i = 0; i < 8; i++)
    sb_adds(&t, words[rng_next(&s) % (sizeof words / sizeof words[0])]);
  return t.data;
}

static bool no_stream(aux_call *a) {
  if (!json_is_true(json_object_get(a->body, "stream"))) return true;
  return fail(a, 400, "stream", "lupin-sim answers this route without streaming only");
}

/* /v1/responses: one completed message. */
static bool responses(aux_call *a) {
  json_t *in = json_object_get(a->body, "input");
  if (!in) return fail(a, 400, "input", "Missing required parameter 'input'");
  if (!no_stream(a)) return false;
  int prompt;
  char *text = short_text(a, in, &prompt);
  json_t *o = envelope(a, "resp", "response");
  json_object_del(o, "created");
  json_object_set_new(o, "created_at", json_integer((json_int_t)wall_seconds()));
  json_object_set_new(o, "status", json_string("completed"));
  json_object_set_new(o, "output",
                      json_pack("[{s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}]", "type", "message",
                                "status", "completed", "role", "assistant", "content", "type",
                                "output_text", "text", text, "annotations"));
  json_object_set_new(o, "usage",
                      json_pack("{s:i, s:i, s:i}", "input_tokens", prompt, "output_tokens", 8,
                                "total_tokens", prompt + 8));
  free(text);
  return reply_json(a, o);
}

/* /v1/messages (Anthropic): one text block. */
static bool messages(aux_call *a) {
  json_t *msgs = json_object_get(a->body, "messages");
  if (!json_is_array(msgs)) return fail(a, 400, "messages", "'messages' must be a list");
  if (!json_is_integer(json_object_get(a->body, "max_tokens")))
    return fail(a, 400, "max_tokens", "'max_tokens' must be an integer");
  if (!no_stream(a)) return false;
  int prompt;
  char *text = short_text(a, msgs, &prompt);
  char id[64];
  snprintf(id, sizeof id, "msg_%d_%llu", a->ep->index, (unsigned long long)++a->ep->seq);
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s}], s:s, s:n, s:{s:i, s:i}}", "id", id,
                        "type", "message", "role", "assistant", "model", a->model, "content",
                        "type", "text", "text", text, "stop_reason", "max_tokens", "stop_sequence",
                        "usage", "input_tokens", prompt, "output_tokens", 8);
  free(text);
  return reply_json(a, o);
}

/* The text fields of a multipart/form-data body, as a JSON object; file
 * parts as {"filename", "size"}.  NULL when it is not one. */
static json_t *form_fields(const char *ctype, const char *body, size_t len) {
  const char *b = ctype ? strstr(ctype, "boundary=") : NULL;
  if (!b || strncasecmp(ctype, "multipart/form-data", 19)) return NULL;
  b += 9;
  size_t blen = strcspn(b, "; \t\"");
  if (*b == '"') blen = strcspn(++b, "\"");
  strbuf delim = {0};
  sb_adds(&delim, "--");
  sb_add(&delim, b, blen);
  json_t *fields = json_object();
  const char *end = body + len;
  const char *p = body;
  while (p && p < end) {
    const char *d = NULL;
    for (const char *q = p; q + delim.len <= end && !d; q++)
      if (!memcmp(q, delim.data, delim.len)) d = q;
    if (!d) break;
    const char *head = d + delim.len;
    if (head + 2 <= end && !memcmp(head, "--", 2)) break;
    const char *value = NULL;
    for (const char *q = head; q + 4 <= end && !value; q++)
      if (!memcmp(q, "\r\n\r\n", 4)) value = q + 4;
    if (!value) break;
    const char *next = NULL;
    for (const char *q = value; q + delim.len + 2 <= end && !next; q++)
      if (q[0] == '\r' && q[1] == '\n' && !memcmp(q + 2, delim.data, delim.len)) next = q;
    if (!next) break;
    char hd[512];
    size_t hl = (size_t)(value - head) < sizeof hd ? (size_t)(value - head) : sizeof hd - 1;
    memcpy(hd, head, hl);
    hd[hl] = 0;
    char *name = strstr(hd, " name=\"");
    if (!name) name = strstr(hd, ";name=\"");
    if (name) {
      bool is_file = strstr(hd, "filename=") != NULL;
      name += 7;
      name[strcspn(name, "\"")] = 0;
      if (is_file)
        json_object_set_new(fields, name, json_pack("{s:i}", "size", (int)(next - value)));
      else
        json_object_set_new(fields, name, json_stringn(value, (size_t)(next - value)));
    }
    p = next + 2;
  }
  sb_free(&delim);
  return fields;
}

/* The audio routes: the form's model and file; the text is made from the file's size. */
static bool audio(aux_call *a) {
  json_t *file = json_object_get(a->body, "file");
  if (!json_is_object(file)) return fail(a, 400, "file", "Missing required form field 'file'");
  int prompt;
  char *text = short_text(a, file, &prompt);
  json_t *o =
      json_pack("{s:s, s:{s:s, s:i}}", "text", text + 1, "usage", "type", "duration", "seconds", 1);
  free(text);
  return reply_json(a, o);
}

typedef struct aux_route {
  const char *path;
  bool (*serve)(aux_call *a);
} aux_route;

static bool embeddings(aux_call *a) { return embed(a, false); }
static bool pooling(aux_call *a) { return embed(a, true); }

static const aux_route aux_routes[] = {
    {"/v1/embeddings", embeddings},
    {"/pooling", pooling},
    {"/classify", classify},
    {"/score", score},
    {"/v1/score", score},
    {"/rerank", rerank},
    {"/v1/rerank", rerank},
    {"/v2/rerank", rerank},
    {"/tokenize", tokenize},
    {"/v1/completions/render", render_completion},
    {"/v1/chat/completions/render", render_chat},
    {"/detokenize", detokenize},
    {"/v1/responses", responses},
    {"/v1/messages", messages},
    {"/v1/audio/transcriptions", audio},
    {"/v1/audio/translations", audio},
};

bool aux_route_known(const char *path, size_t len) {
  for (size_t i = 0; i < sizeof aux_routes / sizeof aux_routes[0]; i++)
    if (strlen(aux_routes[i].path) == len && !strncmp(aux_routes[i].path, path, len)) return true;
  return false;
}

void aux_serve(endpoint *ep, const char *path, size_t plen, const char *ctype, const char *body,
               size_t len, http_reply *out, strbuf *model) {
  aux_call a = {.ep = ep, .out = out};
  bool form = !strncmp(path, "/v1/audio/", 10);
  json_error_t jerr;
  a.body = form ? form_fields(ctype, body, len) : json_loadb(body, len, 0, &jerr);
  if (!a.body || !json_is_object(a.body)) {
    openai_error(out, 400, "invalid_request_error", NULL, NULL,
                 form ? "The request body must be multipart/form-data"
                      : "The request body must be a JSON object");
    json_decref(a.body);
    return;
  }
  for (size_t i = 0; i < sizeof aux_routes / sizeof aux_routes[0]; i++) {
    const aux_route *r = &aux_routes[i];
    if (strlen(r->path) != plen || strncmp(r->path, path, plen)) continue;
    if (model_of(&a) && r->serve(&a)) sb_adds(model, a.model);
    break;
  }
  free(a.model);
  json_decref(a.body);
}
