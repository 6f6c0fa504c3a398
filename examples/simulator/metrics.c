/* /metrics: the Prometheus text page vLLM serves, with vLLM's names and labels,
 * or (--engine) the names SGLang, TGI, Triton's TensorRT-LLM backend or
 * trtllm-serve give the same quantities.
 *
 * The gateway scrapes these to score endpoints, so the names (current and
 * legacy), label sets and the lora_requests_info timestamp convention follow
 * vLLM exactly. lupin_sim_* series are the simulator's own, for the specs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

/* vLLM's buckets for TTFT and inter-token latency, in seconds. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};

void hist_init(histogram *h, const double *bounds, int nbounds) {
  memset(h, 0, sizeof *h);
  h->bounds = bounds;
  h->nbounds = nbounds;
}

void hist_observe(histogram *h, double v) {
  int i = 0;
  while (i < h->nbounds && v > h->bounds[i])
    i++;
  h->counts[i]++;
  h->sum += v;
  h->count++;
}

void metrics_init(counters *c) {
  memset(c, 0, sizeof *c);
  hist_init(&c->ttft, ttft_bounds, (int)(sizeof ttft_bounds / sizeof ttft_bounds[0]));
  hist_init(&c->itl, itl_bounds, (int)(sizeof itl_bounds / sizeof itl_bounds[0]));
  c->lora_updated = wall_seconds();
}

/* Whole numbers as "2.0" (what vLLM's Python client prints), others in full. */
static void num(strbuf *out, double v) {
  if (v == floor(v) && fabs(v) < 1e15)
    sb_printf(out, "%.1f", v);
  else
    sb_printf(out, "%.17g", v);
}

static void sample(strbuf *out, const char *name, const char *labels, double v) {
  sb_printf(out, *labels ? "%s{%s} " : "%s ", name, labels);
  num(out, v);
  sb_adds(out, "\n");
}

static void metric(strbuf *out, const char *name, const char *type, const char *help,
                   const char *labels, double v) {
  sb_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  sample(out, name, labels, v);
}

static void histogram_out(strbuf *out, const char *name, const char *help, const char *labels,
                          const histogram *h) {
  sb_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (int i = 0; i <= h->nbounds; i++) {
    cum += h->counts[i];
    if (i < h->nbounds)
      sb_printf(out, "%s_bucket{%s,le=\"%g\"} %llu.0\n", name, labels, h->bounds[i],
                (unsigned long long)cum);
    else
      sb_printf(out, "%s_bucket{%s,le=\"+Inf\"} %llu.0\n", name, labels, (unsigned long long)cum);
  }
  sb_printf(out, "%s_count{%s} %llu.0\n", name, labels, (unsigned long long)h->count);
  sb_printf(out, "%s_sum{%s} ", name, labels);
  num(out, h->sum);
  sb_adds(out, "\n");
}

/* Comma-separated distinct adapter names of a job list, in first-seen order. */
static void adapters(const endpoint *ep, const job_list *l, strbuf *out) {
  const sim_config *cfg = &ep->sim->cfg;
  bool seen[MAX_LORAS] = {false};
  sb_adds(out, ""); /* "" rather than NULL when there are none */
  for (const job *j = l->head; j; j = j->next) {
    if (j->lora < 0 || seen[j->lora]) continue;
    seen[j->lora] = true;
    sb_printf(out, "%s%s", out->len ? "," : "", cfg->loras[j->lora]);
  }
}

/* Retires the label set shown so far into the old series when it changed. */
static void lora_roll(counters *m, const char *labels) {
  if (m->lora_now.labels && strcmp(m->lora_now.labels, labels) == 0) {
    if (m->lora_updated > m->lora_now.ts) m->lora_now.ts = m->lora_updated;
    return;
  }
  for (int i = 0; i < m->nlora_old; i++) { /* a set that comes back is current again */
    if (strcmp(m->lora_old[i].labels, labels) != 0) continue;
    free(m->lora_old[i].labels);
    m->lora_old[i] = m->lora_old[--m->nlora_old];
    break;
  }
  if (m->lora_now.labels) {
    if (m->nlora_old == LORA_SERIES_KEPT) { /* forget the oldest */
      free(m->lora_old[0].labels);
      memmove(m->lora_old, m->lora_old + 1, sizeof m->lora_old[0] * (LORA_SERIES_KEPT - 1));
      m->nlora_old--;
    }
    m->lora_old[m->nlora_old++] = m->lora_now;
  }
  double ts = m->lora_updated > m->lora_now.ts ? m->lora_updated : m->lora_now.ts + 1e-6;
  m->lora_now.labels = strdup(labels);
  m->lora_now.ts = ts;
}

static void lora_info(endpoint *ep, strbuf *out) {
  strbuf running = {0}, waiting = {0}, labels = {0};
  adapters(ep, &ep->running, &running);
  adapters(ep, &ep->waiting, &waiting);
  sb_printf(&labels, "max_lora=\"%d\",running_lora_adapters=\"%s\",waiting_lora_adapters=\"%s\"",
            ep->sim->cfg.max_loras, running.data, waiting.data);
  lora_roll(&ep->m, labels.data);
  sb_adds(out, "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
               "# TYPE vllm:lora_requests_info gauge\n");
  for (int i = 0; i < ep->m.nlora_old; i++)
    sb_printf(out, "vllm:lora_requests_info{%s} %.6f\n", ep->m.lora_old[i].labels,
              ep->m.lora_old[i].ts);
  sb_printf(out, "vllm:lora_requests_info{%s} %.6f\n", labels.data, ep->m.lora_now.ts);
  sb_free(&running);
  sb_free(&waiting);
  sb_free(&labels);
}

static void cache_config(const endpoint *ep, strbuf *out) {
  const sim_config *cfg = &ep->sim->cfg;
  char labels[256];
  snprintf(labels, sizeof labels,
           "block_size=\"%d\",cache_dtype=\"auto\",enable_prefix_caching=\"True\","
           "engine=\"0\",num_cpu_blocks=\"0\",num_gpu_blocks=\"%d\"",
           cfg->block_size, cfg->num_gpu_blocks);
  metric(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", labels,
         1);
}

static void engine_gauges(const endpoint *ep, strbuf *out, const char *labels) {
  double usage = (double)kv_in_use(ep->kv) / kv_capacity(ep->kv);
  metric(out, "vllm:num_requests_running", "gauge",
         "Number of requests in model execution batches.", labels, ep->running.count);
  metric(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
         labels, ep->waiting.count);
  metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         labels, usage);
  metric(out, "vllm:gpu_cache_usage_perc", "gauge",
         "GPU KV-cache usage. 1 means 100 percent usage (legacy name).", labels, usage);
}

static void engine_counters(const endpoint *ep, strbuf *out, const char *labels) {
  const counters *m = &ep->m;
  metric(out, "vllm:prefix_cache_queries_total", "counter",
         "Prefix cache queries, in terms of number of queried tokens.", labels,
         (double)m->prefix_queries);
  metric(out, "vllm:prefix_cache_hits_total", "counter",
         "Prefix cache hits, in terms of number of cached tokens.", labels, (double)m->prefix_hits);
  metric(out, "vllm:gpu_prefix_cache_queries_total", "counter",
         "GPU prefix cache queries, in tokens (legacy name).", labels, (double)m->prefix_queries);
  metric(out, "vllm:gpu_prefix_cache_hits_total", "counter",
         "GPU prefix cache hits, in tokens (legacy name).", labels, (double)m->prefix_hits);
  metric(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", labels,
         (double)m->prompt_tokens);
  metric(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
         labels, (double)m->generation_tokens);
  char with_reason[600];
  snprintf(with_reason, sizeof with_reason, "%s,finished_reason=\"length\"", labels);
  metric(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.",
         with_reason, (double)m->success);
}

static void sim_counters(const endpoint *ep, strbuf *out) {
  char labels[128];
  snprintf(labels, sizeof labels, "endpoint=\"%s\"", ep->addr);
  metric(out, "lupin_sim_requests_total", "counter",
         "Completion and chat requests received by this endpoint.", labels, (double)ep->m.requests);
  sb_adds(out, "# HELP lupin_sim_injected_failures_total Failures injected (--error-rate, "
               "--drop-rate).\n# TYPE lupin_sim_injected_failures_total counter\n");
  snprintf(labels, sizeof labels, "endpoint=\"%s\",kind=\"error\"", ep->addr);
  sample(out, "lupin_sim_injected_failures_total", labels, (double)ep->m.injected_errors);
  snprintf(labels, sizeof labels, "endpoint=\"%s\",kind=\"drop\"", ep->addr);
  sample(out, "lupin_sim_injected_failures_total", labels, (double)ep->m.injected_drops);
  snprintf(labels, sizeof labels, "endpoint=\"%s\"", ep->addr);
  metric(out, "lupin_sim_speed_factor", "gauge",
         "What multiplies this endpoint's latencies (--slow-factor, POST /sim/speed).", labels,
         endpoint_slowness(ep));
  kvev_metrics(ep, out);
}

void metrics_free(counters *c) {
  free(c->lora_now.labels);
  for (int i = 0; i < c->nlora_old; i++)
    free(c->lora_old[i].labels);
  c->lora_now.labels = NULL;
  c->nlora_old = 0;
}

/* --- the other engines: waiting, running, KV-cache usage, cache geometry,
 * under the names their metrics references give (docs/metrics.md, "Engines") */

static void sglang_page(endpoint *ep, strbuf *out) {
  const sim_config *cfg = &ep->sim->cfg;
  char labels[512];
  snprintf(labels, sizeof labels,
           "engine_type=\"unified\",model_name=\"%s\",moe_ep_rank=\"0\",pp_rank=\"0\","
           "tp_rank=\"0\"",
           cfg->model);
  double usage = (double)kv_in_use(ep->kv) / kv_capacity(ep->kv);
  metric(out, "sglang:num_running_reqs", "gauge", "The number of running requests.", labels,
         ep->running.count);
  metric(out, "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
         labels, ep->waiting.count);
  metric(out, "sglang:token_usage", "gauge", "The token usage.", labels, usage);
  metric(out, "sglang:page_size", "gauge", "KV cache page size in tokens.", labels,
         cfg->block_size);
  metric(out, "sglang:num_pages", "gauge", "Number of KV cache pages.", labels,
         cfg->num_gpu_blocks);
}

static void tgi_page(endpoint *ep, strbuf *out) {
  metric(out, "tgi_queue_size", "gauge", "Current queue size", "", ep->waiting.count);
  metric(out, "tgi_batch_current_size", "gauge", "Current batch size", "", ep->running.count);
}

static void triton_page(endpoint *ep, strbuf *out) {
  const sim_config *cfg = &ep->sim->cfg;
  double used = (double)kv_in_use(ep->kv), cap = (double)kv_capacity(ep->kv);
  const char *req = "nv_trt_llm_request_metrics", *kv = "nv_trt_llm_kv_cache_block_metrics";
  sb_printf(out, "# HELP %s TRT LLM request metrics\n# TYPE %s gauge\n", req, req);
  const char *types[] = {"waiting", "scheduled", "active", "max"};
  double v[] = {ep->waiting.count, ep->running.count, ep->running.count, cfg->max_num_seqs};
  char labels[160];
  for (int i = 0; i < 4; i++) {
    snprintf(labels, sizeof labels, "model=\"tensorrt_llm\",request_type=\"%s\",version=\"1\"",
             types[i]);
    sample(out, req, labels, v[i]);
  }
  sb_printf(out, "# HELP %s TRT LLM KV cache block metrics\n# TYPE %s gauge\n", kv, kv);
  const char *kinds[] = {"max", "free", "used", "tokens_per", "fraction"};
  double k[] = {cfg->num_gpu_blocks, cap - used, used, cfg->block_size, used / cap};
  for (int i = 0; i < 5; i++) {
    snprintf(labels, sizeof labels,
             "kv_cache_block_type=\"%s\",model=\"tensorrt_llm\",version=\"1\"", kinds[i]);
    sample(out, kv, labels, k[i]);
  }
  metric(out, "nv_inference_pending_request_count", "gauge",
         "Instantaneous number of pending requests awaiting execution per-model.",
         "model=\"ensemble\",version=\"1\"", ep->waiting.count);
}

static void trtllm_page(endpoint *ep, strbuf *out) {
  const sim_config *cfg = &ep->sim->cfg;
  char labels[320];
  snprintf(labels, sizeof labels, "engine_type=\"pytorch\",model_name=\"%s\"", cfg->model);
  double used = (double)kv_in_use(ep->kv), cap = (double)kv_capacity(ep->kv);
  metric(out, "trtllm_num_requests_waiting", "gauge", "Number of waiting requests", labels,
         ep->waiting.count);
  metric(out, "trtllm_num_requests_running", "gauge", "Number of running requests", labels,
         ep->running.count);
  metric(out, "trtllm_kv_cache_utilization", "gauge", "KV cache utilization", labels, used / cap);
  metric(out, "trtllm_kv_cache_tokens_per_block", "gauge", "Number of tokens per KV cache block",
         labels, cfg->block_size);
  metric(out, "trtllm_kv_cache_max_blocks", "gauge", "Maximum number of KV cache blocks", labels,
         cfg->num_gpu_blocks);
}

static const struct {
  const char *name;
  void (*page)(endpoint *ep, strbuf *out);
} engines[] = {
    {"vllm", NULL},          {"sglang", sglang_page},       {"tgi", tgi_page},
    {"triton", triton_page}, {"trtllm-serve", trtllm_page},
};

bool metrics_engine_known(const char *engine) {
  for (size_t i = 0; i < sizeof engines / sizeof *engines; i++)
    if (!strcmp(engines[i].name, engine)) return true;
  return false;
}

void metrics_render(endpoint *ep, strbuf *out) {
  for (size_t i = 1; i < sizeof engines / sizeof *engines; i++) {
    if (strcmp(engines[i].name, ep->sim->cfg.engine)) continue;
    engines[i].page(ep, out);
    sim_counters(ep, out);
    return;
  }
  char labels[512];
  snprintf(labels, sizeof labels, "engine=\"0\",model_name=\"%s\"", ep->sim->cfg.model);
  engine_gauges(ep, out, labels);
  lora_info(ep, out);
  cache_config(ep, out);
  engine_counters(ep, out, labels);
  histogram_out(out, "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.", labels, &ep->m.ttft);
  histogram_out(out, "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.", labels, &ep->m.itl);
  sim_counters(ep, out);
}
