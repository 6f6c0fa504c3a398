/* The config's "gateway" section: declared to the runtime, which checks it
 * with the rest of the config (file, line and field in every error), and
 * read back from the current generation.  Every host declares the same
 * section, so one config serves lupin serve, lupin epp and the nginx
 * module alike; each host uses the settings that mean something to it
 * (docs/gateway.md, docs/nginx.md). */
#include "lupin_host.h"

#include <stddef.h>

typedef struct setting {
  lupin_setting s;
  size_t offset; /* of its uint64_t in lh_settings */
} setting;

#define MIB  (1024.0 * 1024)
#define NONE (-1) /* no upper bound */
#define SETTING(field, nm, d, lo, hi)                                                              \
  { {.name = nm, .def = d, .min = lo, .max = hi}, offsetof(lh_settings, field) }

static const setting settings[] = {
    SETTING(max_body_bytes, "maxBodyBytes", 16 * MIB, 1, NONE),
    SETTING(max_header_bytes, "maxHeaderBytes", 64 * 1024, 256, NONE),
    SETTING(header_timeout_ms, "headerTimeoutMs", 10000, 1, NONE),
    SETTING(connect_timeout_ms, "connectTimeoutMs", 2000, 1, NONE),
    SETTING(first_byte_timeout_ms, "firstByteTimeoutMs", 60000, 1, NONE),
    SETTING(idle_timeout_ms, "idleTimeoutMs", 60000, 1, NONE),
    SETTING(refresh_interval_ms, "refreshIntervalMs", 50, 1, NONE),
    SETTING(scrape_timeout_ms, "scrapeTimeoutMs", 1000, 1, NONE),
    SETTING(metrics_staleness_ms, "metricsStalenessMs", 2000, 1, NONE),
    SETTING(pool_size, "poolSize", 64, 0, NONE),
    SETTING(drain_timeout_ms, "drainTimeoutMs", 30000, 1, NONE),
    SETTING(resolve_interval_ms, "resolveIntervalMs", 30000, 1, NONE),
    /* memory bounds: the Lua state (0: none), requests handed to the proxy
     * and not yet answered, request body bytes held across all connections */
    SETTING(max_lua_memory_bytes, "maxLuaMemoryBytes", 1024 * MIB, 0, NONE),
    SETTING(max_requests_in_flight, "maxRequestsInFlight", 1024, 1, NONE),
    SETTING(max_buffered_body_bytes, "maxBufferedBodyBytes", 256 * MIB, 1, NONE),
    /* retries and endpoint health (docs/gateway.md) */
    SETTING(pool_idle_ms, "poolIdleMs", 2000, 1, NONE),
    SETTING(retry_non_idempotent, "retryNonIdempotent", 0, 0, 10),
    SETTING(retry_budget_percent, "retryBudgetPercent", 20, 0, 100),
    SETTING(retry_budget_min, "retryBudgetMin", 3, 0, NONE),
    SETTING(consecutive_errors, "consecutiveErrors", 5, 0, NONE),
    SETTING(base_ejection_time_ms, "baseEjectionTimeMs", 10000, 1, NONE),
    SETTING(max_ejection_time_ms, "maxEjectionTimeMs", 300000, 1, NONE),
    SETTING(max_ejection_percent, "maxEjectionPercent", 50, 0, 100),
    SETTING(stale_ejection_ms, "staleEjectionMs", 3000, 0, NONE),
    /* 1: any client may ask for an explain record (docs/explain.md) */
    SETTING(explain_without_token, "explainWithoutToken", 0, 0, 1),
    /* 1: an endpoints source that lists none empties the pool; 0 keeps the
     * last endpoints.  Read at each re-read, not only at start */
    SETTING(allow_empty_endpoints, "allowEmptyEndpoints", 0, 0, 1),
    /* 1: /metrics writes each llm_d_epp_* family a second time under the
     * EPP's older, deprecated name, as llm-d-router does; 0: the new names
     * only.  Read at start */
    SETTING(deprecated_metric_names, "deprecatedMetricNames", 1, 0, 1),
    /* event loops, each a thread with its own runtime (docs/workers.md); 0:
     * one per core.  Read at start: a reload does not change it */
    SETTING(workers, "workers", 0, 0, 256),
};

enum { N_SETTINGS = sizeof settings / sizeof *settings };

int lh_settings_declare(lupin_runtime *rt, char *err, size_t errlen) {
  lupin_setting s[N_SETTINGS];
  for (size_t i = 0; i < N_SETTINGS; i++)
    s[i] = settings[i].s;
  return lupin_runtime_declare_section(rt, "gateway", s, N_SETTINGS, err, errlen);
}

int lh_settings_read(lupin_runtime *rt, lh_settings *out, char *err, size_t errlen) {
  double v[N_SETTINGS];
  if (lupin_runtime_section(rt, "gateway", v, N_SETTINGS)) {
    lh_errf(err, errlen,
            "no gateway settings: no config loaded, or loaded before lh_settings_declare");
    return -1;
  }
  for (size_t i = 0; i < N_SETTINGS; i++)
    *(uint64_t *)((char *)out + settings[i].offset) = (uint64_t)v[i];
  return 0;
}

lh_health_policy lh_settings_health(const lh_settings *s) {
  return (lh_health_policy){s->consecutive_errors, s->base_ejection_time_ms,
                            s->max_ejection_time_ms, s->max_ejection_percent, s->stale_ejection_ms};
}
