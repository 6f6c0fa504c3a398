/* GET /v1/models: the endpoints' answers merged into one list, each model
 * once (the first endpoint to list it wins).  jansson reads and writes the
 * JSON, as in lupin-sim: the gateway needs no Lua for it. */
#include "proxy/proxy.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static void add_models(json_t *data, json_t *seen, const lh_buf *body) {
  json_t *root = json_loadb(body->data, body->len, 0, NULL);
  json_t *list = json_object_get(root, "data");
  size_t i;
  json_t *m;
  json_array_foreach(list, i, m) {
    const char *id = json_string_value(json_object_get(m, "id"));
    if (json_is_object(m) && id && !json_object_get(seen, id)) {
      json_object_set_new(seen, id, json_true());
      json_array_append(data, m);
    }
  }
  json_decref(root);
}

char *gw_models_merge(const lh_buf *bodies, size_t n) {
  json_t *data = json_array(), *seen = json_object();
  for (size_t i = 0; i < n; i++)
    add_models(data, seen, &bodies[i]);
  json_t *out = json_pack("{s:s, s:o}", "object", "list", "data", data);
  /* compact; "/" stays as it is: clients compare ids such as
   * "meta-llama/Llama-3.1-8B-Instruct" byte for byte */
  char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
  json_decref(out);
  json_decref(seen);
  return text;
}
