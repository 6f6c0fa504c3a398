-- Helpers for the prefix plugins' specs: configs, requests, reading the
-- scores the spec-scores-picker fixture reports.
local S = require "support"
local assert = require "luassert"

local M = {}

--- One profile "default": the given plugins (name or {type,name,parameters,weight})
--- and the spec-scores-picker.
function M.config(plugins)
  local list, refs = { { type = "spec-scores-picker" } }, {}
  for _, p in ipairs(plugins) do
    if type(p) == "string" then
      p = { type = p }
    end
    list[#list + 1] = { type = p.type, name = p.name, parameters = p.parameters }
    refs[#refs + 1] = { pluginRef = p.name or p.type, weight = p.weight }
  end
  refs[#refs + 1] = { pluginRef = "spec-scores-picker" }
  return { plugins = list, schedulingProfiles = { { name = "default", plugins = refs } } }
end

--- Parses "ep1=0.5,ep2=0" into { ep1 = 0.5, ep2 = 0 }.
function M.scores(header)
  local out = {}
  for name, v in (header or ""):gmatch("([^=,]+)=([^,]+)") do
    out[name] = tonumber(v)
  end
  return out
end

--- Schedules and finishes one completion; returns the pick's name, the scores
--- of profile `profile` (default "default") and the raw result.
function M.request(rt, prompt, opts)
  opts = opts or {}
  local body = S.json.encode({ model = opts.model or "m", prompt = prompt,
    cache_salt = opts.salt, messages = opts.messages })
  local req = assert(rt:begin({ path = opts.path or "/v1/completions", body = body,
    headers = opts.headers, subset = opts.subset }))
  local res = req:schedule()
  req:finish(opts.outcome or (res.status == 200 and "ok" or "plugin_error"))
  local pick = res.picks[1] and res.picks[1].name
  return pick, M.scores(res.headers["x-spec-scores-" .. (opts.profile or "default")]), res
end

--- The config error for a plugin with these parameters.
function M.config_error(type_, params)
  local rt = S.runtime()
  local ok, err = rt:load_string(S.json.encode(M.config({ { type = type_, parameters = params } })),
    "spec.json")
  rt:free()
  assert.is_nil(ok)
  return err
end

--- The validated parameters (defaults filled in) of a plugin type.
function M.defaults(type_)
  local rt = S.runtime()
  local v = S.eval(rt, ([[
    local loader, schema = require "lupin.generation.loader", require "lupin.schema"
    local mod = assert(loader.load(%q, %q))
    return assert(schema.validate(mod.schema, {}))
  ]]):format(S.ROOT .. "/plugins/" .. type_ .. ".lua", type_))
  rt:free()
  return v
end

return M
