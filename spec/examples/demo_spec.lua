-- `make demo` (examples/demo/demo.sh) beside a running `make run`: the same
-- workload through the gateway and through a random-routing one, side by side.
local P = require "e2e.procs"
local support = require "support"

local ROOT = support.ROOT

local function free(port)
  return os.execute(("bash -c '(exec 3<>/dev/tcp/127.0.0.1/%d)' 2>/dev/null"):format(port)) ~= 0
end

local function ports()
  for _ = 1, 50 do
    local base = math.random(20000, 32000) -- below the kernel's ephemeral ports
    local ok = true
    for p = base, base + 7 do
      ok = ok and free(p)
    end
    if ok then
      return { sim = base, port = base + 4, admin = base + 5, baseline = base + 6 }
    end
  end
  error("no free port range")
end

local function demo(p, gateway)
  local proc = P.start(("env B=%s GATEWAY=%s SIM=127.0.0.1:%d BASELINE_PORT=%d NGROUPS=4 " ..
    "QUESTIONS=3 CONCURRENCY=4 bash %s/examples/demo/demo.sh"):format(support.BUILD, gateway,
    p.sim, p.baseline, ROOT))
  local rc = P.wait(proc)
  return rc, (P.read(proc.out) or "") .. (P.read(proc.err) or "")
end

describe("make demo (examples/demo/demo.sh)", function()
  it("runs the workload through lupin and through random routing and prints both", function()
    local p = ports()
    local run = P.start(("env B=%s SIM_PORT=%d PORT=%d ADMIN_PORT=%d bash %s/examples/run.sh")
      :format(support.BUILD, p.sim, p.port, p.admin, ROOT))
    P.poll(function()
      return (P.read(run.out) or ""):find("Ctrl-C stops everything", 1, true)
    end, "make run's banner")
    local rc, out = demo(p, "http://127.0.0.1:" .. p.port)
    P.signal(run, "TERM")
    P.wait(run)
    assert.equal(0, rc, out)
    assert.truthy(out:find("%s+lupin%s+random\n"), out)
    local lupin, random = out:match("requests per endpoint%s+(%S+)%s+(%S+)")
    for _, col in ipairs({ lupin, random }) do -- every request answered, once
      local n = 0
      for c in col:gmatch("%d+") do
        n = n + tonumber(c)
      end
      assert.equal(12, n, out)
    end
    assert.truthy(out:find("failed requests%s+0%s+0\n"), out)
    assert.truthy(out:find("prefix%-cache hit rate %(simulator%)%s+[%d.]+%%%s+[%d.]+%%\n"), out)
    assert.truthy(free(p.baseline), "the random gateway is stopped")
  end)

  it("says to start make run first when no gateway answers", function()
    local p = ports()
    local rc, out = demo(p, "http://127.0.0.1:" .. p.port)
    assert.equal(1, rc)
    assert.truthy(out:find("start it with make run first", 1, true), out)
  end)
end)
