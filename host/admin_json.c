/* The admin API's JSON answers, the same from every host: built from
 * lupin.h calls and the data the host passes in (its endpoints' scrapes and
 * health, its requests in flight), appended to an lh_buf.  The host keeps
 * the I/O: the route, gathering from its threads, writing the reply.
 *
 *   {"endpoints":[...]}             lh_admin_endpoints_open, lh_admin_endpoint
 *   {"requests":[...]}              lh_admin_requests_open, lh_admin_request
 *   {"current","generations","workers"}  lh_admin_generations_open and _worker
 *   {"reloaded","generation","duration_seconds"}  lh_admin_reloaded
 *   {"leaked",...,"report"}         lh_leaks_check over each runtime, then
 *                                   lh_admin_leaks
 *
 * A list's items are separated by what the buffer ends with: the first item
 * follows its '['. */
#include "lupin_host.h"

#include <stdio.h>

/* "," before an item, but the first of its list. */
static const char *sep(const lh_buf *b) { return b->len && b->data[b->len - 1] != '[' ? "," : ""; }

void lh_admin_list_end(lh_buf *b) { lh_buf_printf(b, "]}\n"); }

/* --- endpoints ------------------------------------------------------------ */

void lh_admin_endpoints_open(lh_buf *b) { lh_buf_printf(b, "{\"endpoints\":["); }

void lh_admin_endpoint(lh_buf *b, const lh_endpoint_view *v, double now, double stale_seconds) {
  static const lupin_metrics none = {0};
  const lupin_metrics *m = v->metrics ? v->metrics : &none;
  lh_buf_printf(b, "%s{\"name\":", sep(b));
  lh_buf_json(b, v->name);
  lh_buf_printf(b, ",\"address\":");
  lh_buf_json(b, v->address);
  lh_buf_printf(b, ",\"addresses\":[");
  for (int i = 0; i < v->n_addresses; i++) {
    if (i) lh_buf_printf(b, ",");
    lh_buf_json(b, v->addresses[i]);
  }
  lh_buf_printf(b, "],\"labels\":{");
  for (size_t i = 0; i < v->n_labels; i++) {
    lh_buf_printf(b, "%s", i ? "," : "");
    lh_buf_json(b, v->labels[i].name);
    lh_buf_printf(b, ":");
    lh_buf_json(b, v->labels[i].value);
  }
  lh_buf_printf(b, "}");
  lh_buf_printf(b, ",\"port\":%d,\"fresh\":%s,\"scrape_age_seconds\":", v->port,
                v->scraped_at && now - v->scraped_at <= stale_seconds ? "true" : "false");
  lh_buf_number(b, v->scraped_at ? now - v->scraped_at : -1);
  lh_buf_printf(b,
                ",\"scrapes\":%llu,\"scrape_errors\":%llu,\"idle_connections\":%zu,"
                "\"metrics\":{",
                (unsigned long long)v->scrapes, (unsigned long long)v->scrape_errors,
                v->idle_connections);
  /* numbers a host or a scrape set: JSON has no NaN or Infinity, null then */
  static const char *const keys[] = {"waiting_queue_size", "running_requests", "kv_cache_usage",
                                     "max_lora",           "cache_block_size", "num_blocks"};
  double n[] = {m->waiting_queue_size, m->running_requests, m->kv_cache_usage,
                m->max_lora,           m->cache_block_size, m->num_blocks};
  for (int k = 0; k < 6; k++) {
    lh_buf_printf(b, "\"%s\":", keys[k]);
    lh_buf_number(b, n[k]);
    lh_buf_printf(b, ",");
  }
  lh_buf_printf(b, "\"running_lora_adapters\":");
  lh_buf_json(b, v->running_lora);
  lh_buf_printf(b, ",\"waiting_lora_adapters\":");
  lh_buf_json(b, v->waiting_lora);
  lh_health healthy;
  const lh_health *h = v->health;
  if (!h) {
    lh_health_init(&healthy, now);
    h = &healthy;
  }
  lh_buf_printf(b,
                "},\"health\":{\"state\":\"%s\",\"consecutive_errors\":%llu,"
                "\"consecutive_scrape_failures\":%llu,\"ejections\":%llu,"
                "\"restorations\":%llu,\"ejected_for_seconds\":%.3f,"
                "\"last_ejection_unix\":%.3f,\"last_error\":",
                lh_health_state_name(h->state), (unsigned long long)h->errors,
                (unsigned long long)h->scrape_failures, (unsigned long long)h->ejections,
                (unsigned long long)h->restorations,
                h->state == LH_EJECTED && h->ejected_until > now ? h->ejected_until - now : 0,
                h->ejected_unix);
  lh_buf_json(b, h->last_error);
  lh_buf_printf(b, "}}");
}

/* --- requests in flight --------------------------------------------------- */

void lh_admin_requests_open(lh_buf *b) { lh_buf_printf(b, "{\"requests\":["); }

void lh_admin_request(lh_buf *b, const lh_request_view *v) {
  lh_buf_printf(b, "%s{\"id\":", sep(b));
  lh_buf_json(b, lupin_request_id(v->req));
  lh_buf_printf(b, ",\"model\":");
  lh_buf_json(b, v->model);
  lh_buf_printf(b, ",\"path\":");
  lh_buf_json(b, v->path);
  lh_buf_printf(b, ",\"endpoint\":");
  lh_buf_json(b, v->endpoint ? v->endpoint : "");
  lh_buf_printf(b, ",\"stream\":%s,\"age_seconds\":%.3f,\"generation\":%llu,\"worker\":%d}",
                v->stream ? "true" : "false", v->age_seconds,
                (unsigned long long)lupin_request_generation(v->req), v->worker);
}

/* --- generations ----------------------------------------------------------- */

static void generation_json(void *ud, const lupin_generation_info *g) {
  lh_buf *b = ud;
  lh_buf_printf(b, "%s{\"number\":%llu,\"current\":%s,\"source\":", sep(b),
                (unsigned long long)g->number, g->current ? "true" : "false");
  lh_buf_json(b, g->source);
  lh_buf_printf(b,
                ",\"digest\":\"%s\",\"loaded_at\":%.3f,\"age_seconds\":%.3f,"
                "\"load_seconds\":%.6f,\"pinned\":%llu}",
                g->digest, g->loaded_unix, lupin_now() - g->loaded_at, g->load_seconds,
                (unsigned long long)g->pinned);
}

static uint64_t current(lupin_runtime *rt) {
  lupin_stats st;
  lupin_runtime_stats(rt, &st);
  return st.generation;
}

void lh_admin_generations_open(lh_buf *b, lupin_runtime *rt) {
  lh_buf_printf(b, "{\"current\":%llu,\"generations\":[", (unsigned long long)current(rt));
  lupin_runtime_generations(rt, generation_json, b);
  lh_buf_printf(b, "],\"workers\":[");
}

void lh_admin_generations_worker(lh_buf *b, lupin_runtime *rt, int worker) {
  lh_buf_printf(b, "%s{\"worker\":%d,\"current\":%llu,\"generations\":[", sep(b), worker,
                (unsigned long long)current(rt));
  lupin_runtime_generations(rt, generation_json, b);
  lh_buf_printf(b, "]}");
}

void lh_admin_generations(lh_buf *b, lupin_runtime *rt) {
  lh_admin_generations_open(b, rt);
  lh_admin_generations_worker(b, rt, 0);
  lh_admin_list_end(b);
}

/* --- reloads and leaks ----------------------------------------------------- */

void lh_admin_reloaded(lh_buf *b, uint64_t generation, double seconds) {
  lh_buf_printf(b, "{\"reloaded\":true,\"generation\":%llu,\"duration_seconds\":%.6f}\n",
                (unsigned long long)generation, seconds);
}

void lh_leaks_check(lh_leaks *l, lupin_runtime *rt, int worker) {
  char report[4096];
  int n = lupin_runtime_check_leaks(rt, report, sizeof report);
  if (n < 0) l->failed = 1;
  if (n > 0) l->leaked += n;
  if (n != 0 && worker >= 0) lh_buf_printf(&l->report, "worker %d: ", worker);
  if (n != 0) lh_buf_printf(&l->report, "%s\n", report);
  lupin_stats st;
  lupin_runtime_stats(rt, &st);
  l->st.live_requests += st.live_requests;
  l->st.live_request_tables += st.live_request_tables;
  l->st.lua_memory += st.lua_memory;
}

void lh_leaks_failure(lh_buf *msg, const lh_leaks *l) {
  lh_buf_printf(msg, "the leak check failed: %s", l->report.data ? l->report.data : "");
}

void lh_admin_leaks(lh_buf *b, const lh_leaks *l) {
  lh_buf_printf(b,
                "{\"leaked\":%d,\"live_requests\":%llu,\"live_request_tables\":%llu,"
                "\"lua_memory_bytes\":%llu,\"report\":",
                l->leaked, (unsigned long long)l->st.live_requests,
                (unsigned long long)l->st.live_request_tables,
                (unsigned long long)l->st.lua_memory);
  lh_buf_json(b, l->report.data ? l->report.data : "");
  lh_buf_printf(b, "}\n");
}

void lh_leaks_free(lh_leaks *l) { lh_buf_free(&l->report); }
