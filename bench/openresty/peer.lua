-- The OpenResty peer of `lupin serve` (bench/openresty/README.md): what an
-- OpenResty engineer would write in an afternoon for the EPP's default
-- routing (examples/configs/epp-default.yaml): 3·prefix + 2·queue + 2·KV,
-- the highest score wins, ties at random.
--
--   access_by_lua_block { require("peer").access() }   -- decode, score, pick
--   balancer_by_lua_block { require("peer").balance() } -- proxy to the pick
--   init_worker_by_lua_block { require("peer").init(endpoints) }
--
-- Prefix index: lua_shared_dict "prefix", block hash (8 raw bytes) -> bitmask
-- of the endpoints that hold it; the dict's LRU evicts.  Block hashes are
-- lupin's (core/blockhash.c): seed = xxh64(model ‖ salt), h[i] =
-- xxh64(block[i] ‖ le64(h[i-1])), 64-character blocks, from libxxhash
-- through the FFI.  Metrics: lua_shared_dict "metrics", "q<i>" and "kv<i>",
-- scraped from each endpoint's /metrics (vLLM names) every 50 ms by one
-- timer per worker over keep-alive cosockets.
local ffi = require "ffi"
local bit = require "bit"
local cjson = require "cjson.safe"
local balancer = require "ngx.balancer"

local band, bor, lshift = bit.band, bit.bor, bit.lshift
local random = math.random
local ngx = ngx

ffi.cdef [[
  unsigned long long XXH64(const void *input, size_t length, unsigned long long seed);
]]
local xxh = ffi.load("xxhash")

local BLOCK = 64          -- characters per block (16 tokens x 4, as lupin's autoTune)
local MAX_BLOCKS = 256    -- maxPrefixBlocksToMatch
local W_PREFIX, W_QUEUE, W_KV = 3, 2, 2
local SCRAPE = 0.05       -- seconds between scrapes

local M = {}
local eps = {}            -- { host=, port= } by index 1..n
local prefix = ngx.shared.prefix
local metrics = ngx.shared.metrics

local buf = ffi.new("uint8_t[?]", BLOCK + 8)   -- one block and the previous hash
local prev = ffi.cast("uint64_t *", buf + BLOCK) -- x86-64: stored little-endian
local hashes = ffi.new("uint64_t[?]", MAX_BLOCKS)
local counts, scores = {}, {}

-- The chained hashes of the prompt's full blocks; returns their number.
local function hash_prompt(prompt, model, salt)
  local n = math.min(math.floor(#prompt / BLOCK), MAX_BLOCKS)
  local seed = model .. salt
  local h = xxh.XXH64(seed, #seed, 0)
  for i = 0, n - 1 do
    ffi.copy(buf, ffi.cast("const char *", prompt) + i * BLOCK, BLOCK)
    prev[0] = h
    h = xxh.XXH64(buf, BLOCK + 8, 0)
    hashes[i] = h
  end
  return n
end

local function key(i)
  return ffi.string(hashes + i, 8)
end

-- What the request's prompt is: a completion's prompt, or a chat's message
-- contents one after another.
local function prompt_of(body)
  local p = body.prompt
  if type(p) == "string" then return p end
  if type(body.messages) == "table" then
    local parts = {}
    for _, m in ipairs(body.messages) do
      if type(m) == "table" and type(m.content) == "string" then parts[#parts + 1] = m.content end
    end
    return table.concat(parts, "\n")
  end
  return ""
end

local function fail(status, msg)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode({ error = { message = msg, type = "invalid_request_error", code = status } }))
  return ngx.exit(status)
end

function M.access()
  ngx.req.read_body()
  local raw, body = ngx.req.get_body_data(), {}
  if raw then -- no body (GET /v1/models, /metrics): routed on load alone
    body = cjson.decode(raw)
    if type(body) ~= "table" then return fail(400, "the request body is not a JSON object") end
  elseif ngx.req.get_body_file() then
    return fail(413, "the request body is too large to keep in memory")
  end
  local model = type(body.model) == "string" and body.model or ""
  local salt = type(body.cache_salt) == "string" and body.cache_salt or ""
  local n = hash_prompt(prompt_of(body), model, salt)
  local neps = #eps

  -- prefix: per endpoint, the blocks it holds of the leading run anyone holds
  for j = 1, neps do counts[j] = 0 end
  for i = 0, n - 1 do
    local mask = prefix:get(key(i))
    if not mask or mask == 0 then break end
    for j = 1, neps do
      if band(mask, lshift(1, j - 1)) ~= 0 then counts[j] = counts[j] + 1 end
    end
  end

  -- queue: (max - q) / (max - min) over the endpoints, all 1 when equal
  local qmin, qmax = math.huge, -math.huge
  for j = 1, neps do
    local q = metrics:get("q" .. j) or 0
    scores[j] = q
    if q < qmin then qmin = q end
    if q > qmax then qmax = q end
  end

  local best, top, ties = 1, -math.huge, 0
  for j = 1, neps do
    local kv = metrics:get("kv" .. j) or 0
    local s = W_PREFIX * (n > 0 and counts[j] / n or 0)
      + W_QUEUE * (qmax == qmin and 1 or (qmax - scores[j]) / (qmax - qmin))
      + W_KV * math.max(0, math.min(1, 1 - kv))
    if s > top then
      best, top, ties = j, s, 1
    elseif s == top then
      ties = ties + 1
      if random(ties) == 1 then best = j end
    end
  end

  -- the pick will hold these blocks
  local bitj = lshift(1, best - 1)
  for i = 0, n - 1 do
    local k = key(i)
    local mask = prefix:get(k) or 0
    if band(mask, bitj) == 0 then prefix:set(k, bor(mask, bitj)) end
  end
  ngx.ctx.pick = best
end

function M.balance()
  local ep = eps[ngx.ctx.pick or 1]
  local ok, err = balancer.set_current_peer(ep.host, ep.port)
  if not ok then ngx.log(ngx.ERR, "set_current_peer: ", err) end
end

-- One endpoint's /metrics over a keep-alive connection: its waiting queue
-- and KV-cache usage (the legacy gpu_cache_usage_perc when kv_ is absent).
local function scrape_one(j)
  local ep = eps[j]
  local sock = ngx.socket.tcp()
  sock:settimeout(1000)
  local ok, err = sock:connect(ep.host, ep.port)
  if not ok then return ngx.log(ngx.WARN, "scrape ", ep.host, ":", ep.port, ": ", err) end
  sock:send("GET /metrics HTTP/1.1\r\nHost: " .. ep.host .. "\r\n\r\n")
  local len
  while true do
    local line = sock:receive("*l")
    if not line then return sock:close() end
    if line == "" then break end
    local v = line:match("^[Cc]ontent%-[Ll]ength:%s*(%d+)")
    if v then len = tonumber(v) end
  end
  if not len then return sock:close() end
  local text = sock:receive(len)
  if not text then return sock:close() end
  sock:setkeepalive(10000, 4)
  local q = text:match("\nvllm:num_requests_waiting[^\n]* ([%d.eE+-]+)")
  local kv = text:match("\nvllm:kv_cache_usage_perc[^\n]* ([%d.eE+-]+)")
    or text:match("\nvllm:gpu_cache_usage_perc[^\n]* ([%d.eE+-]+)")
  metrics:set("q" .. j, tonumber(q) or 0)
  metrics:set("kv" .. j, tonumber(kv) or 0)
end

local function scrape(premature)
  if premature then return end
  for j = 1, #eps do scrape_one(j) end
end

-- list: "host:port host:port ..."
function M.init(list)
  for host, port in list:gmatch("([^%s:]+):(%d+)") do
    eps[#eps + 1] = { host = host, port = tonumber(port) }
  end
  math.randomseed(ngx.now() * 1000 + ngx.worker.pid())
  local ok, err = ngx.timer.every(SCRAPE, scrape)
  if not ok then ngx.log(ngx.ERR, "scrape timer: ", err) end
end

return M
