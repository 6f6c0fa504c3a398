-- `make demo`: a shared-prefix workload through a running `make run`, then
-- what the routing did: requests per endpoint, the prefix-cache hit rate and
-- the time to first token the simulated endpoints report.
--
--   luajit examples/demo.lua [gateway-url] [admin-url] [groups] [per-group] [concurrency]
--
-- Each group shares a long system prompt (~1,500 tokens) and asks short
-- questions; groups are interleaved so a router that ignores prefixes
-- spreads each group over every endpoint and recomputes the prefix each time.
local cjson = require "cjson"

local GATEWAY = arg[1] or "http://127.0.0.1:8080"
local ADMIN = arg[2] or "http://127.0.0.1:9090"
local GROUPS = tonumber(arg[3]) or 8
local PER_GROUP = tonumber(arg[4]) or 6
local CONCURRENCY = tonumber(arg[5]) or 8
local MODEL = os.getenv("MODEL") or "meta-llama/Llama-3.1-8B-Instruct"

local function run(cmd)
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  f:close()
  return out
end

local function get(url)
  return run("curl -sf --max-time 5 '" .. url .. "'")
end

-- per endpoint: requests served, prefix tokens hit and queried, TTFT buckets
local function snapshot(hostport)
  local s = { requests = 0, hits = 0, queries = 0, buckets = {} }
  for line in get("http://" .. hostport .. "/metrics"):gmatch("[^\n]+") do
    local name, labels, v = line:match("^([%w_:]+){?(.-)}? (%S+)$")
    v = tonumber(v)
    if name == "lupin_sim_requests_total" then
      s.requests = s.requests + v
    elseif name == "vllm:prefix_cache_hits_total" then
      s.hits = s.hits + v
    elseif name == "vllm:prefix_cache_queries_total" then
      s.queries = s.queries + v
    elseif name == "vllm:time_to_first_token_seconds_bucket" then
      local le = labels:match('le="([^"]+)"')
      s.buckets[le] = (s.buckets[le] or 0) + v
    end
  end
  return s
end

-- a quantile from cumulative histogram buckets, interpolated in its bucket
local function quantile(buckets, q)
  local bounds = {}
  for le in pairs(buckets) do
    bounds[#bounds + 1] = { le = le == "+Inf" and math.huge or tonumber(le), n = buckets[le] }
  end
  table.sort(bounds, function(a, b) return a.le < b.le end)
  local total = bounds[#bounds] and bounds[#bounds].n or 0
  if total == 0 then
    return 0
  end
  local prev_le, prev_n = 0, 0
  for _, b in ipairs(bounds) do
    if b.n >= q * total then
      if b.le == math.huge then
        return prev_le
      end
      return prev_le + (b.le - prev_le) * (q * total - prev_n) / math.max(b.n - prev_n, 1)
    end
    prev_le, prev_n = b.le, b.n
  end
  return prev_le
end

local ok, listed = pcall(cjson.decode, get(ADMIN .. "/admin/endpoints"))
if not ok then
  io.stderr:write("demo: no gateway admin at " .. ADMIN .. ": start it with `make run` first\n")
  os.exit(1)
end
local endpoints = {}
for _, e in ipairs(listed.endpoints) do
  endpoints[#endpoints + 1] = e.address .. ":" .. e.port
end
table.sort(endpoints)
local before = {}
for _, hp in ipairs(endpoints) do
  before[hp] = snapshot(hp)
end

-- the workload: bodies in files, sent by curl, CONCURRENCY at a time
local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)
local list = {}
local topics = { "astronomy", "cooking", "law", "chess", "gardening", "networking", "music",
  "history", "poetry", "medicine" }
for i = 1, PER_GROUP do
  for g = 1, GROUPS do
    local system = ("You are the %s expert of group %d. Answer briefly and cite the rules. ")
      :format(topics[(g - 1) % #topics + 1], g):rep(80)
    local body = cjson.encode({ model = MODEL, max_tokens = 16, stream = true,
      messages = { { role = "system", content = system },
        { role = "user", content = ("Question %d for group %d?"):format(i, g) } } })
    local path = ("%s/%d-%d.json"):format(dir, g, i)
    local f = assert(io.open(path, "w"))
    f:write(body)
    f:close()
    list[#list + 1] = path
  end
end
local f = assert(io.open(dir .. "/list", "w"))
f:write(table.concat(list, "\n"), "\n")
f:close()
print(("demo: %d requests (%d groups x %d, system prompts ~1,500 tokens), %d at a time, to %s")
  :format(#list, GROUPS, PER_GROUP, CONCURRENCY, GATEWAY))
local codes = run(("xargs -P %d -I{} curl -s -o /dev/null -w '%%{http_code}\\n' -H "
  .. "'content-type: application/json' --data-binary @{} %s/v1/chat/completions < %s/list")
  :format(CONCURRENCY, GATEWAY, dir))
os.execute("rm -rf " .. dir)
local good = select(2, codes:gsub("200", ""))

local hits, queries, buckets = 0, 0, {}
print(("\n  %-22s %9s"):format("endpoint", "requests"))
for _, hp in ipairs(endpoints) do
  local a, b = before[hp], snapshot(hp)
  print(("  %-22s %9d"):format(hp, b.requests - a.requests))
  hits, queries = hits + b.hits - a.hits, queries + b.queries - a.queries
  for le, n in pairs(b.buckets) do
    buckets[le] = (buckets[le] or 0) + n - (a.buckets[le] or 0)
  end
end
print(("\n  answered 200: %d of %d"):format(good, #list))
print(("  prefix-cache hit rate: %.1f%% of %d prompt tokens (the simulators' counters)")
  :format(queries > 0 and 100 * hits / queries or 0, queries))
print(("  time to first token: p50 %.0f ms, p90 %.0f ms, p99 %.0f ms (the simulators' histograms)")
  :format(quantile(buckets, 0.5) * 1000, quantile(buckets, 0.9) * 1000,
    quantile(buckets, 0.99) * 1000))
