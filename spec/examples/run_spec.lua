-- `make run` (examples/run.sh): the banner only once lupin-sim and lupin
-- serve both answer, a completion through it, and a clear message with a
-- non-zero exit when a port is taken or either process dies.  Ports are
-- random free ones (SIM_PORT, PORT, ADMIN_PORT), not the defaults a
-- developer's own `make run` may hold.
local P = require "e2e.procs"
local support = require "support"
local json = require "cjson"

local RUN = support.ROOT .. "/examples/run.sh"

local function free(port) -- nothing accepts a connection there
  return os.execute(("bash -c '(exec 3<>/dev/tcp/127.0.0.1/%d)' 2>/dev/null"):format(port)) ~= 0
end

local function ports()
  for _ = 1, 50 do
    local base = math.random(20000, 32000) -- below the kernel's ephemeral ports
    local all = { sim = base, port = base + 4, admin = base + 5 }
    local ok = true
    for p = base, base + 5 do
      ok = ok and free(p)
    end
    if ok then
      return all
    end
  end
  error("no free port range")
end

local started = {}
local function run(p, extra)
  local proc = P.start(("env B=%s SIM_PORT=%d PORT=%d ADMIN_PORT=%d %s bash %s"):format(
    support.BUILD, p.sim, p.port, p.admin, extra or "", RUN))
  started[#started + 1] = proc
  return proc
end

local function output(proc)
  return (P.read(proc.out) or "") .. (P.read(proc.err) or "")
end

local function banner(proc)
  return P.poll(function()
    local out = output(proc)
    return out:find("Ctrl-C stops everything", 1, true) and out or (P.read(proc.rc) and out)
  end, "the banner or an exit")
end

-- make run on free ports, up to its banner; another program of this busy
-- machine may take a port between the check and the bind: then again
local function running(extra)
  for _ = 1, 5 do
    local p = ports()
    local proc = run(p, extra)
    local out = banner(proc)
    if out:find("Ctrl-C stops everything", 1, true) then
      return p, proc, out
    end
    assert.truthy(out:find("address already in use", 1, true), out)
  end
  error("make run did not start in 5 tries")
end

-- The simulator make run started on p.sim, from /proc (pgrep was seen to
-- hang on this machine, and a minimal Debian may lack it).
local function sim_pid(p)
  local want = ("lupin-sim\0--endpoints\0004\0--port\0%d\0"):format(p.sim)
  local ls = io.popen("ls /proc")
  for name in ls:lines() do
    local f = name:match("^%d+$") and io.open("/proc/" .. name .. "/cmdline", "rb")
    if f then
      local cmd = f:read("*a") or ""
      f:close()
      if cmd:find(want, 1, true) then
        ls:close()
        return tonumber(name)
      end
    end
  end
  ls:close()
  return nil
end

describe("make run (examples/run.sh)", function()
  after_each(function() -- a failed spec leaves nothing running
    for _, proc in ipairs(started) do
      if not P.read(proc.rc) then
        P.signal(proc, "TERM")
        P.wait(proc)
      end
    end
    started = {}
  end)

  -- TERM takes the path Ctrl-C's INT takes (one trap): a background job
  -- started from a script ignores INT, and make test-fresh presses Ctrl-C
  it("shows the banner once both answer, serves a completion, and a signal stops both", function()
    local p, proc, out = running()
    assert.truthy(out:find("http://127.0.0.1:" .. p.port, 1, true), out)
    local status, _, body = P.post("http://127.0.0.1:" .. p.port, "/v1/completions",
      { model = "meta-llama/Llama-3.1-8B-Instruct", prompt = "Hello", max_tokens = 2 })
    assert.equal(200, status, body)
    assert.truthy(json.decode(body).choices[1])
    P.signal(proc, "TERM")
    assert.equal(143, P.wait(proc))
    assert.truthy(output(proc):find("stopped", 1, true))
    assert.is_nil(sim_pid(p)) -- the simulator went with it
    assert.truthy(free(p.port) and free(p.admin))
  end)

  it("serves the flow-control example with one flag", function()
    local p, proc, out = running("CONFIG=examples/configs/flow-control.yaml")
    assert.truthy(out:find("(config examples/configs/flow-control.yaml)", 1, true), out)
    local status, _, body = P.post("http://127.0.0.1:" .. p.port, "/v1/completions",
      { model = "meta-llama/Llama-3.1-8B-Instruct", prompt = "Hello", max_tokens = 2 },
      "-H 'x-llm-d-inference-objective: batch'")
    assert.equal(200, status, body)
    local _, _, flows = P.get("http://127.0.0.1:" .. p.admin .. "/admin/flows")
    local v = json.decode(flows)
    assert.is_true(v.enabled, flows)
    P.signal(proc, "TERM")
    assert.equal(143, P.wait(proc))
  end)

  it("names a port that is taken and exits 1 without a banner", function()
    local p = ports()
    local holder = P.sim("", 1) -- holds a port of its own; use it as the gateway's
    p.port = holder.ports[1]
    local proc = run(p)
    assert.equal(1, P.wait(proc))
    local out = output(proc)
    assert.truthy(out:find("127.0.0.1:" .. p.port .. " is in use", 1, true), out)
    assert.falsy(out:find("Ctrl-C stops everything", 1, true))
    P.stop(holder)
  end)

  it("says which process died at start, and exits 1", function()
    local p = ports()
    local bad = support.tmpdir() .. "/broken.yaml"
    support.write(bad, "plugins:\n- type: no-such-plugin\n")
    local proc = run(p, "CONFIG=" .. bad)
    assert.equal(1, P.wait(proc))
    local out = output(proc)
    assert.truthy(out:find("lupin serve exited while starting", 1, true), out)
    assert.truthy(out:find("no-such-plugin", 1, true), out) -- the gateway's own reason
    assert.falsy(out:find("Ctrl-C stops everything", 1, true))
    assert.is_nil(sim_pid(p))
  end)

  it("takes a process stopped by a signal for a stop, not a failure", function()
    -- Ctrl-C reaches the simulator and the gateway too; one may end first
    local p, proc = running()
    os.execute("kill -INT " .. assert(sim_pid(p)))
    assert.equal(130, P.wait(proc))
    local out = output(proc)
    assert.truthy(out:find("lupin-sim was stopped; stopping the other", 1, true), out)
    assert.falsy(out:find("exited (status", 1, true), out)
    assert.truthy(free(p.port) and free(p.admin))
  end)

  it("says which process died later, stops the other, and exits 1", function()
    local p, proc = running()
    local pid = assert(sim_pid(p), "no lupin-sim on port " .. p.sim)
    os.execute("kill -KILL " .. pid)
    assert.equal(1, P.wait(proc))
    local out = output(proc)
    assert.truthy(out:find("lupin-sim exited (status 137); stopping the other", 1, true), out)
    assert.truthy(free(p.port) and free(p.admin))
  end)
end)
