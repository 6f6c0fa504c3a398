-- build/bench-routing-client (bench/routing/client.c), the routing matrix's
-- load generator: its seeded workloads (--dry-run), the objectives workload's
-- --class settings and their errors, and one objectives run against a small
-- model server over loopback that records the headers it got and sheds the
-- sheddable class with 429.  Nothing timed: an objective is either generous
-- (a minute) or one no answer meets (a nanosecond).
local S = require "support"

local BIN = S.BUILD .. "/bench-routing-client"
-- the client is not what the sanitizers watch here (make test-asan preloads them)
local RUN = "env -u LD_PRELOAD " .. BIN

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo rc=$?"))
  local out = p:read("*a")
  p:close()
  return out:match("^(.-)rc=(%d+)%s*$")
end

local function slurp(path)
  local f = io.open(path)
  if not f then
    return ""
  end
  local s = f:read("*a")
  f:close()
  return s
end

--- The summary's key=value pairs.
local function keys(line)
  local t = {}
  for k, v in line:gmatch("([%w_]+)=(%S+)") do
    t[k] = tonumber(v) or v
  end
  return t
end

local INTERACTIVE = "interactive:share=0.6,ttft=300,tpot=40,prefixes=4,prefix-tokens=200,tail=20-800,output=16-64"
local BATCH = "batch:share=0.4,ttft=5000,objective=-1,prefixes=6,prefix-tokens=1500,tail=100-2500,output=64-128"

setup(function()
  -- not in `make all`: built as make bench-routing builds it
  local out, rc = sh(("env -u LD_PRELOAD make -s -C %s B=%s %s"):format(S.ROOT, S.BUILD, BIN))
  assert(rc == "0", out)
end)

describe("bench-routing-client --dry-run", function()
  it("draws the other families' workloads as before --class existed", function()
    local out, rc = sh(RUN .. " --groups 24 --questions 8 --system-tokens 1000 --question-tokens 100 --dry-run")
    assert.equal("0", rc)
    assert.equal("requests=192 prompt_tokens=213675 bound_hit=0.7925\n", out)
  end)

  it("draws --requests requests into the classes by share, from the seed", function()
    local cmd = ("%s --class %s --class %s --requests 1000 --dry-run --seed "):format(RUN, INTERACTIVE, BATCH)
    local a, rc = sh(cmd .. "1")
    assert.equal("0", rc)
    assert.equal(a, (sh(cmd .. "1")))
    assert.are_not.equal(a, (sh(cmd .. "2")))
    local k = keys(a)
    assert.equal(1000, k.requests)
    assert.equal(1000, k.interactive_requests + k.batch_requests)
    assert.is_true(k.interactive_requests > 550 and k.interactive_requests < 650, a)
    -- prompts: the shared prefix plus a tail within the class's range
    assert.is_true(k.interactive_prompt_tokens_mean > 220 and k.interactive_prompt_tokens_mean < 1000, a)
    assert.is_true(k.batch_prompt_tokens_mean > 1600 and k.batch_prompt_tokens_mean < 4000, a)
    assert.is_true(k.bound_hit > 0 and k.bound_hit < 1, a) -- the shared prefixes repeat
  end)

  it("refuses a bad --class with the reason", function()
    local cases = {
      { "Bad:share=1,ttft=1", "NAME: 1 to 31 of a-z 0-9 _" },
      { ":share=1,ttft=1", "NAME: 1 to 31" },
      { "a:share", "settings are key=value" },
      { "a:share=1,ttft=1,colour=red", "keys: share ttft tpot" },
      { "a:share=x,ttft=1", "a value is not a number" },
      { "a:share=1,ttft=1,prefixes=2x", "a value is not a number" },
      { "a:share=1,ttft=1,tail=9-3", "tail: MIN-MAX tokens" },
      { "a:share=1,ttft=1,tail=-1-3", "tail: MIN-MAX tokens" },
      { "a:share=1,ttft=1,output=0-3", "output: MIN-MAX tokens" },
      { "a:share=1,ttft=1,output=x", "output: MIN-MAX tokens" },
      { "a:share=1,ttft=1,objective=" .. ("p"):rep(32), "objective: 1 to 31 characters" },
      { "a:share=0,ttft=1", "needs share > 0" },
      { "a:share=1", "needs share > 0, ttft > 0" },
      { "a:share=1,ttft=1,tpot=-1", "tpot >= 0" },
      { "a:share=1,ttft=1,prefixes=0", "prefixes >= 1" },
      { "a:share=1,ttft=1,prefix-tokens=-5", "prefix-tokens >= 0" },
    }
    for _, c in ipairs(cases) do
      local out, rc = sh(("%s --class '%s' --dry-run"):format(RUN, c[1]))
      assert.equal("2", rc, c[1])
      assert.truthy(out:find("--class " .. c[1] .. ": ", 1, true), out)
      assert.truthy(out:find(c[2], 1, true), out)
    end
    local nine = (" --class a:share=1,ttft=1"):rep(9)
    local out, rc = sh(RUN .. nine .. " --dry-run")
    assert.equal("2", rc)
    assert.truthy(out:find("at most 8 classes", 1, true), out)
    out, rc = sh(RUN .. " --class a:share=1,ttft=1 --requests 0 --dry-run")
    assert.equal("2", rc)
    assert.truthy(out:find("usage:", 1, true), out)
  end)
end)

-- A model server that writes each request's objective headers and max_tokens
-- as a line of JSON to argv[2], answers the sheddable (objective -1) 429, and
-- streams max_tokens SSE token lines 2 ms apart, then [DONE], to the others.
local SERVER = [[
import json, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
class S(ThreadingMixIn, HTTPServer):
    daemon_threads = True
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        seen = {k: self.headers.get(k) for k in ("x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms",
                                                  "x-gateway-inference-objective")}
        seen["max_tokens"] = body["max_tokens"]
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps(seen) + "\n")
        if seen["x-gateway-inference-objective"] == "-1":
            self.send_response(429)
            self.end_headers()
            self.wfile.write(b'{"error":{"message":"shed"}}')
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for i in range(body["max_tokens"]):
            self.wfile.write(b'data: {"choices":[{"text":"w"}]}\n\n')
            self.wfile.flush()
            time.sleep(0.002)
        self.wfile.write(b"data: [DONE]\n\n")
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
]]

describe("bench-routing-client --class against a model server", function()
  local dir, port, pid

  setup(function()
    dir = S.tmpdir()
    S.write(dir .. "/server.py", SERVER)
    for _ = 1, 10 do
      port = math.random(20000, 32000)
      -- not under the ASan run's preloaded runtime (make test-asan): python is not ours
      os.execute(("env -u LD_PRELOAD -u LSAN_OPTIONS /usr/bin/python3 %s/server.py %d"
        .. " %s/seen.jsonl > %s/server.log 2>&1 & echo $! > %s/pid"):format(dir, port, dir, dir, dir))
      pid = slurp(dir .. "/pid"):match("%d+")
      local up
      for _ = 1, 100 do
        if os.execute(("env -u LD_PRELOAD curl -s --max-time 2 -o /dev/null http://127.0.0.1:%d/"
          .. " 2>/dev/null"):format(port)) == 0 then
          up = true
          break
        end
        os.execute("sleep 0.05")
      end
      if up then
        return
      end
      os.execute("kill " .. pid .. " 2>/dev/null")
    end
    error("the model server did not start: " .. slurp(dir .. "/server.log"))
  end)

  teardown(function()
    if pid then
      os.execute("kill " .. pid .. " 2>/dev/null")
    end
    os.execute("rm -rf " .. dir)
  end)

  it("sends each class's headers, times TPOT, counts sheds apart from failures", function()
    local out, rc = sh(("%s --target 127.0.0.1:%d --rate 200 --requests 24 --seed 3 --out %s/requests.txt"
      .. " --class fast:share=1,ttft=60000,tpot=60000,prefix-tokens=16,tail=4-8,output=3-5"
      .. " --class never:share=1,ttft=0.000001,tail=4-8,output=2-2"
      .. " --class batch:share=1,ttft=60000,objective=-1,tail=4-8,output=7-7"):format(RUN, port, dir))
    -- a 429 is the objectives workload's answer: the run did not fail
    assert.equal("0", rc, out)
    local k = keys(out)
    assert.equal(24, k.requests)
    assert.equal(24, k.fast_requests + k.never_requests + k.batch_requests)
    assert.is_true(k.fast_requests > 0 and k.never_requests > 0 and k.batch_requests > 0, out)
    assert.equal(k.fast_requests + k.never_requests, k.ok)
    assert.equal(k.batch_requests, k.shed)
    assert.equal(k.batch_requests, k.batch_shed)
    assert.equal(0, k.batch_met) -- shed: not met
    assert.equal(k.fast_requests, k.fast_met)
    assert.equal(0, k.never_met)
    assert.is_true(k.fast_tpot_p50_ms > 0, out)

    -- what the server got: the class's objectives, priority and max_tokens
    local got = {}
    for line in slurp(dir .. "/seen.jsonl"):gmatch("[^\n]+") do
      local h = S.json.decode(line)
      local ttft = h["x-llm-d-slo-ttft-ms"]
      got[ttft] = got[ttft] or {}
      table.insert(got[ttft], h)
    end
    assert.equal(k.never_requests, #got["1e-06"])
    assert.equal(k.fast_requests + k.batch_requests, #got["60000"])
    for _, h in ipairs(got["60000"]) do
      if h["x-gateway-inference-objective"] == "-1" then
        assert.equal(S.json.null, h["x-llm-d-slo-tpot-ms"])
        assert.equal(7, h.max_tokens)
      else
        assert.equal("60000", h["x-llm-d-slo-tpot-ms"])
        assert.is_true(h.max_tokens >= 3 and h.max_tokens <= 5)
      end
    end
    for _, h in ipairs(got["1e-06"]) do
      assert.equal(S.json.null, h["x-gateway-inference-objective"])
      assert.equal(2, h.max_tokens)
    end

    -- per request: the usual 8 columns, then class, TPOT and met
    local n = 0
    for line in slurp(dir .. "/requests.txt"):gmatch("[^\n]+") do
      n = n + 1
      local f = {}
      for w in line:gmatch("%S+") do
        f[#f + 1] = w
      end
      assert.equal(11, #f, line)
      local class, status, tpot, met = f[9], f[5], tonumber(f[10]), f[11]
      if class == "batch" then
        assert.same({ "429", "0" }, { status, met })
        assert.equal(-1, tpot)
      else
        assert.equal("200", status)
        assert.is_true(tpot > 0, line)
        assert.equal(class == "fast" and "1" or "0", met, line)
      end
    end
    assert.equal(24, n)
  end)
end)
