-- Precise prefix routing end to end (docs/kv-events.md): lupin serve
-- subscribes to lupin-sim's KV-cache events (vLLM's ZMQ wire format),
-- tokenizes shared prefixes through the sim's /tokenize, and routes by what
-- each engine holds now — after evictions, lost batches, replays and
-- restarts — with every request answered.
local P = require "e2e.procs"
local json = P.json

local MODEL = "meta-llama/Llama-3.1-8B-Instruct"

-- lupin-sim with n endpoints publishing events (and answering replays when
-- replay is true): its events and replay ports are a range of their own,
-- another tried when taken.
local function sim(n, args, replay)
  for _ = 1, 10 do
    local ev, rp = P.port(n), P.port(n)
    local extra = ("--model %s --kv-events-port %d%s %s"):format(MODEL, ev,
      replay and (" --kv-replay-port %d"):format(rp) or "", args or "")
    local ok, s = pcall(P.sim, extra, n)
    if ok then
      s.events, s.replay = ev, replay and rp or nil
      return s
    end
  end
  error("lupin-sim did not start with events")
end

-- The endpoints, each with its own publisher as a label (they share
-- 127.0.0.1, so the configured socketPort cannot tell them apart).
local function endpoints(s)
  local eps = P.sim_endpoints(s)
  for i, ep in ipairs(eps) do
    ep.labels = { ["lupin.io/kv-events"] = ("tcp://127.0.0.1:%d"):format(s.events + i - 1),
      ["lupin.io/kv-replay"] = s.replay and ("tcp://127.0.0.1:%d"):format(s.replay + i - 1)
        or nil }
  end
  return eps
end

local function config(s, params)
  return {
    kind = "EndpointPickerConfig",
    plugins = { { type = "precise-prefix-cache-scorer", name = "precise",
      parameters = params or { tokenProcessorConfig = { blockSize = 16 } } },
      { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "precise" }, { pluginRef = "max-score-picker" } } } },
    endpoints = endpoints(s),
    gateway = { refreshIntervalMs = 50, explainWithoutToken = 1 },
  }
end

local function kv(gw)
  local _, _, body = P.get(gw.admin .. "/admin/kv-events")
  return json.decode(body)
end

-- The subscriber thread lists an endpoint once it has subscribed, a moment
-- after the gateway answers: a spec waits for it before reading the list.
local function wait_subscribed(gw, s)
  P.poll(function()
    local st = kv(gw)
    return st.enabled and #st.endpoints == #s.ports
  end, "the subscriptions")
end

local function by_name(state)
  local out = {}
  for _, e in ipairs(state.endpoints) do
    out[e.endpoint] = e
  end
  return out
end

-- A completion, explained: where it went, the precise plugin's note per
-- endpoint (its prepare step in the explain record).
local n_sent = 0
local function complete(gw, prompt)
  n_sent = n_sent + 1
  local id = "kv-" .. n_sent
  local path, body_of = "/v1/completions", { model = MODEL, prompt = prompt, max_tokens = 2 }
  if type(prompt) == "table" then -- chat messages
    path, body_of = "/v1/chat/completions", { model = MODEL, messages = prompt, max_tokens = 2 }
  end
  local code, h, body = P.post(gw.base, path, body_of,
    ("-H 'x-lupin-explain: 1' -H 'x-request-id: %s'"):format(id))
  assert.equal(200, code, body)
  local _, _, record = P.get(gw.admin .. assert(h["x-lupin-explain-record"], "no record"))
  local rec = json.decode(record)
  local note
  for _, step in ipairs(rec.steps or {}) do
    if step.plugin == "precise" and step.point == "prepare" then
      note = step.published
    end
  end
  return rec.picks[1], note, rec
end

local CONTEXT = ("Tenant 7 keeps its whole handbook here, chapter after chapter. "):rep(24)

describe("precise prefix routing from lupin-sim's KV events", function()
  local s, gw

  setup(function()
    s = sim(2, "--instant --block-size 16 --num-gpu-blocks 64", true)
    gw = P.gateway(config(s))
    wait_subscribed(gw, s)
  end)

  teardown(function()
    P.stop(gw)
    P.stop(s)
  end)

  it("learns the blocks an engine stored, through the shared prefix's tokens", function()
    local first = complete(gw, CONTEXT .. "What is chapter one about?")
    P.poll(function()
      return by_name(kv(gw))[first].stored > 0
    end, "BlockStored from " .. first)
    -- the second shares the context: its tokens are asked for, then known
    complete(gw, CONTEXT .. "And chapter two?")
    local went, note
    P.poll(function()
      went, note = complete(gw, CONTEXT .. "And chapter three?")
      return note and note[went] and note[went].how == "precise"
    end, "a precise match")
    assert.is_true(note[went].blocks > 0)
    assert.is_true(P.metric(gw, 'lupin_tokenize_requests_total{result="ok"}') >= 1)
  end)

  it("learns a chat's shared messages: the engine renders them, the keys meet", function()
    local system = { role = "system", content = CONTEXT }
    local went, note
    P.poll(function()
      went, note = complete(gw, { system, { role = "user", content = "Which chapter? " .. n_sent } })
      return note and note[went] and note[went].how == "precise" and note[went].blocks > 0
    end, "a precise match of the system message")
  end)

  it("routes by what the engine holds now: a cache cleared is a match lost", function()
    local went = complete(gw, CONTEXT .. "Chapter four?")
    local port = s.ports[tonumber(went:match("(%d+)$"))]
    local code = P.post("http://127.0.0.1:" .. port, "/sim/reset", "")
    assert.equal(200, code)
    P.poll(function()
      return by_name(kv(gw))[went].cleared > 0
    end, "AllBlocksCleared applied")
    local _, note = complete(gw, CONTEXT .. "Chapter five?")
    assert.equal(0, note[went].blocks or 0)
  end)

  it("counts every endpoint's events on /metrics", function()
    local _, _, text = P.get(gw.admin .. "/metrics")
    assert.matches('lupin_kv_events_batches_total{endpoint="sim%-1"} %d', text)
    assert.matches('lupin_kv_events_subscription_state{endpoint="sim%-1",state="%a+"} 1', text)
    assert.matches("lupin_kv_events_lag_seconds_count %d", text)
  end)

  it("drains on SIGTERM with the subscriber thread joined: exit 0", function()
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw), P.read(gw.err))
  end)
end)

describe("lost batches", function()
  it("are replayed from the engine's replay socket: no resync, every request answered",
    function()
      local s = sim(1, "--instant --block-size 16 --kv-events-drop-rate 0.3 --seed 7", true)
      local gw = P.gateway(config(s))
      finally(function()
        P.stop(gw)
        P.stop(s)
      end)
      wait_subscribed(gw, s)
      for i = 1, 30 do
        local code = P.post(gw.base, "/v1/completions", { model = MODEL,
          prompt = ("Prompt number %d, long enough for a few blocks. "):format(i):rep(6),
          max_tokens = 2 })
        assert.equal(200, code)
      end
      local e
      P.poll(function()
        e = kv(gw).endpoints[1]
        return e.gaps > 0 and e.replays > 0
      end, "a gap replayed")
      assert.equal(0, e.resyncs)
      assert.equal(0, e.replays_failed)
    end)

  it("without a replay socket, purge the endpoint and learn it again (unsure meanwhile)",
    function()
      local s = sim(1, "--instant --block-size 16 --kv-events-drop-rate 0.3 --seed 7")
      local gw = P.gateway(config(s))
      finally(function()
        P.stop(gw)
        P.stop(s)
      end)
      wait_subscribed(gw, s)
      for i = 1, 30 do
        assert.equal(200, (P.post(gw.base, "/v1/completions", { model = MODEL,
          prompt = ("Prompt number %d, long enough for a few blocks. "):format(i):rep(6),
          max_tokens = 2 })))
      end
      local e
      P.poll(function()
        e = kv(gw).endpoints[1]
        return e.resyncs > 0
      end, "a resync")
      assert.is_true(e.gaps > 0)
      assert.matches('lupin_kv_events_resyncs_total{endpoint="sim%-1"} [1-9]',
        select(3, P.get(gw.admin .. "/metrics")))
    end)
end)

describe("an engine restarted", function()
  it("is seen by its sequence going back: its blocks purged, then learnt again", function()
    local s = sim(1, "--instant --block-size 16", true)
    local gw = P.gateway(config(s))
    finally(function()
      P.stop(gw)
      P.stop(s)
    end)
    wait_subscribed(gw, s)
    assert.equal(200, (P.post(gw.base, "/v1/completions", { model = MODEL,
      prompt = CONTEXT, max_tokens = 2 })))
    P.poll(function()
      return kv(gw).endpoints[1].stored > 0
    end, "blocks stored")
    assert.equal(200, (P.post("http://127.0.0.1:" .. s.ports[1], "/sim/reset?restart=1", "")))
    assert.equal(200, (P.post(gw.base, "/v1/completions", { model = MODEL,
      prompt = CONTEXT .. "again", max_tokens = 2 })))
    P.poll(function()
      local e = kv(gw).endpoints[1]
      return (e.restarts > 0 or e.cleared > 0) and e.blocks > 0
    end, "the restart healed")
  end)
end)

describe("a tokenizer that fails", function()
  it("leaves requests scored approximately, every one answered, the failure counted", function()
    -- the fixture server answers /tokenize with a completion: no token ids
    local up = P.upstream()
    local gw = P.gateway({
      kind = "EndpointPickerConfig",
      plugins = { { type = "precise-prefix-cache-scorer", name = "precise" },
        { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "precise" }, { pluginRef = "max-score-picker" } } } },
      endpoints = { { name = "up", address = "127.0.0.1", port = up.port } },
      gateway = { refreshIntervalMs = 50, explainWithoutToken = 1 },
    })
    finally(function()
      P.stop(gw)
      P.stop(up)
    end)
    for i = 1, 4 do
      local _, note = complete(gw, CONTEXT .. "question " .. i)
      assert.equal("approximate", note.up.how)
    end
    P.poll(function()
      return (P.metric(gw, 'lupin_tokenize_requests_total{result="failed"}') or 0) >= 1
    end, "the failed tokenize counted")
    assert.equal(0, P.metric(gw, 'lupin_tokenize_requests_total{result="ok"}') or 0)
  end)
end)

describe("garbage on the wire", function()
  -- A fake engine from this spec: a ZMQ PUB through LuaJIT's FFI.
  local ffi = require "ffi"
  ffi.cdef [[
    void *zmq_ctx_new(void);
    int zmq_ctx_term(void *ctx);
    void *zmq_socket(void *ctx, int type);
    int zmq_close(void *s);
    int zmq_bind(void *s, const char *addr);
    int zmq_send(void *s, const void *buf, size_t len, int flags);
    int zmq_setsockopt(void *s, int option, const void *v, size_t len);
  ]]
  local zmq = ffi.load("libzmq.so.5")
  local PUB, SNDMORE, LINGER = 1, 2, 17
  local mp = require "MessagePack"
  mp.set_array("with_hole") -- vLLM's positional events have nil fields

  -- A sequence frame: 8 bytes, big-endian.
  local function seq(n)
    local b = {}
    for i = 7, 0, -1 do
      b[#b + 1] = string.char(math.floor(n / 2 ^ (8 * i)) % 256)
    end
    return table.concat(b)
  end

  -- lupin-sim (for HTTP) and a gateway subscribed to this spec's PUB in the
  -- sim's place; send(frames) publishes one message.
  local function fake_engine(params)
    local s = P.sim("--model " .. MODEL .. " --instant", 1)
    s.events = P.port() -- no engine there: this spec publishes instead
    local ctx = zmq.zmq_ctx_new()
    local pub = zmq.zmq_socket(ctx, PUB)
    zmq.zmq_setsockopt(pub, LINGER, ffi.new("int[1]", 0), 4)
    assert.equal(0, zmq.zmq_bind(pub, "tcp://127.0.0.1:" .. s.events))
    local gw
    -- registered before the gateway starts: a start that fails still closes
    -- the socket, or libzmq's threads outlive the library at exit
    finally(function()
      zmq.zmq_close(pub)
      zmq.zmq_ctx_term(ctx)
      P.stop(gw)
      P.stop(s)
    end)
    gw = P.gateway(config(s, params))
    wait_subscribed(gw, s)
    local function send(frames)
      for i, f in ipairs(frames) do
        zmq.zmq_send(pub, f, #f, i < #frames and SNDMORE or 0)
      end
    end
    return gw, send
  end

  it("is counted and logged, never a crash; good batches after it still apply", function()
    local gw, send = fake_engine()
    local good = mp.pack({ 1.5, { { "BlockStored", { 11, 12 }, nil, (function()
      local t = {}
      for i = 1, 32 do
        t[i] = i
      end
      return t
    end)(), 16, nil, "GPU" } }, 0 })
    P.poll(function()
      send({ "kv@x", seq(0), good })
      return kv(gw).endpoints[1].batches > 0
    end, "the subscription")
    send({ "kv@x", seq(1) })                          -- two frames
    send({ "kv@x", "\1\2\3", good })                  -- a short sequence frame
    send({ "kv@x", seq(2), "\xc1\xc1garbage" })       -- not msgpack
    send({ "kv@x", seq(3), mp.pack({ 1, "events" }) }) -- the wrong shape
    send({ "kv@x", seq(4), good:sub(1, #good - 3) })   -- truncated
    send({ "kv@x", seq(5), good })
    local e
    P.poll(function()
      e = kv(gw).endpoints[1]
      return e.bad >= 5 and e.last_seq == 5
    end, "five bad messages counted")
    assert.equal(5, e.bad) -- and the good ones applied
    assert.equal(2, e.blocks)
    assert.equal(200, (P.post(gw.base, "/v1/completions", { model = MODEL, prompt = "still up",
      max_tokens = 2 })))
  end)

  it("a publisher that floods is bounded: drops become holes, the endpoint unsure, requests answered",
    function()
      local gw, send = fake_engine({ tokenProcessorConfig = { blockSize = 16 },
        maxPendingBatches = 1, unsureSeconds = 30 })
      -- one batch of 256 blocks, packed once: sending it costs the spec a
      -- copy, applying it costs the subscriber far more
      local tokens, hashes = {}, {}
      for i = 1, 256 * 16 do
        tokens[i] = i % 1000
      end
      for i = 1, 256 do
        hashes[i] = i
      end
      local payload = mp.pack({ 1.5, { { "BlockStored", hashes, nil, tokens, 16, nil, "GPU" } },
        0 })
      local n = 0
      local function send_one()
        send({ "kv@x", seq(n), payload })
        n = n + 1
      end
      P.poll(function()
        send_one()
        return kv(gw).endpoints[1].batches > 0
      end, "the subscription")
      -- far more, and faster, than the subscriber applies past a queue of one
      -- batch and the sockets' buffers: ZMQ drops the rest
      for _ = 1, 5000 do
        send_one()
      end
      assert.equal(200, (P.post(gw.base, "/v1/completions", { model = MODEL,
        prompt = "during the flood", max_tokens = 2 })))
      -- the first batch after the drops shows the hole
      local e
      local ok = pcall(P.poll, function()
        send_one()
        e = kv(gw).endpoints[1]
        return e.lost > 0 and e.state == "unsure"
      end, "the drops seen as holes")
      assert(ok, "no drops seen as holes: " .. json.encode(e))
      assert.is_true(e.gaps > 0 and e.resyncs > 0)
      assert.is_true(e.batches < n)
    end)
end)
