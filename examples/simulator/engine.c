/* The engine: vLLM's continuous batching, reduced to its timing.
 *
 * A request waits until there is a free slot (`--max-num-seqs`), room for its
 * prompt's blocks in the KV cache and, for an adapter, a LoRA slot
 * (`--max-loras`). Once running, its first token comes after the prefill
 * (overhead + uncached tokens x time per token: cache hits are what make prefix
 * routing pay), then one token per decode step: the inter-token latency plus,
 * with --itl-ms-per-seq, a share per running request, so TPOT grows with the
 * batch as a GPU's does. Each running job has its own one-shot timer; when a job
 * ends its slot and blocks go to the next waiter. */
#include <math.h>
#include <stdlib.h>

#include "sim.h"

double endpoint_slowness(const endpoint *ep) { return ep->slowness; }

static void list_push(job_list *l, job *j) {
  j->prev = l->tail;
  j->next = NULL;
  if (l->tail)
    l->tail->next = j;
  else
    l->head = j;
  l->tail = j;
  l->count++;
}

static void list_remove(job_list *l, job *j) {
  if (j->prev)
    j->prev->next = j->next;
  else
    l->head = j->next;
  if (j->next)
    j->next->prev = j->prev;
  else
    l->tail = j->prev;
  j->prev = j->next = NULL;
  l->count--;
}

static void on_job_closed(uv_handle_t *h) { free(h->data); }

void job_free(job *j) {
  free(j->model);
  free(j->id);
  free(j->hashes);
  free(j->salt);
  tok_free(&j->prompt);
  free(j->blocks);
  sb_free(&j->text);
  if (j->timer.loop)
    uv_close((uv_handle_t *)&j->timer, on_job_closed);
  else
    free(j);
}

static uint64_t ms_to_timer(double ms) { return ms <= 0 ? 0 : (uint64_t)llround(ms); }

/* vLLM's lora_requests_info carries the time its adapter sets last changed. */
static void lora_touched(endpoint *ep, const job *j) {
  if (j->lora >= 0) ep->m.lora_updated = wall_seconds();
}

/* Whether the running batch can take this request's adapter: it is already
 * running, or fewer than --max-loras distinct adapters are. */
static bool lora_fits(const endpoint *ep, const job *j) {
  if (j->lora < 0) return true;
  bool seen[MAX_LORAS] = {false};
  int distinct = 0;
  for (const job *r = ep->running.head; r; r = r->next) {
    if (r->lora == j->lora) return true;
    if (r->lora >= 0 && !seen[r->lora]) {
      seen[r->lora] = true;
      distinct++;
    }
  }
  return distinct < ep->sim->cfg.max_loras;
}

static int blocks_needed(const endpoint *ep, int tokens) {
  int bs = ep->sim->cfg.block_size;
  return (tokens + bs - 1) / bs;
}

static void grow_blocks(job *j, int tokens) {
  kvcache *kv = j->ep->kv;
  while (j->nblocks < blocks_needed(j->ep, tokens) && j->nblocks < j->cap_blocks) {
    int b = kv_acquire_anon(kv);
    if (b < 0) return; /* no preemption modelled: the job runs on without the block */
    j->blocks[j->nblocks++] = b;
  }
}

static void on_tick(uv_timer_t *t);

/* Milliseconds until a running job's next token, decided when the step is
 * scheduled: the batch of that moment (this job included) sets its cost. */
static uint64_t decode_delay(const job *j) {
  const endpoint *ep = j->ep;
  const sim_config *cfg = &ep->sim->cfg;
  double step = cfg->itl_ms + cfg->itl_ms_per_seq * ep->running.count;
  return ms_to_timer(step * endpoint_slowness(ep));
}

/* Milliseconds until the first token. Uncached tokens are what costs: cache hits
 * are what make prefix routing pay. With --prefill-serial the endpoint's compute
 * is one queue (a GPU runs prefills in turn), so a prefill also waits for those
 * admitted before it, and load shows in TTFT as on a real server. */
static uint64_t prefill_delay(const job *j) {
  endpoint *ep = j->ep;
  const sim_config *cfg = &ep->sim->cfg;
  double uncached = j->prompt_tokens - j->cached_tokens;
  uint64_t own = ms_to_timer((cfg->prefill_overhead_ms + uncached * cfg->prefill_ms_per_token) *
                             endpoint_slowness(ep));
  if (!cfg->prefill_serial) return own;
  uint64_t now = uv_now(ep->sim->loop);
  uint64_t start = ep->prefill_free_at > now ? ep->prefill_free_at : now;
  ep->prefill_free_at = start + own;
  return ep->prefill_free_at - now;
}

/* Admission: prefix lookup, block allocation, then the prefill timer. */
static void job_start(job *j) {
  endpoint *ep = j->ep;
  const sim_config *cfg = &ep->sim->cfg;
  /* Hashed now, not at parse, with the engine's seed of now (a restart draws another). */
  j->nhashes = j->prompt.n / cfg->block_size;
  j->hashes = malloc(((size_t)j->nhashes + 1) * sizeof *j->hashes);
  kv_hash_blocks(ep->kv_seed, j->lora >= 0 ? cfg->loras[j->lora] : NULL, j->salt, j->prompt.ids,
                 j->nhashes, cfg->block_size, j->hashes);
  /* vLLM always computes the prompt's last token, so a fully cached prompt still
   * recomputes its last block: look up only blocks before the last token. */
  int lookup = (j->prompt_tokens - 1) / cfg->block_size;
  if (lookup > j->nhashes) lookup = j->nhashes;
  int hit = kv_match(ep->kv, j->hashes, lookup);
  j->cached_tokens = hit * cfg->block_size;
  ep->m.prefix_queries += (uint64_t)j->prompt_tokens;
  ep->m.prefix_hits += (uint64_t)j->cached_tokens;
  ep->m.prompt_tokens += (uint64_t)j->prompt_tokens;

  j->cap_blocks = blocks_needed(ep, j->prompt_tokens + j->max_tokens);
  j->blocks = malloc((size_t)j->cap_blocks * sizeof *j->blocks);
  j->nblocks = kv_acquire(ep->kv, j->hashes, j->prompt.ids, j->nhashes, j->lora, j->blocks);
  grow_blocks(j, j->prompt_tokens);

  j->state = JOB_RUNNING;
  uv_timer_start(&j->timer, on_tick, prefill_delay(j), 0);
}

/* Admits waiting jobs in arrival order while slots and blocks last; a job
 * blocked only by the LoRA limit is skipped so others can pass (as vLLM does). */
static void schedule(endpoint *ep) {
  const sim_config *cfg = &ep->sim->cfg;
  job *j = ep->waiting.head;
  while (j && ep->running.count < cfg->max_num_seqs) {
    job *next = j->next;
    if (!lora_fits(ep, j)) {
      j = next;
      continue;
    }
    if (kv_free_count(ep->kv) < blocks_needed(ep, j->prompt_tokens) && ep->running.count > 0)
      break; /* memory first-come first-served: wait for blocks to free */
    list_remove(&ep->waiting, j);
    list_push(&ep->running, j);
    lora_touched(ep, j);
    job_start(j);
    j = next;
  }
}

static void job_end(job *j) {
  endpoint *ep = j->ep;
  if (j->state == JOB_RUNNING) {
    uv_timer_stop(&j->timer);
    kv_release(ep->kv, j->blocks, j->nblocks);
    list_remove(&ep->running, j);
  } else if (j->state == JOB_WAITING) {
    list_remove(&ep->waiting, j);
  }
  j->state = JOB_FINISHED;
  lora_touched(ep, j);
  job_free(j);
  if (!ep->sim->stopping) schedule(ep);
}

void engine_submit(endpoint *ep, job *j) {
  uv_timer_init(ep->sim->loop, &j->timer);
  j->timer.data = j;
  j->state = JOB_WAITING;
  j->t_arrival = uv_hrtime();
  list_push(&ep->waiting, j);
  lora_touched(ep, j);
  schedule(ep);
}

void engine_cancel(job *j) {
  j->conn = NULL;
  job_end(j);
}

static void observe_latencies(job *j, int from, int to) {
  uint64_t now = uv_hrtime();
  if (from == 0) {
    hist_observe(&j->ep->m.ttft, (double)(now - j->t_arrival) / 1e9);
    j->t_last = now; /* tokens released with the first one come 0 s after it */
    from = 1;
  }
  /* Tokens released together share the interval since the last release. */
  for (int i = from; i < to; i++)
    hist_observe(&j->ep->m.itl, i == from ? (double)(now - j->t_last) / 1e9 : 0.0);
  j->t_last = now;
}

/* The connection goes away mid-response (--drop-rate). */
static void job_drop(job *j) {
  j->ep->m.injected_drops++;
  struct conn *c = j->conn;
  j->conn = NULL;
  if (c) conn_drop(c);
  job_end(j);
}

static void on_tick(uv_timer_t *t) {
  job *j = t->data;
  const sim_config *cfg = &j->ep->sim->cfg;
  int from = j->generated;
  int n = cfg->itl_ms > 0 ? 1 : j->max_tokens - from; /* instant: all at once */
  if (j->drop_at >= 0 && from + n > j->drop_at) n = j->drop_at - from;
  int to = from + n;
  j->generated = to;
  j->ep->m.generation_tokens += (uint64_t)n;
  observe_latencies(j, from, to);
  grow_blocks(j, j->prompt_tokens + to);

  bool done = to >= j->max_tokens;
  if (j->stream)
    openai_stream_tokens(j, from, to, done);
  else
    for (int i = from; i < to; i++)
      sb_adds(&j->text, openai_token(j, i));

  if (j->drop_at >= 0 && to >= j->drop_at) {
    job_drop(j);
  } else if (done) {
    openai_finish(j);
    j->ep->m.success++;
    job_end(j);
  } else {
    uv_timer_start(&j->timer, on_tick, decode_delay(j), 0);
  }
}

void engine_close(endpoint *ep) {
  while (ep->waiting.head)
    engine_cancel(ep->waiting.head);
  while (ep->running.head)
    engine_cancel(ep->running.head);
}
