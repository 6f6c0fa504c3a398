-- Hot reload end to end (issue 5): lupin serve in front of lupin-sim, plugins
-- and config rewritten while curl clients keep requests flowing.  The tagger
-- fixture (spec/fixtures/reload/tagger.lua.in) tags each response with its
-- code version and its generation's tag, read at pre_request and again at
-- response_header.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local TEMPLATE = P.read(support.ROOT .. "/spec/fixtures/reload/tagger.lua.in")

-- Writes like an editor: a new file renamed over the old one.
local function save(path, text)
  support.write(path .. ".tmp", text)
  assert(os.rename(path .. ".tmp", path))
end

local function write_tagger(dir, version)
  save(dir .. "/tagger.lua", (TEMPLATE:gsub("@VERSION@", version)))
end

local function config(sim, dir, params, extra)
  local eps = {}
  for i, port in ipairs(sim.ports) do
    eps[i] = { name = "e" .. i, address = "127.0.0.1", port = port }
  end
  local cfg = {
    kind = "EndpointPickerConfig",
    pluginDirs = { dir },
    plugins = { { type = "tagger", parameters = params or {} }, { type = "queue-scorer" },
      { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "tagger" },
      { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
    endpoints = eps,
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

local function reload(gw)
  local status, _, body = P.post(gw.admin, "/admin/reload", "")
  return status, json.decode(body)
end

local function generations(gw)
  local _, _, body = P.get(gw.admin .. "/admin/generations")
  return json.decode(body)
end

local function request(gw, extra)
  local body = { model = "m", prompt = "hello there", max_tokens = 3 }
  for k, v in pairs(extra or {}) do
    body[k] = v
  end
  return P.post(gw.base, "/v1/completions", body)
end

local function count(text, pattern)
  local n = 0
  for _ in text:gmatch(pattern) do
    n = n + 1
  end
  return n
end

describe("hot reload under load", function()
  local sim, gw, dir
  setup(function()
    dir = support.tmpdir()
    write_tagger(dir, "v1")
    sim = P.sim("--model m --itl-ms 1 --seed 3", 2)
    gw = P.gateway(config(sim, dir, { tag = "g1" }), "--no-watch")
  end)
  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  it("swaps 100 times with no failed request and no request split across generations",
    function()
      local body = support.write(dir .. "/body.json",
        json.encode({ model = "m", prompt = "hello there", max_tokens = 3 }))
      local stop = dir .. "/stop"
      local clients = {}
      for c = 1, 4 do
        local out = ("%s/client-%d.out"):format(dir, c)
        local script = ("while [ ! -e %s ]; do curl -sS -o /dev/null -D - -w 'status=%%{http_code}\\n'"
          .. " -H 'content-type: application/json' --data-binary @%s %s/v1/completions"
          .. " | tr -d '\\r' | grep -i -E '^(x-tag|status=)' | tr '\\n' ' '; echo; done > %s")
          :format(stop, body, gw.base, out)
        clients[c] = { p = P.start("sh -c " .. P.quote(script)), out = out }
      end
      -- wait for every client's first answer, so reloads happen under load
      for _, c in ipairs(clients) do
        P.poll(function()
          return (P.read(c.out) or ""):find("\n")
        end, "a client's first response")
      end
      local reloads = 100
      for i = 1, reloads do
        local g = 1 + i
        write_tagger(dir, g % 2 == 1 and "v1" or "v2")
        support.write(gw.config, json.encode(config(sim, dir, { tag = "g" .. g })))
        local status, res = reload(gw)
        assert.equal(200, status)
        assert.equal(g, res.generation)
        assert.truthy(res.duration_seconds > 0)
      end
      support.write(stop, "")
      for _, c in ipairs(clients) do
        P.wait(c.p)
      end
      local total, seen = 0, {}
      for _, c in ipairs(clients) do
        local last = 0
        for line in P.read(c.out):gmatch("[^\n]+") do
          total = total + 1
          assert.matches("status=200", line, 1, true)
          local v1, g1, v2, g2 = line:match("[Xx]%-[Tt]ag: (v%d) g(%d+) (v%d) g(%d+)")
          assert.truthy(v1, line)
          g1, g2 = tonumber(g1), tonumber(g2)
          -- one instance from pre_request to response_header, and its code
          -- is the version written with that generation's config
          assert.equal(g1, g2, line)
          assert.equal(v1, v2, line)
          assert.equal(g1 % 2 == 1 and "v1" or "v2", v1, line)
          assert.truthy(g1 >= last, "a client went back a generation: " .. line)
          last = g1
          seen[g1] = true
        end
      end
      local distinct = 0
      for _ in pairs(seen) do
        distinct = distinct + 1
      end
      print(("# %d reloads, %d requests, answered by %d generations"):format(reloads, total,
        distinct))
      assert.truthy(total > reloads)
      assert.truthy(distinct > 10)
      assert.equal(reloads, P.metric(gw, 'lupin_reloads_total{result="ok"}'))
      assert.equal(0, P.metric(gw, 'lupin_reloads_total{result="error"}'))
      assert.equal(reloads + 1, P.metric(gw, "lupin_generation"))
      assert.equal(1, P.metric(gw, "lupin_generations_alive"))
      assert.equal(0, P.metric(gw, "lupin_live_requests"))
      assert.equal(0, P.metric(gw, 'lupin_requests_total{status="502"}') or 0)
      -- every replaced generation shut down exactly once on each worker
      local log, workers = P.read(gw.err), #generations(gw).workers
      for g = 1, reloads do
        assert.equal(workers, count(log, "%[tagger%] shutdown v%d g" .. g .. "\n"),
          "generation " .. g)
      end
    end)
end)

describe("a reload that fails", function()
  local sim, gw, dir, good
  setup(function()
    dir = support.tmpdir()
    write_tagger(dir, "v1")
    sim = P.sim("--model m --itl-ms 1", 1)
    good = config(sim, dir, { tag = "g1" })
    gw = P.gateway(good, "--no-watch")
  end)
  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  local function serving(tag)
    local status, h, body = request(gw)
    assert.equal(200, status, body)
    assert.equal(tag .. " " .. tag, h["x-tag"])
  end

  local cases = {
    { "a broken script", function()
      save(dir .. "/tagger.lua", TEMPLATE:gsub("@VERSION@", "v2"):gsub("return {", "return {{", 1))
    end, "tagger.lua:%d+:" },
    { "a broken config", function()
      support.write(gw.config, json.encode(good):gsub('"plugins"', '"plugin"', 1))
    end, 'unknown field "plugin"' },
    { "a plugin whose new errs", function()
      support.write(gw.config, json.encode(config(sim, dir, { failNew = true })))
    end, 'plugins%[0%]: plugin "tagger" %(tagger%) failed to start: .*tagger refuses to start' },
    { "a plugin that errs only in the dry cycle", function()
      support.write(gw.config, json.encode(config(sim, dir, { failDry = true })))
    end, "during the dry scheduling cycle: .*tagger fails the dry cycle" },
  }

  for i, case in ipairs(cases) do
    it("keeps the old generation serving on " .. case[1] .. ", reporting the error", function()
      -- generation 1's sources (a failed case before may have left its own)
      write_tagger(dir, "v1")
      support.write(gw.config, json.encode(good))
      serving("v1 g1")
      local before = P.metric(gw, 'lupin_reloads_total{result="error"}')
      case[2]()
      local status, res = reload(gw)
      assert.equal(400, status)
      assert.matches(case[3], res.error.message)
      assert.truthy(res.error.message:find(gw.config .. ":", 1, true), res.error.message)
      assert.equal(before + 1, P.metric(gw, 'lupin_reloads_total{result="error"}'))
      assert.equal(1, P.metric(gw, "lupin_generation"))
      assert.equal(1, #generations(gw).generations)
      assert.truthy(count(P.read(gw.err), "reload %(admin%) failed[^\n]*generation 1 keeps serving")
        >= i)
      serving("v1 g1")
    end)
  end

  it("picks up the next valid change and reports the same digest for the same sources",
    function()
      write_tagger(dir, "v1")
      support.write(gw.config, json.encode(good))
      local digest = generations(gw).generations[1].digest
      assert.matches("^%x+$", digest)
      assert.equal(16, #digest)
      local status, res = reload(gw)
      assert.equal(200, status)
      assert.equal(2, res.generation)
      local gens = generations(gw)
      assert.equal(2, gens.current)
      assert.equal(digest, gens.generations[1].digest)
      write_tagger(dir, "v2")
      assert.equal(200, (reload(gw)))
      assert.are_not.equal(digest, generations(gw).generations[1].digest)
      serving("v2 g1")
    end)
end)

describe("old generations", function()
  local sim, gw, dir
  setup(function()
    dir = support.tmpdir()
    write_tagger(dir, "v1")
    -- 40 tokens 100 ms apart: a stream of about 4 s
    sim = P.sim("--model m --itl-ms 100", 1)
    gw = P.gateway(config(sim, dir, { tag = "g1" }), "--no-watch")
  end)
  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  it("are released, and shut down, when their last request ends -- a stream outliving reloads",
    function()
      local body = support.write(dir .. "/stream.json",
        json.encode({ model = "m", prompt = "tell me", max_tokens = 40, stream = true }))
      local out = dir .. "/stream.out"
      local stream = P.start(("curl -sS -N -D %s.h -H 'content-type: application/json'"
        .. " --data-binary @%s %s/v1/completions"):format(out, body, gw.base))
      P.poll(function()
        local _, _, b = P.get(gw.admin .. "/admin/requests")
        return #json.decode(b).requests == 1
      end, "the stream to begin")
      for g = 2, 5 do
        support.write(gw.config, json.encode(config(sim, dir, { tag = "g" .. g })))
        assert.equal(200, (reload(gw)))
      end
      -- the worker the stream runs on: 5, and 1 held by the stream
      local gens, workers = nil, #generations(gw).workers
      for _, w in ipairs(generations(gw).workers) do
        if #w.generations == 2 then
          gens = w
        end
      end
      assert.truthy(gens, "no worker holds generation 1")
      assert.equal(2, #gens.generations)
      assert.equal(5, gens.generations[1].number)
      assert.equal(1, gens.generations[2].number)
      assert.equal(1, gens.generations[2].pinned)
      assert.is_false(gens.generations[2].current)
      local log = P.read(gw.err)
      -- 2, 3, 4 had no request: shut down as soon as they were replaced, on
      -- every worker; 1 on every worker but the stream's
      for g = 2, 4 do
        assert.equal(workers, count(log, "shutdown v1 g" .. g .. "\n"))
      end
      assert.equal(workers - 1, count(log, "shutdown v1 g1\n"))
      assert.is_nil(P.read(stream.rc)) -- still streaming
      -- a request now runs generation 5
      local status, h = request(gw)
      assert.equal(200, status)
      assert.equal("v1 g5 v1 g5", h["x-tag"])
      assert.equal(0, P.wait(stream))
      assert.matches("data: %[DONE%]", P.read(stream.out))
      assert.matches("x%-tag: v1 g1 v1 g1", P.read(out .. ".h"))
      P.poll(function()
        for _, w in ipairs(generations(gw).workers) do
          if #w.generations ~= 1 then
            return false
          end
        end
        return true
      end, "generation 1 to be released")
      assert.equal(workers, count(P.read(gw.err), "shutdown v1 g1\n"))
      assert.equal(1, P.metric(gw, "lupin_generations_alive"))
    end)
end)

describe("migrate across a reload", function()
  local sim, gw
  local function cfg(s)
    local eps = {}
    for i, port in ipairs(s.ports) do
      eps[i] = { name = "e" .. i, address = "127.0.0.1", port = port }
    end
    return {
      kind = "EndpointPickerConfig",
      plugins = { { type = "prefix-cache-scorer" }, { type = "queue-scorer" },
        { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "prefix-cache-scorer", weight = 3 }, { pluginRef = "queue-scorer", weight = 1 },
        { pluginRef = "max-score-picker" } } } },
      endpoints = eps,
    }
  end
  setup(function()
    sim = P.sim("--model m --itl-ms 0 --seed 5", 4)
    gw = P.gateway(cfg(sim), "--no-watch")
  end)
  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  local function prefix_counters()
    local hits, queries = 0, 0
    for _, hp in ipairs(sim.hostports) do
      local _, _, t = P.get("http://" .. hp .. "/metrics")
      hits = hits + tonumber(t:match("\nvllm:prefix_cache_hits_total{[^}]*} (%S+)"))
      queries = queries + tonumber(t:match("\nvllm:prefix_cache_queries_total{[^}]*} (%S+)"))
    end
    return hits, queries
  end

  -- one request per group: a long shared prefix, a new question each round
  local GROUPS = 8
  local function round(n)
    local where = {}
    local h0, q0 = prefix_counters()
    for g = 1, GROUPS do
      local prefix = ("Group %d system prompt. "):format(g):rep(60)
      local status, h, body = request(gw, { prompt = prefix .. "Question " .. n .. "?",
        max_tokens = 1 })
      assert.equal(200, status, body)
      where[g] = h["x-sim-endpoint"]
    end
    local h1, q1 = prefix_counters()
    return where, (h1 - h0) / (q1 - q0)
  end

  it("keeps the prefix index: the same endpoints and hit rate right after a reload", function()
    round(0) -- warm: each group's prefix lands somewhere
    local where_before, rate_before = round(1)
    assert.truthy(rate_before > 0.8, "hit rate " .. rate_before)
    local status, res = reload(gw)
    assert.equal(200, status)
    assert.equal(2, res.generation)
    local where_after, rate_after = round(2)
    assert.same(where_before, where_after)
    assert.equal(rate_before, rate_after)
  end)
end)

describe("the file watcher", function()
  local sim, watched, unwatched, dir
  setup(function()
    dir = support.tmpdir()
    write_tagger(dir, "v1")
    sim = P.sim("--model m --itl-ms 1", 1)
    watched = P.gateway(config(sim, dir, { tag = "g1" }))
    unwatched = P.gateway(config(sim, dir, { tag = "g1" }), "--no-watch")
  end)
  teardown(function()
    P.stop(watched)
    P.stop(unwatched)
    P.stop(sim)
  end)

  local function tag(gw)
    local status, h = request(gw)
    assert.equal(200, status)
    return h["x-tag"]
  end

  it("reloads on a plugin file saved by rename; --no-watch does not", function()
    assert.equal("v1 g1 v1 g1", tag(watched))
    write_tagger(dir, "v2")
    P.poll(function()
      return P.metric(watched, "lupin_generation") == 2
    end, "the watcher's reload")
    assert.equal("v2 g1 v2 g1", tag(watched))
    assert.matches("reload %(file change%): generation 2 serving", P.read(watched.err))
    -- the same event reached both: the unwatched gateway did not reload
    assert.equal(1, P.metric(unwatched, "lupin_generation"))
    assert.equal("v1 g1 v1 g1", tag(unwatched))
  end)

  it("turns an editor's save of several files into one reload", function()
    local gen = P.metric(watched, "lupin_generation")
    write_tagger(dir, "v1")
    save(watched.config, json.encode(config(sim, dir, { tag = "g3" })))
    P.poll(function()
      return tag(watched) == "v1 g3 v1 g3"
    end, "the watcher's reload")
    assert.equal(gen + 1, P.metric(watched, "lupin_generation"))
    -- a reload now is the next one: no second reload was pending
    local status, res = reload(watched)
    assert.equal(200, status)
    assert.equal(gen + 2, res.generation)
  end)

  it("reports a broken save and picks up the fix", function()
    local gen = P.metric(watched, "lupin_generation")
    local errors = P.metric(watched, 'lupin_reloads_total{result="error"}')
    save(dir .. "/tagger.lua", "return {")
    P.poll(function()
      return P.metric(watched, 'lupin_reloads_total{result="error"}') == errors + 1
    end, "the failed reload")
    assert.matches("reload %(file change%) failed[^\n]*tagger.lua", P.read(watched.err))
    assert.equal(gen, P.metric(watched, "lupin_generation"))
    write_tagger(dir, "v2")
    P.poll(function()
      return P.metric(watched, "lupin_generation") == gen + 1
    end, "the fixed reload")
    assert.equal("v2 g3 v2 g3", tag(watched))
  end)
end)
