/* A host of liblupin using the host library (liblupin-host.a) without an
 * event loop: linked against it and liblupin.a alone, no libuv, no
 * http_parser (spec/host/host_spec.lua runs it).  Prints one line per
 * piece it tried. */
#include "lupin_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char text[] = "# HELP vllm:num_requests_waiting waiting\n"
                           "vllm:num_requests_waiting{model_name=\"m\"} 3\n"
                           "vllm:num_requests_running 2\n"
                           "vllm:kv_cache_usage_perc 0.25\n";

int main(void) {
  lupin_metrics m = {0};
  char *running = NULL, *waiting = NULL;
  int known = lh_metrics_from_text(text, sizeof text - 1, &m, &running, &waiting);
  printf("metrics %d %g %g %g\n", known, m.waiting_queue_size, m.running_requests,
         m.kv_cache_usage);

  lh_buf b = {0};
  lh_expo e = {&b, NULL};
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
  lh_buf_free(&b);
  free(running);
  free(waiting);
  return 0;
}
