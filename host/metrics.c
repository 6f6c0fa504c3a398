/* The /metrics registry: every family the gateway exports, declared once,
 * and the writer of the Prometheus text exposition format 0.0.4.
 *
 * One table, so that a family's name, type, help and labels cannot drift
 * apart between the places that write its samples, and so that every family
 * gets its # HELP and # TYPE (docs/metrics.md is this table in prose).  The
 * llm_d_epp_* families carry the names, labels and buckets of llm-d-router's
 * endpoint picker (pkg/epp/metrics), so dashboards and alerts written for it
 * read lupin too; each also goes out under the EPP's older inference_* name
 * (its deprecated twin, as upstream still writes it) unless the host turns
 * twins off.  The twin costs nothing per request: the scrape writes the same
 * numbers a second time. */
#include "lupin_host.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* lupin's own: tight around the microseconds a scheduling cycle takes */
static const double sched_bounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                      0.005,   0.01,   0.025,   0.05,   0.1,   0.5};
/* the EPP's buckets, as upstream has them */
static const double epp_latency_bounds[] = {0.0001, 0.0002, 0.0005, 0.001, 0.002,
                                            0.005,  0.01,   0.02,   0.05,  0.1};
/* the runtime counts plugin calls into these (core/lupin.h) */
static const double plugin_bounds[] = {LUPIN_PLUGIN_BOUNDS};
_Static_assert(sizeof plugin_bounds / sizeof plugin_bounds[0] == LUPIN_PLUGIN_BUCKETS,
               "LUPIN_PLUGIN_BOUNDS has LUPIN_PLUGIN_BUCKETS bounds");
static const double epp_duration_bounds[] = {0.005, 0.025, 0.05, 0.1, 0.2,  0.4,  0.6,  0.8, 1.0,
                                             1.25,  1.5,   2,    3,   4,    5,    6,    8,   10,
                                             15,    20,    30,   45,  60,   120,  180,  240, 300,
                                             360,   480,   600,  900, 1200, 1800, 2700, 3600};
static const double epp_request_size_bounds[] = {
    64,       128,      256,      512,       1024,      2048,      4096,      8192,    16384,
    32768,    65536,    131072,   262144,    524288,    1048576,   2097152,   4194304, 8388608,
    16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824};
/* 32778 (not 32768) is upstream's value, kept so the buckets line up */
static const double epp_response_size_bounds[] = {1,    8,    16,   32,   64,    128,   256,  512,
                                                  1024, 2048, 4096, 8192, 16384, 32778, 65536};

/* the EPP's flow-control wait buckets */
static const double kv_lag_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                       0.01,   0.025,   0.05,   0.1,   0.25,   1};
static const double fc_wait_bounds[] = {0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25,   0.5,    1.0,   2.5,   5.0,  10.0,  30.0, 60.0};

#define N(a)    (sizeof(a) / sizeof((a)[0]))
#define HIST(b) b, N(b)

const lh_family lh_families[LH_FAMILIES] = {
    [LH_M_REQUESTS] = {"lupin_requests_total",
                       LH_COUNTER,
                       "Responses the gateway answered on its public listener, by HTTP status.",
                       {"status"}},
    [LH_M_WORKER_REQUESTS] = {"lupin_worker_requests_total",
                              LH_COUNTER,
                              "Responses answered on the public listener, by worker (event loop).",
                              {"worker"}},
    [LH_M_OUTCOMES] = {"lupin_request_outcomes_total",
                       LH_COUNTER,
                       "Scheduled requests by how they ended for the plugins.",
                       {"outcome"}},
    [LH_M_SCHEDULING] = {"lupin_scheduling_seconds",
                         LH_HISTOGRAM,
                         "Time of one scheduling cycle (admission, filters, scorers, picker).",
                         {NULL},
                         HIST(sched_bounds)},
    [LH_M_PLUGIN_CALLS] = {"lupin_plugin_calls_total",
                           LH_COUNTER,
                           "Calls of a plugin instance at an extension point.",
                           {"plugin", "type", "point"}},
    [LH_M_PLUGIN_ERRORS] = {"lupin_plugin_errors_total",
                            LH_COUNTER,
                            "Calls of a plugin instance that raised an error (budget cuts "
                            "included).",
                            {"plugin", "type", "point"}},
    [LH_M_PLUGIN_SECONDS] = {"lupin_plugin_seconds_total",
                             LH_COUNTER,
                             "Time spent in a plugin instance at an extension point.",
                             {"plugin", "type", "point"}},
    [LH_M_PLUGIN_CUTS] = {"lupin_plugin_budget_cuts_total",
                          LH_COUNTER,
                          "Calls of a plugin instance cut by its call budget.",
                          {"plugin", "type", "point"}},
    [LH_M_PLUGIN_DISABLED] = {"lupin_plugin_disabled",
                              LH_GAUGE,
                              "1 when the instance is disabled after too many budget cuts.",
                              {"plugin", "type", "point"}},
    [LH_M_EP_WAITING] = {"lupin_endpoint_waiting_queue_size",
                         LH_GAUGE,
                         "Requests waiting at the endpoint, as last scraped.",
                         {"endpoint"}},
    [LH_M_EP_RUNNING] = {"lupin_endpoint_running_requests",
                         LH_GAUGE,
                         "Requests running at the endpoint, as last scraped.",
                         {"endpoint"}},
    [LH_M_EP_KV] = {"lupin_endpoint_kv_cache_usage",
                    LH_GAUGE,
                    "KV-cache usage of the endpoint (0 to 1), as last scraped.",
                    {"endpoint"}},
    [LH_M_EP_MAX_LORA] = {"lupin_endpoint_max_lora",
                          LH_GAUGE,
                          "LoRA adapters the endpoint can hold at once, as last scraped.",
                          {"endpoint"}},
    [LH_M_EP_SCRAPE_AGE] = {"lupin_endpoint_scrape_age_seconds",
                            LH_GAUGE,
                            "Seconds since the endpoint's last good scrape, -1 before the first.",
                            {"endpoint"}},
    [LH_M_EP_SCRAPE_ERRORS] = {"lupin_endpoint_scrape_errors_total",
                               LH_COUNTER,
                               "Scrapes of the endpoint's metrics that failed.",
                               {"endpoint"}},
    [LH_M_EP_HEALTHY] = {"lupin_endpoint_healthy",
                         LH_GAUGE,
                         "1 when requests may go to the endpoint (neither ejected nor stale).",
                         {"endpoint"}},
    [LH_M_EP_EJECTIONS] = {"lupin_endpoint_ejections_total",
                           LH_COUNTER,
                           "Times the endpoint was ejected after consecutive failures.",
                           {"endpoint"}},
    [LH_M_EP_RESTORATIONS] = {"lupin_endpoint_restorations_total",
                              LH_COUNTER,
                              "Times the endpoint came back after an ejection or staleness.",
                              {"endpoint"}},
    [LH_M_UP_FAILURES] = {"lupin_upstream_failures_total",
                          LH_COUNTER,
                          "Attempts that failed at the endpoint, by reason (status_5xx: a 5xx "
                          "answer).",
                          {"endpoint", "reason"}},
    [LH_M_UP_RETRIES] = {"lupin_upstream_retries_total",
                         LH_COUNTER,
                         "Failed attempts at the endpoint that were sent again, by reason.",
                         {"endpoint", "reason"}},
    [LH_M_UP_RETRIES_DENIED] = {"lupin_upstream_retries_denied_total",
                                LH_COUNTER,
                                "Retries the retry budget refused.",
                                {NULL}},
    [LH_M_ENDPOINTS_HEALTHY] = {"lupin_endpoints_healthy",
                                LH_GAUGE,
                                "Endpoints requests may go to (neither ejected nor stale).",
                                {NULL}},
    [LH_M_RELOADS] = {"lupin_reloads_total",
                      LH_COUNTER,
                      "Reloads of the config and plugins, by result.",
                      {"result"}},
    [LH_M_RELOAD_SECONDS] = {"lupin_reload_duration_seconds",
                             LH_SUMMARY,
                             "Time reloads took (build, check, dry cycle, swap), failed ones "
                             "included.",
                             {NULL}},
    [LH_M_RELOAD_LAST] = {"lupin_reload_last_duration_seconds",
                          LH_GAUGE,
                          "Time the last reload took.",
                          {NULL}},
    [LH_M_LIVE_REQUESTS] = {"lupin_live_requests",
                            LH_SUM_GAUGE,
                            "Requests begun in the runtime and not yet ended.",
                            {NULL}},
    [LH_M_LIVE_TABLES] = {"lupin_live_request_tables",
                          LH_SUM_GAUGE,
                          "Request tables not yet collected by the Lua garbage collector.",
                          {NULL}},
    [LH_M_LUA_MEMORY] = {"lupin_lua_memory_bytes",
                         LH_SUM_GAUGE,
                         "Bytes the Lua state holds.",
                         {NULL}},
    [LH_M_LUA_PEAK] = {"lupin_lua_memory_peak_bytes",
                       LH_SUM_GAUGE,
                       "Most bytes the Lua state has held.",
                       {NULL}},
    [LH_M_LUA_GC_CYCLES] = {"lupin_lua_collector_cycles_total",
                            LH_COUNTER,
                            "Cycles of the Lua garbage collector, run between requests.",
                            {NULL}},
    [LH_M_LUA_GC_SECONDS] = {"lupin_lua_collector_seconds_total",
                             LH_COUNTER,
                             "Time the Lua garbage collector's steps took, between requests.",
                             {NULL}},
    [LH_M_GENERATION] = {"lupin_generation",
                         LH_GAUGE,
                         "Number of the current generation of config and plugins.",
                         {NULL}},
    [LH_M_GENERATIONS_ALIVE] = {"lupin_generations_alive",
                                LH_GAUGE,
                                "Generations alive: the current one and those pinned by requests.",
                                {NULL}},
    [LH_M_ENDPOINTS] = {"lupin_endpoints", LH_GAUGE, "Endpoints in the pool.", {NULL}},
    [LH_M_IN_FLIGHT] = {"lupin_requests_in_flight",
                        LH_SUM_GAUGE,
                        "Requests handed to the proxy and not yet answered.",
                        {NULL}},
    [LH_M_BODY_BYTES] = {"lupin_buffered_body_bytes",
                         LH_SUM_GAUGE,
                         "Request body bytes the gateway holds.",
                         {NULL}},
    [LH_M_REFUSALS] = {"lupin_capacity_refusals_total",
                       LH_COUNTER,
                       "Requests refused by a capacity cap, by cap.",
                       {"cap"}},
    [LH_M_LUA_LIMIT] = {"lupin_lua_memory_limit_bytes",
                        LH_GAUGE,
                        "The Lua memory limit, 0 when none.",
                        {NULL}},
    [LH_M_LUA_LIMIT_HITS] = {"lupin_lua_memory_limit_hits_total",
                             LH_COUNTER,
                             "Lua allocations refused by the memory limit.",
                             {NULL}},
    [LH_M_EMPTY_ENDPOINTS_KEPT] = {"lupin_endpoints_empty_kept_total",
                                   LH_COUNTER,
                                   "Times an endpoints source listed no endpoints and the last "
                                   "ones were kept (gateway.allowEmptyEndpoints 0).",
                                   {NULL}},
    [LH_M_BUILD_INFO] = {"lupin_build_info",
                         LH_GAUGE,
                         "Always 1: the version of lupin and of the LuaJIT it was built with.",
                         {"version", "luajit"}},
    [LH_M_CPU] = {"process_cpu_seconds_total",
                  LH_COUNTER,
                  "Total user and system CPU time spent in seconds.",
                  {NULL}},
    [LH_M_RSS] = {"process_resident_memory_bytes",
                  LH_GAUGE,
                  "Resident memory size in bytes.",
                  {NULL}},
    [LH_M_VSIZE] = {"process_virtual_memory_bytes",
                    LH_GAUGE,
                    "Virtual memory size in bytes.",
                    {NULL}},
    [LH_M_START_TIME] = {"process_start_time_seconds",
                         LH_GAUGE,
                         "Start time of the process since unix epoch in seconds.",
                         {NULL}},
    [LH_M_OPEN_FDS] = {"process_open_fds", LH_GAUGE, "Number of open file descriptors.", {NULL}},
    [LH_M_MAX_FDS] = {"process_max_fds",
                      LH_GAUGE,
                      "Maximum number of open file descriptors.",
                      {NULL}},
    [LH_M_OBJ_REQUESTS] = {"llm_d_epp_request_total",
                           LH_COUNTER,
                           "Requests scheduled to an endpoint, by model.",
                           {"model_name", "target_model_name"},
                           .deprecated = "inference_objective_request_total"},
    [LH_M_OBJ_ERRORS] = {"llm_d_epp_request_error_total",
                         LH_COUNTER,
                         "Requests that failed, by model and EPP error code.",
                         {"model_name", "target_model_name", "error_code"},
                         .deprecated = "inference_objective_request_error_total"},
    [LH_M_OBJ_DURATION] = {"llm_d_epp_request_duration_seconds",
                           LH_HISTOGRAM,
                           "Time from the request's first byte to the response's last, "
                           "successful requests, by model.",
                           {"model_name", "target_model_name"},
                           HIST(epp_duration_bounds),
                           .deprecated = "inference_objective_request_duration_seconds"},
    [LH_M_OBJ_REQUEST_SIZES] = {"llm_d_epp_request_size_bytes",
                                LH_HISTOGRAM,
                                "Request body sizes in bytes of scheduled requests, by model.",
                                {"model_name", "target_model_name"},
                                HIST(epp_request_size_bounds),
                                .deprecated = "inference_objective_request_sizes"},
    [LH_M_OBJ_RESPONSE_SIZES] = {"llm_d_epp_response_size_bytes",
                                 LH_HISTOGRAM,
                                 "Response body sizes in bytes of successful requests, by model.",
                                 {"model_name", "target_model_name"},
                                 HIST(epp_response_size_bounds),
                                 .deprecated = "inference_objective_response_sizes"},
    [LH_M_OBJ_RUNNING] = {"llm_d_epp_request_running",
                          LH_SUM_GAUGE,
                          "Requests scheduled and not yet ended, by model.",
                          {"model_name"},
                          .deprecated = "inference_objective_running_requests"},
    [LH_M_POOL_KV] = {"llm_d_epp_average_kv_cache_utilization",
                      LH_GAUGE,
                      "Mean KV-cache usage (0 to 1) of the endpoints with fresh metrics.",
                      {"name"},
                      .deprecated = "inference_pool_average_kv_cache_utilization"},
    [LH_M_POOL_QUEUE] = {"llm_d_epp_average_queue_size",
                         LH_GAUGE,
                         "Mean waiting queue of the endpoints with fresh metrics.",
                         {"name"},
                         .deprecated = "inference_pool_average_queue_size"},
    [LH_M_POOL_POD_QUEUE] = {"llm_d_epp_per_endpoint_queue_size",
                             LH_GAUGE,
                             "Waiting queue of each endpoint with fresh metrics.",
                             {"model_server_endpoint", "name"},
                             .deprecated = "inference_pool_per_pod_queue_size",
                             .deprecated_labels = {"model_server_pod", "name"}},
    [LH_M_POOL_READY] = {"llm_d_epp_ready_endpoints",
                         LH_GAUGE,
                         "Endpoints healthy with fresh metrics.",
                         {"name"},
                         .deprecated = "inference_pool_ready_pods"},
    [LH_M_SCHEDULER_E2E] = {"llm_d_epp_scheduler_e2e_duration_seconds",
                            LH_HISTOGRAM,
                            "Time of one scheduling cycle, in the EPP's buckets.",
                            {NULL},
                            HIST(epp_latency_bounds),
                            .deprecated = "inference_extension_scheduler_e2e_duration_seconds"},
    [LH_M_PLUGIN_DURATION] = {"llm_d_epp_plugin_duration_seconds",
                              LH_HISTOGRAM,
                              "Time of each plugin call, by extension point, plugin type and "
                              "instance.",
                              {"extension_point", "plugin_type", "plugin_name"},
                              HIST(plugin_bounds),
                              .deprecated = "inference_extension_plugin_duration_seconds"},
    [LH_M_FC_QUEUE_SIZE] = {"llm_d_epp_flow_control_queue_size",
                            LH_SUM_GAUGE,
                            "Requests waiting in the flow-control queue, by priority band.",
                            {"priority"},
                            .deprecated = "inference_extension_flow_control_queue_size"},
    [LH_M_FC_QUEUE_BYTES] = {"llm_d_epp_flow_control_queue_bytes",
                             LH_SUM_GAUGE,
                             "Bytes of the request bodies waiting in the flow-control queue, by "
                             "priority band.",
                             {"priority"},
                             .deprecated = "inference_extension_flow_control_queue_bytes"},
    [LH_M_FC_QUEUE_DURATION] =
        {"llm_d_epp_flow_control_request_queue_duration_seconds",
         LH_HISTOGRAM,
         "Time requests spent in the flow-control queue, by band and by "
         "how they left it.",
         {"priority", "outcome"},
         HIST(fc_wait_bounds),
         .deprecated = "inference_extension_flow_control_request_queue_duration_seconds"},
    [LH_M_FC_SATURATION] = {"llm_d_epp_flow_control_pool_saturation",
                            LH_MAX_GAUGE,
                            "The saturation detector's level: 0 idle, 1 or more holds the "
                            "queue closed (the largest of the workers').",
                            {NULL},
                            .deprecated = "inference_extension_flow_control_pool_saturation"},
    [LH_M_FC_REQUESTS] = {"lupin_flow_control_requests_total",
                          LH_COUNTER,
                          "Requests that went through the flow-control queue, by band and by "
                          "how they left it (dispatched, queue_ttl, queue_full, shed, "
                          "cancelled).",
                          {"priority", "outcome"}},
    [LH_M_FC_CLAMPED] = {"lupin_flow_control_priority_clamped_total",
                         LH_COUNTER,
                         "Requests whose x-gateway-inference-objective was an integer no "
                         "objective or band configures, by the configured priority it was "
                         "clamped to.",
                         {"priority"}},
    [LH_M_REPLICA_CONNECTED] = {"lupin_replica_sync_connected",
                                LH_GAUGE,
                                "1 while this replica's connection to Redis is up.",
                                {NULL}},
    [LH_M_REPLICA_PUBLISHED] = {"lupin_replica_sync_published_total",
                                LH_COUNTER,
                                "Prefix records this replica published to the stream.",
                                {NULL}},
    [LH_M_REPLICA_APPLIED] = {"lupin_replica_sync_applied_total",
                              LH_COUNTER,
                              "Other replicas' prefix records applied to the local index.",
                              {NULL}},
    [LH_M_REPLICA_IGNORED] = {"lupin_replica_sync_ignored_total",
                              LH_COUNTER,
                              "Other replicas' prefix records for an endpoint or index this "
                              "replica does not have.",
                              {NULL}},
    [LH_M_REPLICA_DROPPED] = {"lupin_replica_sync_dropped_total",
                              LH_COUNTER,
                              "Prefix records never published: the oldest dropped past "
                              "maxPendingBytes, or lost with a connection.",
                              {NULL}},
    [LH_M_REPLICA_BAD] = {"lupin_replica_sync_bad_total",
                          LH_COUNTER,
                          "Stream entries skipped: another format version or not a batch.",
                          {NULL}},
    [LH_M_REPLICA_PENDING] = {"lupin_replica_sync_pending",
                              LH_GAUGE,
                              "Prefix records waiting to be published.",
                              {NULL}},
    [LH_M_REPLICA_LAG] = {"lupin_replica_sync_lag_seconds",
                          LH_GAUGE,
                          "From a record on another replica to its applying here, for the "
                          "last record applied.",
                          {NULL}},
    [LH_M_KV_BLOCKS_APPLIED] = {"lupin_kv_events_blocks_total",
                                LH_COUNTER,
                                "Blocks of an endpoint's KV-cache events: stored and removed as "
                                "applied to the precise index, cleared (AllBlocksCleared events), "
                                "ignored (another tier or attention group), orphan (stored under a "
                                "parent never seen), unknown (removed, never seen stored), "
                                "malformed (tokens not matching the blocks).",
                                {"endpoint", "type"}},
    [LH_M_KV_BATCHES] = {"lupin_kv_events_batches_total",
                         LH_COUNTER,
                         "Event batches received from an endpoint's engine and applied.",
                         {"endpoint"}},
    [LH_M_KV_BAD] = {"lupin_kv_events_bad_total",
                     LH_COUNTER,
                     "Messages or batches from an endpoint's engine skipped as not understood "
                     "(frames, sequence or payload).",
                     {"endpoint"}},
    [LH_M_KV_GAPS] = {"lupin_kv_events_gaps_total",
                      LH_COUNTER,
                      "Holes in an endpoint's sequence numbers: batches lost on the way or "
                      "dropped at the high-water mark.",
                      {"endpoint"}},
    [LH_M_KV_LOST] = {"lupin_kv_events_lost_batches_total",
                      LH_COUNTER,
                      "Batches the holes in an endpoint's sequence numbers skipped.",
                      {"endpoint"}},
    [LH_M_KV_REPLAYS] = {"lupin_kv_events_replays_total",
                         LH_COUNTER,
                         "Holes filled from the engine's replay socket (ok) or not (failed: "
                         "too old for its buffer, or no answer in time).",
                         {"endpoint", "result"}},
    [LH_M_KV_RESYNCS] = {"lupin_kv_events_resyncs_total",
                         LH_COUNTER,
                         "Times an endpoint's blocks were purged to be learnt again: a hole "
                         "not replayed, a failed replay or more blocks than maxBlocks.",
                         {"endpoint"}},
    [LH_M_KV_RESTARTS] = {"lupin_kv_events_restarts_total",
                          LH_COUNTER,
                          "Engine restarts seen (its sequence numbers going back): its blocks "
                          "purged.",
                          {"endpoint"}},
    [LH_M_KV_BLOCKS] = {"lupin_kv_events_index_blocks",
                        LH_GAUGE,
                        "Blocks an endpoint's engine holds now, as its events say.",
                        {"endpoint"}},
    [LH_M_KV_STATE] = {"lupin_kv_events_subscription_state",
                       LH_GAUGE,
                       "1 for the state an endpoint's subscription is in: waiting (no batch "
                       "yet), live, replaying, or unsure (purged lately: scored approximately).",
                       {"endpoint", "state"}},
    [LH_M_KV_LAG] = {"lupin_kv_events_lag_seconds",
                     LH_HISTOGRAM,
                     "From a batch's timestamp on the engine to its blocks applied here.",
                     {NULL},
                     HIST(kv_lag_bounds)},
    [LH_M_TOKENIZE] = {"lupin_tokenize_requests_total",
                       LH_COUNTER,
                       "Tokenize jobs of the precise prefix plugins: answered with token ids "
                       "(ok), failed (no answer, not 200, no ids) or refused (the queue full).",
                       {"result"}},
    [LH_M_TOKEN_CACHE_ENTRIES] = {"lupin_token_cache_entries",
                                  LH_GAUGE,
                                  "Prompt prefixes whose token ids the token cache holds.",
                                  {NULL}},
    [LH_M_TOKEN_CACHE_BYTES] = {"lupin_token_cache_bytes",
                                LH_GAUGE,
                                "Bytes the token cache holds.",
                                {NULL}},
    [LH_M_TOKEN_CACHE_LOOKUPS] = {"lupin_token_cache_lookups_total",
                                  LH_COUNTER,
                                  "Token cache lookups of the precise prefix plugins, by result.",
                                  {"result"}},
    [LH_M_LATENCY_ERROR] = {"lupin_latency_prediction_error_ratio",
                            LH_GAUGE,
                            "Recent absolute percentage error of the latency predictions a "
                            "scheduler used (0.05: 5%), an exponentially weighted mean over them "
                            "(1/64 each).",
                            {"plugin", "target", "group"}},
    [LH_M_LATENCY_OBSERVED] = {"lupin_latency_predictions_observed_total",
                               LH_COUNTER,
                               "Latency predictions a scheduler used whose actual latency came "
                               "back.",
                               {"plugin", "target", "group"}},
    [LH_M_LATENCY_APE] = {"lupin_latency_prediction_ape_total",
                          LH_COUNTER,
                          "Sum of those predictions' absolute percentage errors: over "
                          "lupin_latency_predictions_observed_total, their mean.",
                          {"plugin", "target", "group"}},
    [LH_M_LATENCY_SAMPLES] = {"lupin_latency_model_samples_total",
                              LH_COUNTER,
                              "Finished requests a latency model trained on.",
                              {"plugin", "target", "group"}},
    [LH_M_K8S_SYNCED] = {"lupin_kubernetes_pool_synced",
                         LH_GAUGE,
                         "1 when the InferencePool and its pods are listed and watched without "
                         "error (--k8s-pool); 0 while waiting for them or failing.",
                         {"pool"}},
    [LH_M_K8S_ENDPOINTS] = {"lupin_kubernetes_pool_endpoints",
                            LH_GAUGE,
                            "Endpoints the InferencePool's ready pods make (one per pod and "
                            "target port), as last applied.",
                            {"pool"}},
    [LH_M_K8S_RESTARTS] = {"lupin_kubernetes_watch_restarts_total",
                           LH_COUNTER,
                           "Watches begun again: ended by the server (resumed), expired with "
                           "410 Gone (listed again) or cut short.",
                           {"resource"}},
    [LH_M_K8S_ERRORS] = {"lupin_kubernetes_errors_total",
                         LH_COUNTER,
                         "Failed calls to the Kubernetes API server and unusable answers, by "
                         "reason.",
                         {"reason"}},
};

void lh_histogram_observe(lh_histogram *h, lh_family_id id, double v) {
  const lh_family *f = &lh_families[id];
  size_t i = 0;
  while (i < f->n_bounds && v > f->bounds[i])
    i++;
  h->buckets[i]++;
  h->count++;
  h->sum += v;
}

static const char *const type_names[] = {"counter", "gauge", "histogram",
                                         "summary", "gauge", "gauge"};

/* HELP text escapes backslash and newline (quotes stay as they are). */
static void help_text(lh_buf *b, const char *s) {
  for (; *s; s++)
    if (*s == '\\')
      lh_buf_append(b, "\\\\", 2);
    else if (*s == '\n')
      lh_buf_append(b, "\\n", 2);
    else
      lh_buf_append(b, s, 1);
}

/* Where sample lines go: the family's own text or its twin's, each with
 * its name and label names. */
typedef struct target {
  lh_buf *b;
  const char *name;
  const char *const *names;
} target;

static void header(lh_buf *b, const char *name, const char *deprecated_for, const lh_family *f) {
  lh_buf_printf(b, "# HELP %s ", name);
  if (deprecated_for) lh_buf_printf(b, "Deprecated: use %s. ", deprecated_for);
  help_text(b, f->help);
  lh_buf_printf(b, "\n# TYPE %s %s\n", name, type_names[f->type]);
}

/* The current family is written twice: twins on and it has an older name. */
static int twinned(const lh_expo *e) { return e->twins && e->f && e->f->deprecated; }

/* The current family's twin, after all of its own samples. */
static void twin_flush(lh_expo *e) {
  if (!twinned(e)) return;
  header(e->b, e->f->deprecated, e->f->name, e->f);
  lh_buf_append(e->b, e->twin.data ? e->twin.data : "", e->twin.len);
  e->twin.len = 0;
}

void lh_expo_family(lh_expo *e, lh_family_id id) {
  twin_flush(e);
  e->f = &lh_families[id];
  header(e->b, e->f->name, NULL, e->f);
}

void lh_expo_end(lh_expo *e) {
  twin_flush(e);
  e->f = NULL;
  lh_buf_free(&e->twin);
}

/* {name="value",...,le="..."}: the family's labels, then an extra one. */
static void labels(const target *t, const char *const *values, const char *extra,
                   const char *xvalue) {
  const char *const *names = t->names;
  if (!names[0] && !extra) return;
  lh_buf_append(t->b, "{", 1);
  int n = 0;
  for (; n < LH_MAX_LABELS && names[n]; n++) {
    lh_buf_printf(t->b, "%s%s=", n ? "," : "", names[n]);
    lh_buf_label(t->b, values ? values[n] : "");
  }
  if (extra) {
    lh_buf_printf(t->b, "%s%s=", n ? "," : "", extra);
    lh_buf_label(t->b, xvalue);
  }
  lh_buf_append(t->b, "}", 1);
}

/* A number in the format's spelling: NaN, +Inf, -Inf, else the shortest
 * of 15 or 17 digits that reads back as v (0.1, not 0.10000000000000001). */
void lh_metric_number(char *out, size_t len, double v) {
  if (isnan(v))
    snprintf(out, len, "NaN");
  else if (isinf(v))
    snprintf(out, len, "%sInf", v > 0 ? "+" : "-");
  else if (snprintf(out, len, "%.15g", v), strtod(out, NULL) != v)
    snprintf(out, len, "%.17g", v);
}

static void value(lh_buf *b, double v) {
  char s[40];
  lh_metric_number(s, sizeof s, v);
  lh_buf_printf(b, " %s\n", s);
}

static void line_to(const target *t, const char *suffix, const char *const *values,
                    const char *extra, const char *xvalue, double v) {
  lh_buf_printf(t->b, "%s%s", t->name, suffix);
  labels(t, values, extra, xvalue);
  value(t->b, v);
}

static void line(lh_expo *e, const char *suffix, const char *const *values, const char *extra,
                 const char *xvalue, double v) {
  const lh_family *f = e->f;
  line_to(&(target){e->b, f->name, f->labels}, suffix, values, extra, xvalue, v);
  if (twinned(e)) {
    const char *const *names = f->deprecated_labels[0] ? f->deprecated_labels : f->labels;
    line_to(&(target){&e->twin, f->deprecated, names}, suffix, values, extra, xvalue, v);
  }
}

void lh_expo_sample(lh_expo *e, const char *const *values, double v) {
  line(e, "", values, NULL, NULL, v);
}

void lh_expo_summary(lh_expo *e, const char *const *values, double sum, uint64_t count) {
  line(e, "_sum", values, NULL, NULL, sum);
  line(e, "_count", values, NULL, NULL, (double)count);
}

void lh_expo_buckets(lh_expo *e, const char *const *values, const uint64_t *buckets, double sum) {
  uint64_t cum = 0;
  char le[32];
  for (size_t i = 0; i < e->f->n_bounds; i++) {
    cum += buckets[i];
    lh_metric_number(le, sizeof le, e->f->bounds[i]);
    line(e, "_bucket", values, "le", le, (double)cum);
  }
  cum += buckets[e->f->n_bounds];
  line(e, "_bucket", values, "le", "+Inf", (double)cum);
  lh_expo_summary(e, values, sum, cum);
}

void lh_expo_histogram(lh_expo *e, const char *const *values, const lh_histogram *h) {
  lh_expo_buckets(e, values, h->buckets, h->sum);
}

double lh_endpoint_sample(lh_family_id id, const lh_endpoint_state *s, double now) {
  const lupin_metrics *m = s->metrics;
  const lh_health *h = s->health;
  switch (id) {
  case LH_M_EP_WAITING:
    return m->waiting_queue_size;
  case LH_M_EP_RUNNING:
    return m->running_requests;
  case LH_M_EP_KV:
    return m->kv_cache_usage;
  case LH_M_EP_MAX_LORA:
    return m->max_lora;
  case LH_M_EP_SCRAPE_AGE:
    return s->scraped_at ? now - s->scraped_at : -1;
  case LH_M_EP_SCRAPE_ERRORS:
    return (double)s->scrape_errors;
  case LH_M_EP_HEALTHY:
    return !h || h->state == LH_HEALTHY;
  case LH_M_EP_EJECTIONS:
    return h ? (double)h->ejections : 0;
  case LH_M_EP_RESTORATIONS:
    return h ? (double)h->restorations : 0;
  default:
    return 0;
  }
}
