/* The tokenizer and the chat template: one definition of a prompt's token ids,
 * shared by the engine (what it caches and publishes in BlockStored events),
 * /tokenize and the render routes, so the ids a router gets from those routes
 * are exactly the ones the engine hashed.
 *
 * Text: one id per 4 bytes (the last id covers the 1 to 3 bytes left), the
 * bytes hashed (xxh64, seed 0) modulo VOCAB_SIZE. A prefix of a text therefore
 * tokenizes to a prefix of its ids only when it ends on a 4-byte boundary (as a
 * real tokenizer may merge across any cut). A prompt of token ids is its ids.
 *
 * Chat: each message as "<|role|>\ncontent\n" (text parts of an array content
 * one after another), then the generation prompt "<|assistant|>\n". A longer
 * conversation renders to a longer text that starts with the shorter one's
 * (generation prompt included, as the next message is the assistant's). */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <xxhash.h>

#include "sim.h"

void tok_push(token_ids *t, uint32_t id) {
  if (t->n == t->cap) {
    int cap = t->cap ? t->cap * 2 : 64;
    uint32_t *p = realloc(t->ids, (size_t)cap * sizeof *p);
    if (!p) abort();
    t->ids = p;
    t->cap = cap;
  }
  t->ids[t->n++] = id;
}

void tok_text(token_ids *t, const char *text, size_t len) {
  for (size_t i = 0; i < len; i += 4)
    tok_push(t, (uint32_t)(XXH64(text + i, len - i < 4 ? len - i : 4, 0) % VOCAB_SIZE));
}

void tok_free(token_ids *t) {
  free(t->ids);
  memset(t, 0, sizeof *t);
}

static void tok_append(token_ids *to, const token_ids *from) {
  for (int i = 0; i < from->n; i++)
    tok_push(to, from->ids[i]);
}

/* ---- completions ------------------------------------------------------------------ */

static bool add_token(token_ids *t, const json_t *id, http_reply *err) {
  if (!json_is_integer(id))
    return openai_bad_type(err, "prompt", "a list of token ids (integers)", id);
  json_int_t v = json_integer_value(id);
  if (v < 0 || v > (json_int_t)UINT32_MAX) {
    openai_error(err, 400, "invalid_request_error", "prompt", NULL,
                 "token id %" JSON_INTEGER_FORMAT " in 'prompt' is out of range: ids are 0 to %lu",
                 v, (unsigned long)UINT32_MAX);
    return false;
  }
  tok_push(t, (uint32_t)v);
  return true;
}

static bool add_tokens(token_ids *t, const json_t *ids, http_reply *err) {
  size_t i;
  json_t *id;
  json_array_foreach(ids, i, id) {
    if (!add_token(t, id, err)) return false;
  }
  return true;
}

static void free_prompts(token_ids *p, int n) {
  for (int i = 0; i < n; i++)
    tok_free(&p[i]);
  free(p);
}

/* vLLM's four shapes: a string, strings, token ids, lists of token ids. */
bool tok_completion_prompts(json_t *body, token_ids **out, int *n, http_reply *err) {
  static const char want[] = "a string, or a non-empty array of strings, of token ids or of "
                             "non-empty arrays of token ids";
  *out = NULL;
  *n = 0;
  json_t *p = json_object_get(body, "prompt");
  if (!p) {
    openai_error(err, 400, "invalid_request_error", "prompt", NULL,
                 "Missing required parameter 'prompt'");
    return false;
  }
  json_t *first = json_array_get(p, 0); /* NULL unless a non-empty array */
  bool one = json_is_string(p) || json_is_integer(first);
  if (!one && !json_is_string(first) && !(json_is_array(first) && json_array_size(first) > 0))
    return openai_bad_type(err, "prompt", want, first ? first : p);
  size_t count = one ? 1 : json_array_size(p);
  token_ids *items = calloc(count, sizeof *items);
  if (!items) abort();
  bool ok = true;
  if (json_is_string(p)) {
    tok_text(&items[0], json_string_value(p), json_string_length(p));
  } else if (one) {
    ok = add_tokens(&items[0], p, err);
  } else {
    size_t i;
    json_t *s;
    json_array_foreach(p, i, s) {
      if (json_is_string(first) && json_is_string(s)) {
        tok_text(&items[i], json_string_value(s), json_string_length(s));
      } else if (json_is_array(first) && json_is_array(s) && json_array_size(s) > 0) {
        ok = add_tokens(&items[i], s, err);
      } else {
        openai_error(err, 400, "invalid_request_error", "prompt", NULL,
                     "'prompt' must be %s: prompt[%zu] is %s, prompt[0] %s", want, i,
                     json_is_array(s) && json_array_size(s) == 0 ? "an empty array"
                                                                 : openai_type_name(s),
                     openai_type_name(first));
        ok = false;
      }
      if (!ok) break;
    }
  }
  if (!ok) {
    free_prompts(items, (int)count);
    return false;
  }
  *out = items;
  *n = (int)count;
  return true;
}

bool tok_completion_prompt(json_t *body, token_ids *out, http_reply *err) {
  token_ids *items;
  int n;
  if (!tok_completion_prompts(body, &items, &n, err)) return false;
  for (int i = 0; i < n; i++)
    tok_append(out, &items[i]);
  free_prompts(items, n);
  return true;
}

/* ---- chat ------------------------------------------------------------------------- */

/* Content: a string, or an array of parts of which the text parts count. */
static bool message_content(const json_t *content, strbuf *text, http_reply *err) {
  if (json_is_string(content)) {
    sb_add(text, json_string_value(content), json_string_length(content));
    return true;
  }
  if (json_is_null(content) || !content) return true;
  if (!json_is_array(content))
    return openai_bad_type(err, "messages", "a list whose contents are strings or arrays", content);
  size_t i;
  json_t *part;
  json_array_foreach(content, i, part) {
    json_t *t = json_object_get(part, "text");
    if (json_is_string(t)) sb_add(text, json_string_value(t), json_string_length(t));
  }
  return true;
}

static bool get_flag(json_t *body, const char *key, bool dflt, bool *out, bool *given,
                     http_reply *err) {
  json_t *v = json_object_get(body, key);
  *out = dflt;
  *given = v && !json_is_null(v);
  if (!*given) return true;
  if (!json_is_boolean(v)) return openai_bad_type(err, key, "a boolean", v);
  *out = json_is_true(v);
  return true;
}

bool tok_chat_text(json_t *body, strbuf *text, http_reply *err) {
  json_t *msgs = json_object_get(body, "messages");
  if (!msgs) {
    openai_error(err, 400, "invalid_request_error", "messages", NULL,
                 "Missing required parameter 'messages'");
    return false;
  }
  if (!json_is_array(msgs) || json_array_size(msgs) == 0)
    return openai_bad_type(err, "messages", "a non-empty array of messages", msgs);
  bool gen, gen_given, cont, cont_given;
  if (!get_flag(body, "add_generation_prompt", true, &gen, &gen_given, err) ||
      !get_flag(body, "continue_final_message", false, &cont, &cont_given, err))
    return false;
  if (gen && gen_given && cont) {
    openai_error(err, 400, "invalid_request_error", "continue_final_message", NULL,
                 "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
    return false;
  }
  size_t i, last = json_array_size(msgs) - 1;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    json_t *role = json_object_get(m, "role");
    if (!json_is_object(m) || !json_is_string(role)) {
      openai_error(err, 400, "invalid_request_error", "messages", NULL,
                   "messages[%zu] must be an object with a string 'role'", i);
      return false;
    }
    sb_printf(text, "<|%s|>\n", json_string_value(role));
    if (!message_content(json_object_get(m, "content"), text, err)) return false;
    if (!(cont && i == last)) sb_adds(text, "\n"); /* the final message left open */
  }
  if (gen && !cont) sb_adds(text, "<|assistant|>\n");
  if (!text->data) sb_adds(text, "");
  return true;
}

bool tok_chat_prompt(json_t *body, token_ids *out, http_reply *err) {
  strbuf text = {0};
  bool ok = tok_chat_text(body, &text, err);
  if (ok) tok_text(out, text.data, text.len);
  sb_free(&text);
  return ok;
}
