/* The config's sections lupin serve reads: "gateway" (the host library's,
 * host/settings.c) and "replicas" (endpoints/replicas.c). */
#include "gateway.h"

int gw_settings_declare(lupin_runtime *rt, char *err, size_t errlen) {
  return lh_settings_declare(rt, err, errlen) || gw_replicas_declare(rt, err, errlen);
}

int gw_settings_read(lupin_runtime *rt, gw_settings *out, char *err, size_t errlen) {
  return lh_settings_read(rt, out, err, errlen);
}
