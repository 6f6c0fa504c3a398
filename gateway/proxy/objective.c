/* The EPP's per-model request series (llm_d_epp_request_*, twins
 * inference_objective_*): one record per model name a request asked for and
 * the model it was sent as (the target: the model-name rewrite's, else the
 * same), kept for the life of the process.
 *
 * The model name comes from the client, so the records are bounded: past
 * GW_MAX_MODELS names every new one is counted under "<other>", and a client
 * cycling through names cannot grow the gateway's memory or /metrics. */
#include "proxy/proxy.h"

#include <stdlib.h>
#include <string.h>

/* The EPP's canonical codes (pkg/epp/util/error). */
const char *const gw_error_codes[GW_ERRS] = {"BadRequest", "InferencePoolResourceExhausted",
                                             "Internal", "ModelServerError"};

static gw_objective *find(lupin_gateway *gw, const char *model, const char *target) {
  for (gw_objective *o = gw->objectives; o; o = o->next)
    if (!strcmp(o->model, model) && !strcmp(o->target, target)) return o;
  return NULL;
}

static gw_objective *add(lupin_gateway *gw, const char *model, const char *target) {
  gw_objective *o = calloc(1, sizeof *o);
  if (!o || !(o->model = strdup(model)) || !(o->target = strdup(target))) {
    if (o) free(o->model);
    free(o);
    return NULL;
  }
  /* appended: /metrics lists models in the order they were first seen */
  gw_objective **tail = &gw->objectives;
  while (*tail)
    tail = &(*tail)->next;
  *tail = o;
  gw->n_objectives++;
  return o;
}

gw_objective *gw_objective_get(lupin_gateway *gw, const char *model, const char *target) {
  model = model ? model : "";
  target = target ? target : model;
  gw_objective *o = find(gw, model, target);
  if (o) return o;
  /* the bound is the process's: a series two workers both began counts
   * twice, so the names /metrics shows together stay within it */
  if (gw->n_objectives >= GW_MAX_MODELS ||
      __atomic_add_fetch(&gw->totals->series, 1, __ATOMIC_RELAXED) > GW_MAX_MODELS)
    model = target = "<other>";
  return find(gw, model, target) ? find(gw, model, target) : add(gw, model, target);
}

void gw_objectives_free(lupin_gateway *gw) {
  while (gw->objectives) {
    gw_objective *o = gw->objectives;
    gw->objectives = o->next;
    free(o->model);
    free(o->target);
    free(o);
  }
  gw->n_objectives = 0;
}
