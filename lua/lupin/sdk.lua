---@meta
-- luacheck: no max line length
-- The plugin SDK's types, for LuaLS (lua-language-server): what a plugin file
-- returns and what its extension points receive.  Never loaded; the runtime's
-- own modules annotate the rest (lupin.Ctx and lupin.RequestView in
-- lupin/ctx.lua, lupin.SchemaField in lupin/schema.lua, lupin.prefix,
-- lupin.Hashes and lupin.PrefixIndex in lupin/prefix.lua, lupin.shared and
-- lupin.SharedDict in lupin/shared.lua, lupin.log,
-- lupin.picker).  A plugin file marks its table with `---@type lupin.Plugin`;
-- spec/plugins/sdk_annotations_spec.lua checks every field plugins use is here.

---@alias lupin.Level "error"|"warn"|"info"|"debug"

--- How a request ended, as finish(ctx, outcome) is told ("dry_run": the
--- synthetic request that checks a new generation before it serves).
---@alias lupin.Outcome "ok"|"rejected"|"no_endpoint"|"plugin_error"|"upstream_error"|"cancelled"|"timeout"|"invalid_request"|"dry_run"

--- One model server, read in place (an FFI object over the C pool: reading a
--- field copies nothing).  Metrics are those last scraped; a metric the
--- endpoint never reported reads NaN or 0 (see plugins/README.md).
---@class lupin.Endpoint
---@field id integer the pool's id: the key of prefix-index entries
---@field name string the config's name (default "address:port")
---@field address string an IP address or a host name
---@field port integer
---@field hostport string "address:port", an IPv6 address bracketed ("[fd00::1]:8000")
---@field labels table<string, string>
---@field waiting_queue_size number vllm:num_requests_waiting
---@field running_requests number vllm:num_requests_running
---@field kv_cache_usage number vllm:kv_cache_usage_perc, 0 to 1
---@field max_lora number from vllm:lora_requests_info
---@field active_adapters table<string|integer, string|boolean> running LoRA adapters: a list of names, and a set (adapters[name] == true)
---@field waiting_adapters table<string|integer, string|boolean> waiting LoRA adapters, the same shape
---@field cache_block_size number tokens per KV-cache block (vllm:cache_config_info)
---@field num_blocks number KV-cache blocks (vllm:cache_config_info)
---@field scraped_at number when the metrics were last scraped (lupin_now() clock), 0: never
---@field in_flight integer requests in flight there now through this gateway, every worker's (the core counts each scheduled request on the endpoint each profile chose until it ends)
---@field in_flight_tokens integer tokens in flight there now, every worker's: what requests set with ctx:set_in_flight_tokens (inflight-load-producer's or token-load-scorer's estimates)
---@field in_flight_prefill_tokens integer prefill tokens there whose response has not started, every worker's: what requests set with ctx:set_prefill_tokens, each taken off at its first body byte

--- What a picker receives: the profile's candidates and their weighted scores.
---@class lupin.Scored
---@field endpoints lupin.Endpoint[]
---@field scores number[] Σ weight × score per endpoint, aligned with endpoints

--- A scheduling profile, as the profile handler sees it (read-only).
---@class lupin.Profile
---@field name string
---@field plugins string[] the names of its plugins, in order

--- One profile run: its picks, best first, and what they were chosen from.
---@class lupin.ProfileResult
---@field endpoints lupin.Endpoint[]
---@field scores number[] the weighted scores of candidates
---@field candidates lupin.Endpoint[]

--- The scheduling result, from pre_request on (ctx.result).
---@class lupin.Result
---@field primary string the primary profile's name
---@field endpoints lupin.Endpoint[] the primary profile's picks: the request goes to the first
---@field profiles table<string, lupin.ProfileResult|false> every profile run (false: it found none)
---@field port integer? the port the primary's picks are sent to, when process_results set one

--- What process_results returns.
---@class lupin.Primary
---@field primary string
---@field port integer? send the primary's picks to this port of their address (data parallelism)

--- The endpoint's response, from response_header on (ctx.response).
---@class lupin.Response
---@field status integer
---@field headers table<string, string> lower-case names

--- The second argument of new(params, env).
---@class lupin.Env
---@field name string the instance's name
---@field type string the plugin type
---@field now fun(): number seconds, monotonic
---@field log fun(level: lupin.Level, fmt: any, ...: any) logs with the instance's name
---@field warn fun(field: string, fmt: string, ...: any) warns at a parameter's line of the config ("kvEventsConfig.concurrency")
---@field plugin fun(name: string): table?, string? another instance of the config and its type (from init on)

--- A plugin file's table.  Extension points are methods: self is the
--- instance new returned (the plugin table itself when there is no new),
--- whose missing fields are looked up in the plugin table.
---@class lupin.Plugin
---@field type string the registry name, as in the config; must match the file name
---@field schema table<string, lupin.SchemaField>? the parameters: types, defaults, bounds
---@field data_producer boolean? upstream runs it as a data producer: an entry in a profile is skipped with a warning
---@field times_response boolean? the core times the response body for ctx.timing (first and last byte, events)
---@field new (fun(params: table, env: lupin.Env): table)? builds an instance
---@field init (fun(self: table))? after new, before the generation serves
---@field migrate (fun(self: table, old: table))? on reload: take over the instance of the same name and type
---@field shutdown (fun(self: table))? when the generation's last request has ended
---@field prepare (fun(self: table, ctx: lupin.Ctx, endpoints: lupin.Endpoint[]))?
---@field admit (fun(self: table, ctx: lupin.Ctx, endpoints: lupin.Endpoint[]): boolean?, integer?, string?)? false, status, reason rejects
---@field pick_profiles (fun(self: table, ctx: lupin.Ctx, profiles: table<string, lupin.Profile>, results: table<string, lupin.ProfileResult|false>): string[])? the profiles to run next; none: done
---@field filter (fun(self: table, ctx: lupin.Ctx, endpoints: lupin.Endpoint[]): lupin.Endpoint[])? the endpoints kept
---@field score (fun(self: table, ctx: lupin.Ctx, endpoints: lupin.Endpoint[]): number[])? one score in [0, 1] per endpoint
---@field pick (fun(self: table, ctx: lupin.Ctx, scored: lupin.Scored): lupin.Endpoint[])? the endpoints, best first
---@field process_results (fun(self: table, ctx: lupin.Ctx, results: table<string, lupin.ProfileResult|false>): lupin.Primary)?
---@field pre_request (fun(self: table, ctx: lupin.Ctx, result: lupin.Result))? just before forwarding
---@field response_header (fun(self: table, ctx: lupin.Ctx, response: lupin.Response))?
---@field response_chunk (fun(self: table, ctx: lupin.Ctx, response: lupin.Response, chunk: string))?
---@field response_complete (fun(self: table, ctx: lupin.Ctx, response: lupin.Response))?
---@field finish (fun(self: table, ctx: lupin.Ctx, outcome: lupin.Outcome))? exactly once per request it reached
---@field disaggregate (fun(self: table, ctx: lupin.Ctx, decode: lupin.Endpoint): boolean)? a decider: whether disagg-profile-handler runs the stage it is named for
---@field [string] any a plugin's own helpers and constants
