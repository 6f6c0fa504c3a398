-- What lupin serve says when things go wrong: plugin tracebacks in the log,
-- a missing plugin directory named, x-request-id on every answer, an
-- endpoint's own error told apart in the access log, /v1/models ids as the
-- endpoints wrote them.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local MODEL = "meta-llama/Llama-3.1-8B-Instruct"

-- fails in score for the model "boom" only, so the dry cycle passes
local FLAKY = [[
local function deep(endpoints)
  return endpoints.missing.field
end
local function helper(ctx, endpoints)
  if ctx.request.model == "boom" then
    local s = deep(endpoints)
    return s
  end
  local scores = {}
  for i = 1, #endpoints do
    scores[i] = 1
  end
  return scores
end
return {
  type = "errors-flaky-scorer",
  score = function(_, ctx, endpoints)
    local s = helper(ctx, endpoints)
    return s
  end,
}
]]

local function access_lines(gw)
  local out = {}
  for line in (P.read(gw.out) or ""):gmatch("[^\n]+") do
    if line:sub(1, 1) == "{" then
      out[#out + 1] = json.decode(line)
    end
  end
  return out
end

local function access_line(gw, id)
  return P.poll(function()
    for _, l in ipairs(access_lines(gw)) do
      if l.id == id then
        return l
      end
    end
  end, "the access log line of " .. id)
end

describe("lupin serve's errors", function()
  local sim, gw, plugin_file

  setup(function()
    sim = P.sim("--model " .. MODEL .. " --itl-ms 0", 1)
    local dir = P.dir .. "/errors-plugins"
    os.execute("mkdir -p " .. dir)
    plugin_file = dir .. "/errors-flaky-scorer.lua"
    support.write(plugin_file, FLAKY)
    gw = P.gateway({
      pluginDirs = { dir },
      plugins = { { type = "errors-flaky-scorer" }, { type = "max-score-picker" } },
      endpoints = { { name = "e1", address = "127.0.0.1", port = sim.ports[1] } },
    }, "--no-watch")
  end)

  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  it("logs a plugin error with its traceback: the plugin's frames, file:line", function()
    local status = P.post(gw.base, "/v1/completions", { model = "boom", prompt = "x",
      max_tokens = 1 })
    assert.truthy(status == 200 or status == 404, status) -- the scorer counts 0
    local line = P.poll(function()
      return (P.read(gw.err) or ""):match("[^\n]*errors%-flaky%-scorer[^\n]*failed in score[^\n]*")
    end, "the error in the log")
    local trace = line:match("%(traceback: (.-)%)$")
    assert.truthy(trace, line)
    assert.equal(("%s:2 in upvalue 'deep' <- %s:6 in upvalue 'helper' <- %s:18 in the function"
      .. " of line 17"):format(plugin_file, plugin_file, plugin_file), trace)
    assert.falsy(trace:find("lua/lupin/", 1, true))
  end)

  it("puts x-request-id on every answer, errors before scheduling included", function()
    local cases = {
      { 400, P.post(gw.base, "/v1/completions", '{"model": 1}') },
      { 400, P.post(gw.base, "/v1/completions", "not json") },
      { 404, P.get(gw.base .. "/nowhere") },
      { 405, P.get(gw.base .. "/v1/completions") },
      { 503, P.post(gw.base, "/v1/completions", { model = "m", prompt = "x" },
        "-H 'x-gateway-destination-endpoint-subset: 10.9.9.9:1'") },
      { 200, P.get(gw.base .. "/v1/models") },
    }
    local ids = {}
    for _, c in ipairs(cases) do
      local want, status, headers = c[1], c[2], c[3]
      assert.equal(want, status)
      local id = headers["x-request-id"]
      assert.truthy(id and #id > 0, "no x-request-id on a " .. want)
      assert.is_nil(ids[id], "the same id twice: " .. id)
      ids[id] = true
    end
    -- the client's own id comes back, and the access log names it
    local status, headers = P.post(gw.base, "/v1/completions", '{"model": 1}',
      "-H 'x-request-id: client-7'")
    assert.equal(400, status)
    assert.equal("client-7", headers["x-request-id"])
    assert.equal(400, access_line(gw, "client-7").status)
    -- a made-up id is the one the access log shows
    local _, h404 = P.get(gw.base .. "/nowhere")
    assert.equal(404, access_line(gw, h404["x-request-id"]).status)
  end)

  it("tells an endpoint's own error status apart from ok in the access log", function()
    local status = P.post(gw.base, "/v1/completions", { model = "no-such-model", prompt = "x" },
      "-H 'x-request-id: upstream-404'")
    assert.equal(404, status)
    local line = access_line(gw, "upstream-404")
    assert.equal(404, line.status)
    assert.equal("endpoint_error", line.outcome)
    status = P.post(gw.base, "/v1/completions", { model = MODEL, prompt = "x", max_tokens = 1 },
      "-H 'x-request-id: upstream-200'")
    assert.equal(200, status)
    assert.equal("ok", access_line(gw, "upstream-200").outcome)
  end)

  it("writes /v1/models ids as the endpoints did, slashes unescaped", function()
    local status, _, body = P.get(gw.base .. "/v1/models")
    assert.equal(200, status)
    assert.truthy(body:find('"id":"' .. MODEL .. '"', 1, true), body)
    assert.falsy(body:find("\\/", 1, true), body)
    assert.equal(MODEL, json.decode(body).data[1].id)
  end)
end)

describe("a missing plugin directory", function()
  it("is named, with the line of its pluginDirs entry", function()
    local path = P.dir .. "/nodir.yaml"
    support.write(path, "pluginDirs:\n- .\n- no-such-dir\nplugins:\n- type: queue-scorer\n")
    local out, rc = P.run(P.LUPIN .. " check --config " .. path .. " 2>&1")
    assert.equal(1, rc)
    assert.truthy(out:find(('%s:3: pluginDirs[1]: plugin directory "no-such-dir" (%s/no-such-dir)'
      .. " does not exist"):format(path, P.dir), 1, true), out)
  end)

  it("is listed with the others when a plugin type is unknown", function()
    local path = P.dir .. "/unknown.yaml"
    support.write(path, "pluginDirs: [.]\nplugins:\n- type: no-such-scorer\n")
    local out, rc = P.run(P.LUPIN .. " check --config " .. path .. " 2>&1")
    assert.equal(1, rc)
    assert.truthy(out:find('unknown plugin type "no-such-scorer"', 1, true), out)
    assert.truthy(out:find("(plugin directories: " .. support.ROOT .. "/plugins, " .. P.dir
      .. "/.)", 1, true), out)
  end)
end)
