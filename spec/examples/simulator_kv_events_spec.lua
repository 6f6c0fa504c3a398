-- lupin-sim as an engine that publishes vLLM's KV-cache events: the real binary
-- on loopback ports, its PUB and ROUTER sockets read through libzmq (LuaJIT's
-- FFI), payloads decoded with lua-messagepack, HTTP with curl.
-- No timed assertions: receives have deadlines, waits poll a bounded number of times.
local S = require "support"
local ffi = require "ffi"
local mp = require "MessagePack"
local json = S.json

local BIN = S.BUILD .. "/lupin-sim"
local MODEL = "meta-llama/Llama-3.1-8B-Instruct"
local CURL = "env -u LD_PRELOAD curl" -- see simulator_spec.lua
local LONG = ("The quick brown fox jumps over the lazy dog. "):rep(45) -- 2025 bytes, 507 tokens, 31 full blocks

ffi.cdef [[
void *zmq_ctx_new(void);
int zmq_ctx_term(void *ctx);
void *zmq_socket(void *ctx, int type);
int zmq_close(void *s);
int zmq_connect(void *s, const char *addr);
int zmq_setsockopt(void *s, int opt, const void *v, size_t len);
int zmq_send(void *s, const void *buf, size_t len, int flags);
typedef struct zmq_msg_t { unsigned char _[64]; } zmq_msg_t;
int zmq_msg_init(zmq_msg_t *m);
int zmq_msg_recv(zmq_msg_t *m, void *s, int flags);
int zmq_msg_close(zmq_msg_t *m);
void *zmq_msg_data(zmq_msg_t *m);
size_t zmq_msg_size(const zmq_msg_t *m);
int zmq_msg_more(const zmq_msg_t *m);
]]
local Z = ffi.load("libzmq.so.5")
local ZMQ_SUB, ZMQ_DEALER = 2, 5
local ZMQ_SUBSCRIBE, ZMQ_LINGER, ZMQ_RCVTIMEO, ZMQ_SNDMORE = 6, 17, 27, 2

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return out
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

local function eventually(fn, tries)
  for _ = 1, tries or 100 do
    local v = fn()
    if v then
      return v
    end
    os.execute("sleep 0.05")
  end
  return nil
end

math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)") or "0", 16) % 100000)

local live = {}

--- Starts lupin-sim with n endpoints publishing events (and answering replay):
--- HTTP on port+i, PUB on events+i, ROUTER on replay+i, all from a random base
--- below the ephemeral range, another base when one is taken.
local function start(args, n, no_replay)
  n = n or 1
  for _ = 1, 10 do
    local port = math.random(20000, 32000 - 3 * n)
    local events, replay = port + n, port + 2 * n
    local base = os.tmpname()
    local kv = ("--kv-events-port %d %s"):format(events, no_replay and "" or "--kv-replay-port " .. replay)
    os.execute(("( %s --instant --port %d --endpoints %d %s %s >%s.log 2>&1 & echo $! >%s.pid; wait $!;"
      .. " echo $? >%s.rc ) >/dev/null 2>&1 &"):format(BIN, port, n, kv, args or "", base, base, base))
    local ready = eventually(function()
      local log = slurp(base .. ".log")
      if log:find("endpoint " .. (n - 1) .. " listening on 127.0.0.1:" .. (port + n - 1), 1, true) then
        return "ok"
      end
      if slurp(base .. ".rc") ~= "" then
        return "failed"
      end
    end, 200)
    local sim = { port = port, events = events, replay = replay, base = base,
      pid = tonumber(slurp(base .. ".pid")) }
    function sim.stop()
      if sim.stopped then
        return sim.rc
      end
      sim.stopped = true
      os.execute("kill -TERM " .. sim.pid .. " 2>/dev/null")
      eventually(function() return slurp(base .. ".rc") ~= "" end, 200)
      sim.rc = tonumber(slurp(base .. ".rc"))
      sim.output = slurp(base .. ".log")
      for _, ext in ipairs({ "", ".log", ".pid", ".rc" }) do
        os.remove(base .. ext)
      end
      return sim.rc
    end
    if ready == "ok" then
      live[#live + 1] = sim
      return sim
    end
    sim.stop()
  end
  error("lupin-sim did not start")
end

local function http(port, method, path, body)
  local tmp = os.tmpname()
  local args = { CURL .. " -s -X " .. method, "-o " .. tmp .. ".body", "-w '%{http_code}'", "--max-time 20" }
  if body then
    S.write(tmp .. ".req", type(body) == "table" and json.encode(body) or body)
    args[#args + 1] = "-H 'content-type: application/json' --data-binary @" .. tmp .. ".req"
  end
  args[#args + 1] = ("'http://127.0.0.1:%d%s'"):format(port, path)
  local status = sh(table.concat(args, " "))
  local resp = slurp(tmp .. ".body")
  for _, ext in ipairs({ "", ".body", ".req" }) do
    os.remove(tmp .. ext)
  end
  local ok, decoded = pcall(json.decode, resp)
  return tonumber(status), ok and decoded or resp
end

local function post(port, path, body)
  return http(port, "POST", path, body)
end

local function complete(port, prompt, extra)
  local body = { model = MODEL, prompt = prompt, max_tokens = 1 }
  for k, v in pairs(extra or {}) do
    body[k] = v
  end
  local st, r = post(port, "/v1/completions", body)
  assert.equal(200, st, json.encode(r))
  return r
end

local function tokenize(port, body)
  local st, r = post(port, "/tokenize", body)
  assert.equal(200, st, json.encode(r))
  return r.tokens
end

--- A long prompt whose first block is k's own.
local function numbered(k)
  return tostring(k):rep(80) .. LONG
end

local function slice(t, from, to)
  local out = {}
  for i = from, to do
    out[#out + 1] = t[i]
  end
  return out
end

-- ---- ZMQ ----------------------------------------------------------------------------

local ctx = Z.zmq_ctx_new()
local sockets = {}

local function socket(kind, port)
  local s = Z.zmq_socket(ctx, kind)
  assert(s ~= nil)
  Z.zmq_setsockopt(s, ZMQ_LINGER, ffi.new("int[1]", 0), 4)
  assert.equal(0, Z.zmq_connect(s, "tcp://127.0.0.1:" .. port))
  if kind == ZMQ_SUB then
    Z.zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0)
  end
  sockets[#sockets + 1] = s
  return s
end

--- One multipart message, or nil after timeout_ms.
local function recv(s, timeout_ms)
  Z.zmq_setsockopt(s, ZMQ_RCVTIMEO, ffi.new("int[1]", timeout_ms), 4)
  local frames = {}
  local m = ffi.new("zmq_msg_t")
  repeat
    Z.zmq_msg_init(m)
    if Z.zmq_msg_recv(m, s, 0) < 0 then
      Z.zmq_msg_close(m)
      assert(#frames == 0, "a message cut after " .. #frames .. " frames")
      return nil
    end
    frames[#frames + 1] = ffi.string(Z.zmq_msg_data(m), Z.zmq_msg_size(m))
    local more = Z.zmq_msg_more(m)
    Z.zmq_msg_close(m)
  until more == 0
  return frames
end

local function be64(b)
  local v = 0
  for i = 1, 8 do
    v = v * 256 + b:byte(i)
  end
  return v
end

local function be64_bytes(v)
  local b = {}
  for i = 8, 1, -1 do
    b[i] = string.char(v % 256)
    v = math.floor(v / 256)
  end
  return table.concat(b)
end

local FIELDS = {
  BlockStored = { "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name" },
  BlockRemoved = { "block_hashes", "medium" },
  AllBlocksCleared = {},
}

--- A decoded batch: { topic, seq, raw, ts, rank, events = { {type=..., fields by name} } }.
local function batch_of(topic, seqb, payload)
  local b = mp.unpack(payload)
  if b.events then -- --kv-events-shape map-batch
    b = { b.ts, b.events, b.data_parallel_rank, map = true }
  end
  local out = { topic = topic, seq = be64(seqb), raw = payload, ts = b[1], rank = b[3], events = {},
    batch_map = b.map }
  for _, e in ipairs(b[2]) do
    local ev
    if e.type then
      ev = e
      ev.shape = "map"
    else
      ev = { type = e[1], shape = "array" }
      for i, f in ipairs(FIELDS[e[1]]) do
        ev[f] = e[i + 1]
      end
    end
    out.events[#out.events + 1] = ev
  end
  return out
end

--- A subscriber of endpoint i's events: sub.next(ms) → batch or nil.
local function subscriber(sim, i)
  local s = socket(ZMQ_SUB, sim.events + (i or 0))
  local sub = {}
  function sub.next(timeout_ms)
    local f = recv(s, timeout_ms or 5000)
    if not f then
      return nil
    end
    assert.equal(3, #f)
    return batch_of(f[1], f[2], f[3])
  end
  --- Every batch until none comes for `quiet` ms.
  function sub.drain(quiet)
    local out = {}
    for b in function() return sub.next(quiet or 300) end do
      out[#out + 1] = b
    end
    return out
  end
  -- A subscription takes effect some time after connect: reset until one reaches us.
  local port = sim.port + (i or 0)
  local synced = false
  for _ = 1, 50 do
    assert.equal(200, (post(port, "/sim/reset")))
    local b = sub.next(100)
    if b then
      synced = true
      break
    end
  end
  assert.is_true(synced, "the subscription never took effect")
  sub.drain(200)
  return sub
end

--- The events of some batches, flattened, of one type (all when nil).
local function events(batches, kind)
  local out = {}
  for _, b in ipairs(batches) do
    for _, e in ipairs(b.events) do
      if not kind or e.type == kind then
        out[#out + 1] = e
      end
    end
  end
  return out
end

--- A replay request through a DEALER: the batches answered, and whether the end marker came.
local function replay(sim, start_seq, i)
  local d = socket(ZMQ_DEALER, sim.replay + (i or 0))
  Z.zmq_send(d, "", 0, ZMQ_SNDMORE)
  Z.zmq_send(d, be64_bytes(start_seq), 8, 0)
  local got = {}
  while true do
    local f = recv(d, 5000)
    assert.is_truthy(f, "no end marker")
    assert.equal(3, #f)
    assert.equal("", f[1])
    if f[2] == ("\255"):rep(8) then
      assert.equal("", f[3])
      return got, d
    end
    got[#got + 1] = batch_of("", f[2], f[3])
  end
end

-- ---- specs ----------------------------------------------------------------------------

describe("lupin-sim's KV-cache events", function()
  after_each(function()
    for _, s in ipairs(sockets) do
      Z.zmq_close(s)
    end
    sockets = {}
    for i = #live, 1, -1 do
      live[i].stop()
      table.remove(live, i)
    end
  end)

  teardown(function()
    Z.zmq_ctx_term(ctx)
  end)

  it("publishes BlockStored with the token ids /tokenize and render give, chained over prompts", function()
    local sim = start("", 1)
    local sub = subscriber(sim)
    local ids = tokenize(sim.port, { model = MODEL, prompt = LONG })
    assert.equal(507, #ids)
    local st, render = post(sim.port, "/v1/completions/render", { model = MODEL, prompt = LONG })
    assert.equal(200, st)
    assert.same({ { token_ids = ids } }, render)

    complete(sim.port, LONG)
    local b = sub.next()
    assert.equal("kv@127.0.0.1:" .. sim.port .. "@" .. MODEL, b.topic)
    assert.equal(0, b.rank)
    assert.is_number(b.ts)
    assert.equal(1, #b.events)
    local e = b.events[1]
    assert.equal("BlockStored", e.type)
    assert.equal("array", e.shape)
    assert.equal(31, #e.block_hashes) -- full blocks only: 31 * 16 of 507 tokens
    assert.is_nil(e.parent_block_hash)
    assert.same(slice(ids, 1, 496), e.token_ids)
    assert.equal(16, e.block_size)
    assert.is_nil(e.lora_id)
    assert.equal("GPU", e.medium)
    assert.is_nil(e.lora_name)
    -- positional: the tag, then the 7 fields in vLLM's order
    assert.truthy(b.raw:find("\x98\xabBlockStored", 1, true))

    -- the same prefix and more: only the new blocks, the parent the last cached one
    local longer = LONG .. ("Pack my box with five dozen liquor jugs. "):rep(5) -- 2230 bytes, 558 tokens
    local r = complete(sim.port, longer)
    assert.equal(496, r.usage.prompt_tokens_details.cached_tokens)
    local ids2 = tokenize(sim.port, { model = MODEL, prompt = longer })
    assert.same(slice(ids, 1, 496), slice(ids2, 1, 496)) -- a prefix on a 4-byte boundary
    local b2 = sub.next()
    assert.equal(b.seq + 1, b2.seq)
    local e2 = b2.events[1]
    assert.equal(1, #b2.events)
    assert.equal(3, #e2.block_hashes) -- blocks 32..34 of 34
    assert.equal(e.block_hashes[31], e2.parent_block_hash)
    assert.same(slice(ids2, 497, 544), e2.token_ids)

    -- a repeat caches nothing new: no batch
    complete(sim.port, LONG)
    assert.is_nil(sub.next(300))
  end)

  it("caches and publishes a chat's rendered messages, as chat render and /tokenize give them", function()
    local sim = start("", 1)
    local sub = subscriber(sim)
    local msgs = { { role = "system", content = ("You are a terse assistant. "):rep(12) },
      { role = "user", content = { { type = "text", text = ("What is the capital of France? "):rep(4) } } } }
    local st, render = post(sim.port, "/v1/chat/completions/render", { model = MODEL, messages = msgs })
    assert.equal(200, st)
    local ids = render.token_ids
    assert.same(ids, tokenize(sim.port, { model = MODEL, messages = msgs }))
    -- the template: "<|role|>\ncontent\n" each, then "<|assistant|>\n"
    local text = "<|system|>\n" .. msgs[1].content .. "\n<|user|>\n" .. msgs[2].content[1].text
      .. "\n<|assistant|>\n"
    assert.same(tokenize(sim.port, { prompt = text }), ids)
    -- without the generation prompt, the rendering stops after the last message
    local _, bare = post(sim.port, "/v1/chat/completions/render",
      { model = MODEL, messages = msgs, add_generation_prompt = false })
    assert.equal(math.ceil((#text - #"<|assistant|>\n") / 4), #bare.token_ids)

    local st2, r = post(sim.port, "/v1/chat/completions", { model = MODEL, messages = msgs, max_tokens = 1 })
    assert.equal(200, st2)
    assert.equal(#ids, r.usage.prompt_tokens)
    local full = math.floor(#ids / 16)
    local e = sub.next().events[1]
    assert.equal("BlockStored", e.type)
    assert.equal(full, #e.block_hashes)
    assert.same(slice(ids, 1, full * 16), e.token_ids)
    -- the same ids as a completion prompt hit the chat's blocks
    r = complete(sim.port, ids)
    assert.equal(math.floor((#ids - 1) / 16) * 16, r.usage.prompt_tokens_details.cached_tokens)
  end)

  it("publishes BlockRemoved for evicted blocks, the oracle following the cache", function()
    -- 40 blocks: a 507-token prompt holds 32 while it runs
    local sim = start("--num-gpu-blocks 40", 2)
    local sub = subscriber(sim)
    local A, B = "A" .. LONG, "B" .. LONG
    local function oracle(prompt)
      local st, r = post(sim.port + 1, "/sim/oracle", { model = MODEL, prompt = prompt })
      assert.equal(200, st, json.encode(r))
      assert.equal(2, #r.endpoints)
      assert.equal(sim.port, r.endpoints[1].port)
      assert.equal(0, r.endpoints[1].running)
      assert.equal(0, r.endpoints[1].waiting)
      return r.endpoints[1].cached_tokens, r.endpoints[2].cached_tokens
    end
    assert.same({ 0, 0 }, { oracle(A) })
    complete(sim.port, A)
    local stored = sub.next().events[1]
    assert.equal(31, #stored.block_hashes)
    assert.same({ 496, 0 }, { oracle(A) }) -- the other endpoint cached nothing
    assert.same({ 496, 0 }, { oracle(A) }) -- looking does not change what is cached

    complete(sim.port, B) -- 9 free blocks, then 23 of A's, its last ones first
    local b = sub.next()
    local removed = events({ b }, "BlockRemoved")
    assert.equal(23, #removed)
    for k, e in ipairs(removed) do
      assert.equal(1, #e.block_hashes)
      assert.equal("GPU", e.medium)
      assert.equal(stored.block_hashes[32 - k], e.block_hashes[1])
    end
    local new = events({ b }, "BlockStored")
    assert.equal(1, #new)
    assert.equal(31, #new[1].block_hashes)
    assert.same({ 8 * 16, 0 }, { oracle(A) }) -- A's first 8 blocks survive
    assert.same({ 496, 0 }, { oracle(B) })
    assert.equal(8 * 16, complete(sim.port, A).usage.prompt_tokens_details.cached_tokens)
  end)

  it("numbers batches one by one from 0, per endpoint, and restarts at 0", function()
    local sim = start("", 2)
    local sub = subscriber(sim, 1)
    local st, r = post(sim.port + 1, "/sim/reset?restart=1")
    assert.equal(200, st)
    assert.is_true(r.restarted)
    assert.equal(0, r.next_seq)
    assert.is_nil(sub.next(300)) -- a restart publishes nothing
    for k = 1, 3 do
      complete(sim.port + 1, numbered(k))
      complete(sim.port, numbered(k)) -- endpoint 0: another publisher
    end
    local got = sub.drain()
    assert.equal(3, #got)
    for k, b in ipairs(got) do
      assert.equal(k - 1, b.seq)
      assert.equal("kv@127.0.0.1:" .. (sim.port + 1) .. "@" .. MODEL, b.topic)
    end
    -- /sim/reset: AllBlocksCleared in the next batch; the cache is empty
    st, r = post(sim.port + 1, "/sim/reset")
    assert.equal(200, st)
    assert.is_false(r.restarted)
    assert.equal(3, r.next_seq)
    local b = sub.next()
    assert.equal(3, b.seq)
    assert.same({ { type = "AllBlocksCleared", shape = "array" } }, b.events)
    assert.truthy(b.raw:find("\x91\xb0AllBlocksCleared", 1, true))
    assert.equal(0, complete(sim.port + 1, "1111" .. LONG).usage.prompt_tokens_details.cached_tokens)
    assert.equal(4, sub.next().seq)

    -- a restart: the sequence starts again, the engine's hash seed is another
    local before = events(got, "BlockStored")[1].block_hashes[1]
    post(sim.port + 1, "/sim/reset?restart=true")
    complete(sim.port + 1, numbered(1))
    b = sub.next()
    assert.equal(0, b.seq)
    local e = b.events[1]
    assert.equal("BlockStored", e.type)
    assert.same(events(got, "BlockStored")[1].token_ids, e.token_ids)
    assert.not_equal(before, e.block_hashes[1])
  end)

  it("leaves gaps with --kv-events-drop-rate, the same ones under a seed, replay filling them", function()
    local function run()
      local sim = start("--kv-events-drop-rate 0.5 --seed 7", 1)
      local sub = subscriber(sim)
      post(sim.port, "/sim/reset?restart=1")
      for _ = 1, 24 do
        post(sim.port, "/sim/reset")
      end
      local seqs = {}
      for _, b in ipairs(sub.drain()) do
        seqs[#seqs + 1] = b.seq
      end
      local all = replay(sim, 0)
      local text = select(2, http(sim.port, "GET", "/metrics"))
      return seqs, all, text
    end
    local seqs, all, text = run()
    assert.is_true(#seqs > 0 and #seqs < 24, #seqs .. " of 24 batches sent")
    for k = 2, #seqs do
      assert.is_true(seqs[k] > seqs[k - 1])
    end
    assert.is_true(seqs[#seqs] - seqs[1] + 1 > #seqs, "no gap")
    -- replay has every batch, the dropped ones too
    assert.equal(24, #all)
    for k, b in ipairs(all) do
      assert.equal(k - 1, b.seq)
      assert.equal("AllBlocksCleared", b.events[1].type)
    end
    local dropped = tonumber(text:match('lupin_sim_kv_event_batches_total{[^}]*result="dropped"} (%S+)'))
    assert.is_true(dropped >= 24 - #seqs)
    local again = run()
    assert.same(seqs, again)
  end)

  it("replays kept batches from a start sequence number, then -1", function()
    local sim = start("--kv-buffer-steps 4", 1)
    local sub = subscriber(sim)
    post(sim.port, "/sim/reset?restart=1")
    for k = 1, 6 do
      complete(sim.port, numbered(k))
    end
    local live_batches = sub.drain()
    assert.equal(6, #live_batches)
    local got = replay(sim, 3)
    assert.equal(3, #got)
    for k, b in ipairs(got) do
      assert.equal(2 + k, b.seq)
      assert.equal(live_batches[3 + k].raw, b.raw) -- the same bytes
    end
    -- older than the buffer: what is kept (the first seq tells the gap is lost)
    got = replay(sim, 0)
    assert.equal(4, #got)
    assert.equal(2, got[1].seq)
    -- nothing at or after a future seq: only the end marker
    assert.equal(0, #replay(sim, 100))
    -- a malformed request is ignored; the socket answers the next one
    local d = socket(ZMQ_DEALER, sim.replay)
    Z.zmq_send(d, "junk", 4, 0)
    assert.is_nil(recv(d, 300))
    assert.equal(1, #replay(sim, 5))
    local text = select(2, http(sim.port, "GET", "/metrics"))
    assert.matches('lupin_sim_kv_replay_requests_total{endpoint="127.0.0.1:' .. sim.port
      .. '",result="malformed"} 1.0', text, 1, true)
  end)

  it("publishes maps (--kv-events-shape map, map-batch) and 32-byte hashes (--kv-hash-encoding bytes)", function()
    local arr = start("--kv-hash-seed 42 --lora sql-lora", 2)
    local map = start("--kv-hash-seed 42 --lora sql-lora --kv-events-shape map --kv-hash-encoding bytes", 1)
    local sa0, sa1, sm = subscriber(arr, 0), subscriber(arr, 1), subscriber(map, 0)
    complete(arr.port, LONG)
    complete(arr.port + 1, LONG)
    complete(map.port, LONG)
    local a0, a1 = sa0.next().events[1], sa1.next().events[1]
    local mb = sm.next()
    local m = mb.events[1]
    assert.equal("map", m.shape)
    assert.equal("BlockStored", m.type)
    -- the fields by name; lora_id and lora_name present though nil
    assert.truthy(mb.raw:find("\x88\xa4type\xabBlockStored", 1, true))
    assert.truthy(mb.raw:find("\xa7lora_id\xc0", 1, true))
    assert.truthy(mb.raw:find("\xa9lora_name\xc0", 1, true))
    assert.equal(16, m.block_size)
    assert.equal("GPU", m.medium)
    assert.same(a0.token_ids, m.token_ids)
    -- one seed, the same hashes on every endpoint; bytes end with the integer, big-endian
    assert.same(a0.block_hashes, a1.block_hashes)
    assert.equal(31, #m.block_hashes)
    for k, h in ipairs(m.block_hashes) do
      assert.equal(32, #h)
      assert.equal(a0.block_hashes[k], be64(h:sub(25)))
    end
    assert.is_nil(m.parent_block_hash)
    -- an adapter's blocks: other hashes, lora_id and lora_name set
    complete(arr.port, LONG, { model = "sql-lora" })
    local l = sa0.next().events[1]
    assert.equal(1, l.lora_id)
    assert.equal("sql-lora", l.lora_name)
    assert.same(a0.token_ids, l.token_ids)
    assert.not_equal(a0.block_hashes[1], l.block_hashes[1])
    -- the other events as maps too
    post(map.port, "/sim/reset")
    assert.same({ type = "AllBlocksCleared", shape = "map" }, sm.next().events[1])
    -- map-batch: the batch a map as well
    local mbatch = start("--kv-events-shape map-batch", 1)
    local sb = subscriber(mbatch)
    complete(mbatch.port, LONG)
    local bb = sb.next()
    assert.is_true(bb.batch_map)
    assert.equal(0, bb.rank)
    assert.is_number(bb.ts)
    assert.truthy(bb.raw:find("^\x83\xa2ts\xcb"))
    assert.equal("map", bb.events[1].shape)
    assert.same(a0.token_ids, bb.events[1].token_ids)
  end)

  it("gives each engine its own random hash seed by default", function()
    local sim = start("", 2)
    local s0, s1 = subscriber(sim, 0), subscriber(sim, 1)
    complete(sim.port, LONG)
    complete(sim.port + 1, LONG)
    local e0, e1 = s0.next().events[1], s1.next().events[1]
    assert.same(e0.token_ids, e1.token_ids)
    assert.not_equal(e0.block_hashes[1], e1.block_hashes[1])
    -- and keeps vLLM's cache geometry on /metrics
    local text = select(2, http(sim.port, "GET", "/metrics"))
    assert.matches('vllm:cache_config_info{block_size="16",[^}]*num_gpu_blocks="2048"} 1.0', text)
  end)

  it("refuses bad input on the new routes with OpenAI errors", function()
    local sim = start("", 1)
    local function expect(path, body, param, message)
      local st, r = post(sim.port, path, body)
      assert.equal(400, st, path)
      assert.is_table(r, "not JSON: " .. tostring(r))
      assert.equal("invalid_request_error", r.error.type)
      if param then
        assert.equal(param, r.error.param)
      end
      if message then
        assert.matches(message, r.error.message, 1, true)
      end
    end
    expect("/v1/completions/render", "{bad", nil, "JSON object")
    expect("/v1/completions/render", { model = MODEL }, "prompt", "Missing required parameter 'prompt'")
    expect("/v1/completions/render", { prompt = 5 }, "prompt")
    expect("/v1/completions/render", { prompt = { 1, "x" } }, "prompt")
    expect("/v1/chat/completions/render", "{bad", nil, "JSON object")
    expect("/v1/chat/completions/render", { model = MODEL }, "messages", "Missing required parameter 'messages'")
    expect("/v1/chat/completions/render", { messages = { { content = "x" } } }, "messages")
    expect("/v1/chat/completions/render", { messages = { { role = "user", content = "x" } },
      add_generation_prompt = true, continue_final_message = true }, "continue_final_message")
    expect("/tokenize", { model = MODEL }, "prompt")
    expect("/sim/oracle", "{bad", nil, "Invalid JSON")
    expect("/sim/oracle", { model = MODEL }, "prompt", "Missing required parameter 'prompt'")
    expect("/sim/oracle", { model = MODEL, messages = {} }, "messages")
    local st, r = post(sim.port, "/sim/oracle", { model = "nope", prompt = "x" })
    assert.equal(404, st)
    assert.equal("model_not_found", r.error.code)
    st = http(sim.port, "GET", "/sim/reset")
    assert.equal(405, st)
    -- a list of prompts: one render each; the engine serves them as one, ids one after another
    local _, items = post(sim.port, "/v1/completions/render", { prompt = { "abcdefgh", "ijk" } })
    assert.same({ { token_ids = tokenize(sim.port, { prompt = "abcdefgh" }) },
      { token_ids = tokenize(sim.port, { prompt = "ijk" }) } }, items)
    assert.equal(3, #tokenize(sim.port, { prompt = { "abcdefgh", "ijk" } }))
  end)

  it("refuses bad event flags with a message and exit 2, a taken port with exit 1", function()
    for flags, message in pairs({
      ["--kv-events-shape list"] = "--kv-events-shape must be array, map or map-batch",
      ["--kv-hash-encoding hex"] = "--kv-hash-encoding must be int or bytes",
      ["--kv-hash-seed abc"] = "--kv-hash-seed must be a number or random",
      ["--kv-events-port 9000 --kv-events-drop-rate 2"] = "--kv-events-drop-rate must be in [0,1]",
      ["--kv-replay-port 9100"] = "--kv-replay-port needs --kv-events-port",
      ["--kv-events-port 9000 --kv-buffer-steps 0"] = "--kv-buffer-steps must be at least 1",
      ["--port 9000 --endpoints 4 --kv-events-port 9002"] = "--kv-events-port: its ports overlap",
      ["--kv-events-port 70000"] = "--kv-events-port out of range",
    }) do
      local out = sh(BIN .. " " .. flags .. " 2>&1; echo rc=$?")
      assert.matches(message, out, 1, true)
      assert.matches("rc=2", out, 1, true)
    end
    local sim = start("", 1)
    local out
    for k = 1, 5 do -- an HTTP port that someone else took would fail first
      out = sh(("%s --port %d --kv-events-port %d 2>&1; echo rc=$?"):format(BIN, sim.port + 100 * k, sim.events))
      if not out:find("cannot listen", 1, true) then
        break
      end
    end
    assert.matches("cannot publish KV events on 127.0.0.1 port " .. sim.events, out, 1, true)
    assert.matches("rc=1", out, 1, true)
  end)
end)
