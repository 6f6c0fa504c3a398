-- Helpers shared by the specs: runtimes over this tree, configs, endpoints.
local cjson = require "cjson"
local native = require "lupin_native"

local M = {}

M.ROOT = os.getenv("PWD") or "."
M.FIXTURES = M.ROOT .. "/spec/fixtures/plugins"
M.BUILD = os.getenv("LUPIN_BUILD") or "build"

--- A runtime over this tree, with the spec fixture plugins available.
function M.runtime(opts)
  opts = opts or {}
  opts.home = opts.home or M.ROOT
  opts.plugin_dirs = opts.plugin_dirs or { M.FIXTURES }
  local rt = assert(native.new(opts))
  return rt
end

--- A runtime loaded with a config given as a Lua table.
function M.loaded(config, opts)
  local rt = M.runtime(opts)
  assert(rt:load_string(cjson.encode(config), "spec.json"))
  return rt
end

--- Adds n endpoints ep1..epn on 10.0.0.i:8000 with given metrics per index.
function M.endpoints(rt, n, metrics)
  for i = 1, n do
    assert(rt:upsert({ name = "ep" .. i, address = "10.0.0." .. i, port = 8000,
      labels = metrics and metrics[i] and metrics[i].labels or nil }))
    if metrics and metrics[i] then
      rt:set_metrics("ep" .. i, metrics[i])
    end
  end
end

--- Evaluates Lua in the runtime's state; decodes JSON results.
function M.eval(rt, code)
  local out = rt:eval(code)
  local ok, v = pcall(cjson.decode, out)
  if ok then
    return v
  end
  return out
end

--- The pool's in-flight counters by endpoint name (ep.in_flight, or the
--- field named: "in_flight_tokens"), the endpoints at 0 left out.
function M.in_flight(rt, field)
  return M.eval(rt, ([[
    local out = {}
    for _, ep in ipairs(require("lupin.runtime.pool").list) do
      if ep.%s ~= 0 then
        out[ep.name] = ep.%s
      end
    end
    return out]]):format(field or "in_flight", field or "in_flight"))
end

--- One full lifecycle; returns the schedule result.
function M.lifecycle(rt, body, outcome)
  local req = assert(rt:begin({ path = "/v1/completions",
    body = body or '{"model":"m","prompt":"hello"}' }))
  local res = req:schedule()
  if res.status == 200 then
    req:response_header(200, { ["content-type"] = "application/json" })
    req:response_chunk("{}")
    req:response_complete()
  end
  req:finish(outcome or "ok")
  return res
end

function M.write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

function M.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p " .. d) == 0)
  return d
end

--- Runs one of the build's C programs (LUPIN_HOME this tree) with args;
--- returns what it printed, stdout and stderr, then "rc=N".
function M.program(name, args)
  local p = io.popen(("LUPIN_HOME=%s %s/%s %s 2>&1; echo rc=$?"):format(M.ROOT, M.BUILD, name,
    args or ""))
  local out = p:read("*a")
  p:close()
  return out
end

M.json = cjson

return M
