/* A host of liblupin using the host library (liblupin-host.a) without an
 * event loop: linked against it and liblupin.a alone, no libuv, no
 * http_parser (spec/host/host_spec.lua runs it, LUPIN_HOME this tree).
 * Prints one line per piece it tried: the admin API's answers and the
 * explain records kept, of a small runtime, as "name <JSON>". */
#include "lupin_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char text[] = "# HELP vllm:num_requests_waiting waiting\n"
                           "vllm:num_requests_waiting{model_name=\"m\"} 3\n"
                           "vllm:num_requests_running 2\n"
                           "vllm:kv_cache_usage_perc 0.25\n";

static const char config[] = "{\"plugins\":[{\"type\":\"queue-scorer\"},"
                             "{\"type\":\"max-score-picker\"}],"
                             "\"schedulingProfiles\":[{\"name\":\"default\",\"plugins\":["
                             "{\"pluginRef\":\"queue-scorer\"},"
                             "{\"pluginRef\":\"max-score-picker\"}]}]}";

/* flowControl on, nothing queued: the bands the config made. */
static const char flow_config[] =
    "{\"plugins\":[{\"type\":\"queue-scorer\"},{\"type\":\"max-score-picker\"},"
    "{\"type\":\"concurrency-detector\",\"parameters\":{\"maxConcurrency\":1}}],"
    "\"schedulingProfiles\":[{\"name\":\"default\",\"plugins\":["
    "{\"pluginRef\":\"queue-scorer\"},{\"pluginRef\":\"max-score-picker\"}]}],"
    "\"saturationDetector\":{\"pluginRef\":\"concurrency-detector\"},\"flowControl\":{}}";

/* /admin/flows of two runtimes (a host's threads), one with flow control. */
static void flows(lupin_runtime *without) {
  char err[2048];
  lupin_runtime *with = lupin_runtime_new(NULL, err, sizeof err);
  if (!with || lupin_runtime_load_string(with, flow_config, "host-link", err, sizeof err)) {
    printf("flow runtime failed: %s\n", err);
    lupin_runtime_free(with);
    return;
  }
  lh_buf b = {0};
  lh_flows off = {0}, on = {0};
  lh_flows_add(&off, without);
  lh_admin_flows(&b, &off);
  printf("flows off %s", b.data);
  b.len = 0;
  lh_flows_add(&on, without);
  lh_flows_add(&on, with);
  lh_admin_flows(&b, &on);
  printf("flows on %s", b.data);
  lh_flows_free(&off);
  lh_flows_free(&on);
  lh_buf_free(&b);
  lupin_runtime_free(with);
}

/* One explained request: its record (with an attempt) kept in the ring. */
static void explained(lupin_runtime *rt, lh_explain_ring *ring, const char *id, lh_buf *requests) {
  static const char body[] = "{\"model\":\"m\",\"prompt\":\"hi\"}";
  char err[512];
  lupin_request_desc d = {.id = id,
                          .path = "/v1/completions",
                          .body = body,
                          .body_len = sizeof body - 1,
                          .flags = LUPIN_REQUEST_EXPLAIN};
  lupin_request *req = lupin_request_begin(rt, &d, err, sizeof err);
  if (!req) {
    printf("begin failed: %s\n", err);
    return;
  }
  lupin_result res;
  int status = lupin_request_schedule(req, &res);
  if (requests)
    lh_admin_request(requests,
                     &(lh_request_view){.req = req,
                                        .model = "m",
                                        .path = "/v1/completions",
                                        .endpoint = status == 200 ? res.picks[0].name : NULL,
                                        .age_seconds = 0.25});
  static const char attempt[] = "{\"endpoint\":\"10.0.0.1:8000\",\"status\":200}";
  lh_buf b = {0};
  if (lh_explain_record(&b, req, 200, "ok", 12.5, attempt, sizeof attempt - 1))
    printf("no record for %s\n", id);
  else
    lh_explain_keep(ring, id, b.data);
  lupin_request_end(req, LUPIN_OK);
}

/* The admin API's answers of a runtime with two endpoints. */
static int admin(void) {
  char err[2048];
  lupin_runtime *rt = lupin_runtime_new(NULL, err, sizeof err);
  if (!rt || lupin_runtime_load_string(rt, config, "host-link", err, sizeof err)) {
    printf("runtime failed: %s\n", err);
    lupin_runtime_free(rt);
    return 1;
  }
  lupin_metrics m[2] = {{.waiting_queue_size = 3, .kv_cache_usage = 0.5},
                        {.waiting_queue_size = 1, .running_requests = 2}};
  for (int i = 0; i < 2; i++) {
    char name[16], address[24]; /* room for any int: -O1 cannot bound i */
    snprintf(name, sizeof name, "ep%d", i + 1);
    snprintf(address, sizeof address, "10.0.0.%d", i + 1);
    lupin_endpoint_upsert(rt, &(lupin_endpoint_desc){name, address, 8000, NULL, 0}, err,
                          sizeof err);
    lupin_endpoint_set_metrics(rt, name, &m[i]);
  }

  /* the host's view: ep2 ejected for 30 more seconds, never scraped */
  double now = lupin_now();
  lh_health h[2];
  lh_health_init(&h[0], now);
  lh_health_init(&h[1], now);
  h[1].state = LH_EJECTED;
  h[1].ejections = 1;
  h[1].ejected_until = now + 30;
  snprintf(h[1].last_error, sizeof h[1].last_error, "connect: refused");
  const char *addresses[] = {"10.0.0.1:8000"};
  lh_endpoint_view v[2] = {{.name = "ep1",
                            .address = "10.0.0.1",
                            .addresses = addresses,
                            .n_addresses = 1,
                            .port = 8000,
                            .scraped_at = now - 1,
                            .scrapes = 7,
                            .idle_connections = 2,
                            .metrics = &m[0],
                            .running_lora = "a,b",
                            .health = &h[0]},
                           {.name = "ep2",
                            .address = "10.0.0.2",
                            .port = 8000,
                            .scrape_errors = 3,
                            .metrics = &m[1],
                            .health = &h[1]}};
  lh_buf b = {0};
  lh_admin_endpoints_open(&b);
  for (int i = 0; i < 2; i++)
    lh_admin_endpoint(&b, &v[i], now, 5);
  lh_admin_list_end(&b);
  printf("endpoints %s", b.data);

  /* a ring of 2: the first of three records ages out */
  lh_explain_ring *ring = lh_explain_ring_new(2);
  b.len = 0;
  lh_admin_requests_open(&b);
  explained(rt, ring, "req-1", &b);
  lh_admin_list_end(&b);
  printf("requests %s", b.data);
  explained(rt, ring, "req-2", NULL);
  explained(rt, ring, "req-3", NULL);
  b.len = 0;
  lh_explain_ids(&b, ring);
  printf("explain %s", b.data);
  char *one = lh_explain_find(ring, "req-3"), *gone = lh_explain_find(ring, "req-1");
  printf("record %s", one ? one : "none\n");
  printf("aged out %s\n", gone ? "no" : "yes");
  free(one);
  free(gone);
  lh_explain_ring_free(ring);

  b.len = 0;
  lh_admin_generations(&b, rt);
  printf("generations %s", b.data);
  b.len = 0;
  lh_admin_reloaded(&b, 2, 0.125);
  printf("reload %s", b.data);
  lh_leaks l = {0};
  lh_leaks_check(&l, rt, -1);
  b.len = 0;
  if (l.failed)
    lh_leaks_failure(&b, &l);
  else
    lh_admin_leaks(&b, &l);
  printf("leaks %s", b.data);
  lh_leaks_free(&l);
  lh_buf_free(&b);
  flows(rt);
  lupin_runtime_free(rt);
  return 0;
}

int main(void) {
  lupin_metrics m = {0};
  char *running = NULL, *waiting = NULL;
  int known = lh_metrics_from_text(text, sizeof text - 1, &m, &running, &waiting);
  printf("metrics %d %g %g %g\n", known, m.waiting_queue_size, m.running_requests,
         m.kv_cache_usage);

  lh_buf b = {0};
  lh_expo e = {.b = &b};
  lh_expo_family(&e, LH_M_ENDPOINTS);
  lh_expo_sample(&e, NULL, 4);
  printf("expo %s", b.data);
  b.len = 0;

  lh_health h;
  lh_health_policy p = {.consecutive_errors = 2,
                        .base_ejection_time_ms = 1000,
                        .max_ejection_time_ms = 8000,
                        .max_ejection_percent = 50};
  lh_health_init(&h, 100);
  int due = lh_health_ejection_due(&h, &p, 2);
  double t = lh_health_eject(&h, &p, 0, 4, 100, 0);
  h.state = LH_EJECTED;
  int early = lh_health_evaluate(&h, &p, 100, 100.5);
  int later = lh_health_evaluate(&h, &p, 100, 101.5);
  if (later & LH_RESTORED) h.state = LH_HEALTHY; /* the host applies the change */
  printf("health %d %g %d %d %s\n", due, t, early, later == LH_RESTORED,
         lh_health_state_name(h.state));

  lh_access a = {.ts = 1, .id = "r\"1", .path = "/v1/completions", .status = 200, .outcome = "ok"};
  lh_access_line(&b, &a);
  printf("access %s", b.data);
  printf("secret %d %d\n", lh_same_secret("tok", "tok"), lh_same_secret("tox", "tok"));
  b.len = 0;
  lh_openai_error(&b, 429, "queue \"full\"", NULL);
  printf("error429 %s", b.data);
  b.len = 0;
  lh_openai_error(&b, 400, "bad", "messages");
  printf("error400 %s", b.data);
  lh_buf_free(&b);
  free(running);
  free(waiting);
  return admin();
}
