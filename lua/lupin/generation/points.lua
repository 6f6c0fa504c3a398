-- The extension points, one row each, in request order, then the instance
-- hooks.  Each generation reads it when built (what a plugin's methods are
-- recorded, the per-point call lists of request control); the plugin
-- stats, the LuaLS fields of lupin.Plugin (lupin/sdk.lua) and the table in
-- docs/design.md follow it, which spec/core/points_spec.lua checks.  A new
-- point is a row here, the call that drives it (lupin.engine's point() for
-- request control; a host-driven one also a C entry in core/request.c and
-- lupin.h), and its spec.
--
-- layer:     "scheduler" (once per profile run, or the profile handler's),
--            "request" (request control: a list of every instance having
--            it, called in config order), "instance" (lifecycle hooks).
-- args:      what it is called with, after self.
-- returns:   what it returns.
-- on_error:  the error policy (lupin.engine).
-- absent:    what happens when no plugin of a generation defines it.
-- driver:    the lupin.h call of a host that runs it (shutdown: the end of
--            the last request pinning a released generation).
-- epp:       the endpoint picker's name of the point (its ExtensionPoint
--            constants), which a host's metrics use so the EPP's dashboards
--            match (lupin_plugin_stat.epp_point); none: lupin's own point.
---@class lupin.PointRow
---@field name string
---@field layer "scheduler"|"request"|"instance"
---@field args string
---@field returns string
---@field on_error string
---@field absent string
---@field driver string
---@field epp string?

---@type lupin.PointRow[]
return {
  { name = "prepare", driver = "lupin_request_schedule", layer = "request", args = "ctx, endpoints",
    returns = "nothing; writes request data (prefix matches, predictions) admission and the profiles read",
    on_error = "counted and logged; the request proceeds", absent = "nothing" },
  { name = "admit", epp = "Admission", driver = "lupin_request_schedule", layer = "request", args = "ctx, endpoints",
    returns = "nothing, or false, status, reason to refuse (a 429 when saturated)",
    on_error = "counted and logged; the request proceeds",
    absent = "every request is admitted" },
  { name = "pick_profiles", epp = "ProfilePicker",
    driver = "lupin_request_schedule", layer = "scheduler", args = "ctx, profiles, results",
    returns = "the profiles to run next; none ends the loop",
    on_error = "the request fails with a 500 naming the plugin",
    absent = "a config with one profile gets single-profile-handler" },
  { name = "filter", epp = "Filter", driver = "lupin_request_schedule", layer = "scheduler", args = "ctx, endpoints",
    returns = "the endpoints kept",
    on_error = "the filter is skipped for the request",
    absent = "every candidate is kept" },
  { name = "score", epp = "Scorer", driver = "lupin_request_schedule", layer = "scheduler", args = "ctx, endpoints",
    returns = "a number in [0,1] per endpoint, in the same order",
    on_error = "the scorer contributes 0 for the request",
    absent = "every endpoint scores 0" },
  { name = "pick", epp = "Picker", driver = "lupin_request_schedule", layer = "scheduler", args = "ctx, scored",
    returns = "endpoints best first; the rest are fallbacks",
    on_error = "the request fails with a 500 naming the plugin",
    absent = "a profile without picker gets max-score-picker" },
  { name = "process_results", epp = "ProcessProfilesResults",
    driver = "lupin_request_schedule", layer = "scheduler", args = "ctx, results",
    returns = "{primary = profile name, port = n?}; port: send the primary's picks to that"
      .. " port of their address (data parallelism)",
    on_error = "the request fails with a 500 naming the plugin",
    absent = "the one profile that ran is primary; several fail the request" },
  { name = "pre_request", epp = "PreRequest",
    driver = "lupin_request_schedule", layer = "request", args = "ctx, result",
    returns = "nothing; may set upstream headers",
    on_error = "counted and logged; the request proceeds", absent = "nothing" },
  { name = "response_header", epp = "ResponseReceived",
    driver = "lupin_request_response_header", layer = "request", args = "ctx, response",
    returns = "nothing; may set response headers",
    on_error = "counted and logged; the request proceeds",
    absent = "nothing (with no response hook at all, a response costs no call into Lua:"
      .. " finish hooks get its head with the end)" },
  { name = "response_chunk", epp = "ResponseStreaming",
    driver = "lupin_request_response_chunk", layer = "request", args = "ctx, response, chunk",
    returns = "nothing", on_error = "counted and logged; the request proceeds",
    absent = "nothing (a chunk costs no call into Lua, even when other hooks or finish see the response)" },
  { name = "response_complete", epp = "ResponseComplete",
    driver = "lupin_request_response_complete", layer = "request", args = "ctx, response",
    returns = "nothing", on_error = "counted and logged; the request proceeds",
    absent = "nothing (the end costs no call into Lua, even when other hooks or finish see the response)" },
  { name = "finish", driver = "lupin_request_end", layer = "request", args = "ctx, outcome",
    returns = "nothing; runs exactly once per plugin the request reached, on every path",
    on_error = "counted and logged; the other finish hooks still run",
    absent = "nothing (ending a request costs no call into Lua)" },
  { name = "init", driver = "lupin_runtime_load", layer = "instance", args = "",
    returns = "nothing", on_error = "the load or reload fails; the old generation serves",
    absent = "nothing" },
  { name = "migrate", driver = "lupin_runtime_load", layer = "instance", args = "old",
    returns = "nothing; takes over the long-lived state of the instance it replaces",
    on_error = "the load or reload fails; the old generation serves", absent = "nothing" },
  { name = "shutdown", driver = "lupin_request_end", layer = "instance", args = "",
    returns = "nothing; runs when the generation is released",
    on_error = "counted and logged", absent = "nothing" },
}
