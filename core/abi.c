/* The C side of the C/Lua ABI check: the size of every structure
 * lua/lupin/runtime/capi.lua declares to the FFI and the place of each of its
 * fields, as this compiler laid them out.  capi.lua compares them with its
 * own declarations when a runtime starts and refuses to run on a mismatch,
 * so the two can never drift apart silently. */
#include "internal.h"

#include <stddef.h>

#define SIZE(T)                                                                                    \
  { #T, NULL, NULL, sizeof(T), 0 }
/* Lua declares only the head of T, the fields before `private` */
#define HEAD(T, private)                                                                           \
  { #T, NULL, NULL, offsetof(T, private), 0 }
/* lua names the field in capi.lua where it differs from the C name */
#define FIELD_AS(T, f, lua)                                                                        \
  { #T, #f, lua, 0, offsetof(T, f) }
#define FIELD(T, f) FIELD_AS(T, f, NULL)

static const lupin_abi_entry abi[] = {
    SIZE(lupin_hash_input),
    FIELD(lupin_hash_input, prompt),
    FIELD(lupin_hash_input, prompt_len),
    FIELD(lupin_hash_input, model),
    FIELD(lupin_hash_input, model_len),
    FIELD(lupin_hash_input, salt),
    FIELD(lupin_hash_input, salt_len),
    FIELD(lupin_hash_input, block_size),
    FIELD(lupin_hash_input, max_blocks),
    HEAD(lupin_alloc, base),
    FIELD(lupin_alloc, used),
    FIELD(lupin_alloc, peak),
    FIELD(lupin_alloc, limit),
    FIELD(lupin_alloc, enforce),
    FIELD(lupin_alloc, refused),
    HEAD(lupin_endpoint, running_lora),
    FIELD(lupin_endpoint, id),
    FIELD(lupin_endpoint, port),
    FIELD_AS(lupin_endpoint, load.waiting_queue_size, "waiting_queue_size"),
    FIELD_AS(lupin_endpoint, load.running_requests, "running_requests"),
    FIELD_AS(lupin_endpoint, load.kv_cache_usage, "kv_cache_usage"),
    FIELD_AS(lupin_endpoint, load.max_lora, "max_lora"),
    FIELD_AS(lupin_endpoint, load.cache_block_size, "cache_block_size"),
    FIELD_AS(lupin_endpoint, load.num_blocks, "num_blocks"),
    FIELD_AS(lupin_endpoint, load.scraped_at, "scraped_at"),
    FIELD_AS(lupin_endpoint, name, "c_name"),
    FIELD_AS(lupin_endpoint, address, "c_address"),
    FIELD_AS(lupin_endpoint, counters, "c_counters"),
    SIZE(lupin_counters),
    FIELD(lupin_counters, in_flight),
    FIELD(lupin_counters, in_flight_tokens),
    FIELD(lupin_counters, prefill_tokens),
    SIZE(lupin_capi),
    FIELD(lupin_capi, rt),
    FIELD(lupin_capi, alloc),
    FIELD(lupin_capi, now),
    FIELD(lupin_capi, log),
    FIELD(lupin_capi, endpoint_free),
    FIELD(lupin_capi, result_add_pick),
    FIELD(lupin_capi, request_count),
    FIELD(lupin_capi, result_add_header),
    FIELD(lupin_capi, client_add_header),
    FIELD(lupin_capi, header_find),
    FIELD(lupin_capi, block_hashes),
    FIELD(lupin_capi, prefix_new),
    FIELD(lupin_capi, prefix_free),
    FIELD(lupin_capi, prefix_set_capacity),
    FIELD(lupin_capi, prefix_record),
    FIELD(lupin_capi, prefix_match),
    FIELD(lupin_capi, prefix_purge),
    FIELD(lupin_capi, prefix_count),
    FIELD(lupin_capi, prefix_holds),
    FIELD(lupin_capi, prefix_endpoints),
    FIELD(lupin_capi, prefix_memory),
    FIELD(lupin_capi, budget),
    FIELD(lupin_capi, budget_poll),
    FIELD(lupin_capi, shared),
    FIELD(lupin_capi, request_timing),
    FIELD(lupin_capi, request_prefill),
    SIZE(lupin_response_timing),
    FIELD(lupin_response_timing, begun_at),
    FIELD(lupin_response_timing, first_byte_at),
    FIELD(lupin_response_timing, events),
    FIELD(lupin_response_timing, newline),
    SIZE(lupin_capi_shared),
    FIELD(lupin_capi_shared, prefix_open),
    FIELD(lupin_capi_shared, prefix_close),
    FIELD(lupin_capi_shared, prefix_set_capacity),
    FIELD(lupin_capi_shared, prefix_record),
    FIELD(lupin_capi_shared, prefix_match),
    FIELD(lupin_capi_shared, prefix_purge),
    FIELD(lupin_capi_shared, prefix_count),
    FIELD(lupin_capi_shared, prefix_holds),
    FIELD(lupin_capi_shared, prefix_memory),
    FIELD(lupin_capi_shared, dict_open),
    FIELD(lupin_capi_shared, dict_get),
    FIELD(lupin_capi_shared, dict_set),
    FIELD(lupin_capi_shared, dict_incr),
    FIELD(lupin_capi_shared, dict_count),
    FIELD(lupin_capi_shared, dict_max),
    FIELD(lupin_capi_shared, flow_add),
    FIELD(lupin_capi_shared, flow_keep),
    FIELD(lupin_capi_shared, token_seed),
    FIELD(lupin_capi_shared, token_block_hashes),
    FIELD(lupin_capi_shared, tokens_put),
    FIELD(lupin_capi_shared, tokens_hashes),
    FIELD(lupin_capi_shared, tokens_count),
    FIELD(lupin_capi_shared, tokens_want),
    FIELD(lupin_capi_shared, prefix_unsure),
    FIELD(lupin_capi_shared, prefix_remove),
    FIELD(lupin_capi_shared, prefix_match_runs),
    FIELD(lupin_capi_shared, latency_open),
    FIELD(lupin_capi_shared, latency_train),
    FIELD(lupin_capi_shared, latency_predict),
    FIELD(lupin_capi_shared, latency_observe),
    FIELD(lupin_capi_shared, latency_stats),
    SIZE(lupin_tokenize_job),
    FIELD(lupin_tokenize_job, key),
    FIELD(lupin_tokenize_job, endpoint),
    FIELD(lupin_tokenize_job, model),
    FIELD(lupin_tokenize_job, text),
    FIELD(lupin_tokenize_job, text_len),
    FIELD(lupin_tokenize_job, chat),
    SIZE(lupin_dict_value),
    FIELD(lupin_dict_value, type),
    FIELD(lupin_dict_value, num),
    FIELD(lupin_dict_value, len),
    SIZE(lupin_latency_spec),
    FIELD(lupin_latency_spec, plugin),
    FIELD(lupin_latency_spec, target),
    FIELD(lupin_latency_spec, group),
    FIELD(lupin_latency_spec, features),
    FIELD(lupin_latency_spec, exported),
    FIELD(lupin_latency_spec, half_life),
    FIELD(lupin_latency_spec, quantile),
    SIZE(lupin_latency_stats),
    FIELD(lupin_latency_stats, trained),
    FIELD(lupin_latency_stats, weight),
    FIELD(lupin_latency_stats, apriori_n),
    FIELD(lupin_latency_stats, apriori_mape),
    FIELD(lupin_latency_stats, served_n),
    FIELD(lupin_latency_stats, served_ape_sum),
    FIELD(lupin_latency_stats, served_mape),
    FIELD(lupin_latency_stats, factor),
    FIELD(lupin_latency_stats, features),
    FIELD(lupin_latency_stats, w),
    {NULL, NULL, NULL, 0, 0},
};

const lupin_abi_entry *lupin__abi(void) { return abi; }

static void set_int(lua_State *L, const char *name, int v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, name);
}

/* The enum values the Lua half uses, by the names it gives them
 * (lua/lupin/runtime/enums.lua), which compares them with its own when a
 * runtime starts: one list per enum, here, the other side checked. */
void lupin__abi_push_enums(lua_State *L, const char *const *hooks, int n_hooks) {
  lua_createtable(L, 0, 4);
  lua_createtable(L, 0, LUPIN_OUTCOME_LAST + 1);
  for (int o = LUPIN_OK; o <= LUPIN_OUTCOME_LAST; o++)
    set_int(L, lupin_outcome_name((lupin_outcome)o), o);
  lua_setfield(L, -2, "outcome");
  lua_createtable(L, 0, 2);
  set_int(L, "explain", LUPIN_REQUEST_EXPLAIN);
  set_int(L, "dry_run", LUPIN_REQUEST_DRY_RUN);
  lua_setfield(L, -2, "request_flag");
  lua_createtable(L, 0, 4);
  set_int(L, "observes_response", LUPIN_GEN_OBSERVES_RESPONSE);
  set_int(L, "has_finish", LUPIN_GEN_HAS_FINISH);
  set_int(L, "observes_chunks", LUPIN_GEN_OBSERVES_CHUNKS);
  set_int(L, "times_response", LUPIN_GEN_TIMES_RESPONSE);
  set_int(L, "observes_complete", LUPIN_GEN_OBSERVES_COMPLETE);
  lua_setfield(L, -2, "gen_flag");
  lua_createtable(L, 0, n_hooks);
  for (int i = 0; i < n_hooks; i++)
    set_int(L, hooks[i], i);
  lua_setfield(L, -2, "hook");
}
