-- lupin-sim, the simulated vLLM endpoints: the real binary on loopback ports,
-- talked to with curl. No timed assertions: waits poll with a bounded number of tries.
local S = require "support"
local json = S.json

local BIN = S.BUILD .. "/lupin-sim"
local MODEL = "meta-llama/Llama-3.1-8B-Instruct"
-- curl is the client, not what is under test: under LUPIN_ASAN=1 the preloaded
-- sanitizer runtime hangs it, so it runs without the preload.
local CURL = "env -u LD_PRELOAD curl"

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

local function sleep(s)
  os.execute("sleep " .. s)
end

--- Polls fn (returning a truthy value when done) up to `tries` times.
local function eventually(fn, tries)
  for _ = 1, tries or 100 do
    local v = fn()
    if v then
      return v
    end
    sleep(0.05)
  end
  return nil
end

math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)") or "0", 16) % 100000)

-- Simulators started by a test; the ones a test leaves running (a failed
-- assertion before its stop) are stopped after it, unless marked `keep`.
local live = {}

--- Starts lupin-sim with `args` on a random free port base; returns a handle
--- { port, log, stop() }. The subshell waits for it so its exit code is kept.
local function start(args, n)
  n = n or 1
  for _ = 1, 10 do
    local port = math.random(20000, 32000 - n) -- below the kernel's ephemeral ports
    local base = os.tmpname()
    os.execute(("( %s --port %d --endpoints %d %s >%s.log 2>&1 & echo $! >%s.pid; wait $!; echo $? >%s.rc )"
      .. " >/dev/null 2>&1 &"):format(BIN, port, n, args or "", base, base, base))
    local ready = eventually(function()
      local log = slurp(base .. ".log")
      if log:find("endpoint " .. (n - 1) .. " listening on 127.0.0.1:" .. (port + n - 1), 1, true) then
        return "ok"
      end
      if slurp(base .. ".rc") ~= "" then
        return "failed"
      end
    end, 200)
    local sim = { port = port, base = base, log = base .. ".log", pid = tonumber(slurp(base .. ".pid")) }
    function sim.stop()
      if sim.stopped then
        return sim.rc
      end
      sim.stopped = true
      os.execute("kill -TERM " .. sim.pid .. " 2>/dev/null")
      eventually(function() return slurp(base .. ".rc") ~= "" end, 200)
      sim.rc = tonumber(slurp(base .. ".rc"))
      sim.output = slurp(sim.log)
      os.remove(base)
      os.remove(base .. ".log")
      os.remove(base .. ".pid")
      os.remove(base .. ".rc")
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

--- One HTTP request with curl. Returns status, body, headers (lower-cased names), curl's exit code.
local function http(port, method, path, body, headers)
  local tmp = os.tmpname()
  local args = { CURL .. " -s -N -X " .. method, "-o " .. tmp .. ".body", "-D " .. tmp .. ".hdr",
    "-w '%{http_code}'", "--max-time 20" }
  if body then
    S.write(tmp .. ".req", type(body) == "table" and json.encode(body) or body)
    args[#args + 1] = "-H 'content-type: application/json' --data-binary @" .. tmp .. ".req"
  end
  for k, v in pairs(headers or {}) do
    args[#args + 1] = ("-H '%s: %s'"):format(k, v)
  end
  args[#args + 1] = ("'http://127.0.0.1:%d%s'; echo \" $?\""):format(port, path)
  local out = sh(table.concat(args, " "))
  local status, rc = out:match("(%d+) (%d+)")
  local hdrs = {}
  for line in slurp(tmp .. ".hdr"):gmatch("[^\r\n]+") do
    local k, v = line:match("^([^:]+):%s*(.*)$")
    if k then
      hdrs[k:lower()] = v
    end
  end
  local resp = slurp(tmp .. ".body")
  for _, ext in ipairs({ "", ".body", ".hdr", ".req" }) do
    os.remove(tmp .. ext)
  end
  return tonumber(status), resp, hdrs, tonumber(rc)
end

local function post(port, path, body, headers)
  local status, resp, hdrs, rc = http(port, "POST", path, body, headers)
  local ok, decoded = pcall(json.decode, resp)
  return status, ok and decoded or resp, hdrs, rc
end

--- Fires a request in the background (the spec does not wait for it).
local function post_later(port, path, body)
  local f = os.tmpname()
  S.write(f, json.encode(body))
  os.execute(("(" .. CURL .. " -s -o /dev/null --max-time 30 -H 'content-type: application/json' --data-binary @%s"
    .. " http://127.0.0.1:%d%s; rm -f %s) >/dev/null 2>&1 &"):format(f, port, path, f))
end

--- The /metrics page as { [name{labels}] = value } plus the raw text.
local function metrics(port)
  local _, text = http(port, "GET", "/metrics")
  local m = {}
  for line in text:gmatch("[^\n]+") do
    if not line:match("^#") then
      local key, v = line:match("^(%S+) (%S+)$")
      if key then
        m[key] = tonumber(v)
        m[key:match("^[^{]+")] = m[key:match("^[^{]+")] or tonumber(v)
      end
    end
  end
  return m, text
end

--- The SSE events of a stream body, checking the framing: "data: ...\n\n" each.
local function events(body)
  local out = {}
  local pos = 1
  while pos <= #body do
    local s, e, data = body:find("^data: ([^\n]*)\n\n", pos)
    assert(s, "bad SSE framing at byte " .. pos .. ": " .. body:sub(pos, pos + 80))
    out[#out + 1] = data
    pos = e + 1
  end
  return out
end

local LONG = ("The quick brown fox jumps over the lazy dog. "):rep(45) -- 2025 chars, 507 tokens

describe("lupin-sim", function()
  after_each(function()
    for i = #live, 1, -1 do
      if not live[i].keep then
        live[i].stop()
        table.remove(live, i)
      end
    end
  end)

  describe("flags", function()
    it("--help prints every flag with its default and exits 0", function()
      local out = sh(BIN .. " --help; echo rc=$?")
      assert.matches("rc=0", out, 1, true)
      for _, f in ipairs({ "host", "port", "endpoints", "model", "max-loras", "max-num-seqs", "block-size",
        "num-gpu-blocks", "max-model-len", "default-max-tokens", "prefill-overhead-ms",
        "prefill-ms-per-token", "itl-ms", "itl-ms-per-seq", "seed", "error-rate", "drop-rate", "slow-factor",
        "max-body-bytes", "lora", "slow-endpoints", "prefill-serial", "log-requests" }) do
        assert.matches("%-%-" .. f:gsub("%-", "%%-") .. "%s+[^\n]*%(default [^)]+%)", out)
      end
      assert.matches("--instant", out, 1, true)
      assert.matches("--itl-ms                 inter-token latency (0: all tokens at once) (default 10)", out, 1, true)
      assert.matches("--itl-ms-per-seq         decode step time added per running request: TPOT grows with the"
        .. " batch (no effect with --itl-ms 0) (default 0)", out, 1, true)
    end)

    it("rejects an unknown flag, a bad value and a bad slow endpoint with exit 2", function()
      local out = sh(BIN .. " --bogus 1 2>&1; echo rc=$?")
      assert.matches("unknown flag --bogus", out, 1, true)
      assert.matches("rc=2", out, 1, true)
      out = sh(BIN .. " --itl-ms fast 2>&1; echo rc=$?")
      assert.matches("--itl-ms: bad value 'fast'", out, 1, true)
      out = sh(BIN .. " --engine ollama 2>&1; echo rc=$?")
      assert.matches("--engine must be one of vllm, sglang, tgi, triton, trtllm-serve", out, 1, true)
      assert.matches("rc=2", out, 1, true)
      for _, bad in ipairs({ "-1", "nan", "inf", "-0.5" }) do
        out = sh(BIN .. " --itl-ms-per-seq " .. bad .. " 2>&1; echo rc=$?")
        assert.matches("lupin-sim: --itl-ms-per-seq must be a finite number of milliseconds, at least 0", out, 1, true)
        assert.matches("rc=2", out, 1, true)
      end
      out = sh(BIN .. " --itl-ms-per-seq 2ms 2>&1; echo rc=$?")
      assert.matches("--itl-ms-per-seq: bad value '2ms'", out, 1, true)
      assert.matches("rc=2", out, 1, true)
      out = sh(BIN .. " --endpoints 2 --slow-endpoints 5 2>&1; echo rc=$?")
      assert.matches("'5' is not an endpoint index (0..1)", out, 1, true)
      assert.matches("rc=2", out, 1, true)
    end)
  end)

  describe("serving", function()
    local sim
    setup(function()
      sim = start("--instant --lora sql-lora,chat-lora --seed 7 --num-gpu-blocks 256", 2)
      sim.keep = true -- shared by this block's tests; its teardown stops it
    end)
    teardown(function()
      assert.equal(0, sim.stop())
      assert.matches("lupin-sim: stopped", sim.output, 1, true)
    end)

    it("prints one line per endpoint", function()
      local log = slurp(sim.log)
      assert.matches("endpoint 0 listening on 127.0.0.1:" .. sim.port, log, 1, true)
      assert.matches("endpoint 1 listening on 127.0.0.1:" .. (sim.port + 1), log, 1, true)
    end)

    it("answers a completion with text, finish reason and usage, echoing the gateway headers", function()
      local status, r, h = post(sim.port, "/v1/completions", { model = MODEL, prompt = ("abcd"):rep(10),
        max_tokens = 5 }, { ["x-request-id"] = "req-1", ["x-gateway-destination-endpoint"] = "127.0.0.1:1" })
      assert.equal(200, status)
      assert.matches("application/json", h["content-type"], 1, true)
      assert.equal("req-1", h["x-request-id"])
      assert.equal("127.0.0.1:1", h["x-sim-destination"])
      assert.equal("127.0.0.1:" .. sim.port, h["x-sim-endpoint"])
      assert.equal("text_completion", r.object)
      assert.equal(MODEL, r.model)
      assert.equal(1, #r.choices)
      assert.equal("length", r.choices[1].finish_reason)
      assert.is_true(#r.choices[1].text > 0)
      assert.same({ prompt_tokens = 10, completion_tokens = 5, total_tokens = 15,
        prompt_tokens_details = { cached_tokens = 0 } }, r.usage)
    end)

    it("generates a request id when none is sent", function()
      local _, _, h = post(sim.port, "/v1/completions", { model = MODEL, prompt = "x" })
      assert.matches("^sim%-0%-%d+$", h["x-request-id"])
    end)

    it("answers a chat completion, max_completion_tokens and the default output length", function()
      local status, r = post(sim.port, "/v1/chat/completions", { model = MODEL,
        messages = { { role = "system", content = "be brief" }, { role = "user", content = { { type = "text",
          text = "hello" } } } }, max_completion_tokens = 3 })
      assert.equal(200, status)
      assert.equal("chat.completion", r.object)
      assert.equal("assistant", r.choices[1].message.role)
      assert.is_true(#r.choices[1].message.content > 0)
      assert.equal(3, r.usage.completion_tokens)
      status, r = post(sim.port, "/v1/chat/completions", { model = MODEL,
        messages = { { role = "user", content = "hi" } } })
      assert.equal(200, status)
      assert.equal(16, r.usage.completion_tokens)
    end)

    it("streams a completion as SSE chunks, then usage, then [DONE]", function()
      local body = { model = MODEL, prompt = ("abcd"):rep(8), max_tokens = 4 }
      local _, whole = post(sim.port, "/v1/completions", body)
      body.stream, body.stream_options = true, { include_usage = true }
      local status, text, h = http(sim.port, "POST", "/v1/completions", body)
      assert.equal(200, status)
      assert.matches("^text/event%-stream", h["content-type"])
      assert.equal("chunked", h["transfer-encoding"])
      local ev = events(text)
      assert.equal(6, #ev) -- 4 tokens, usage, [DONE]
      assert.equal("[DONE]", ev[6])
      local joined = ""
      for i = 1, 4 do
        local c = json.decode(ev[i])
        assert.equal("text_completion", c.object)
        assert.equal(i == 4 and "length" or json.null, c.choices[1].finish_reason)
        joined = joined .. c.choices[1].text
      end
      assert.equal(whole.choices[1].text, joined)
      local u = json.decode(ev[5])
      assert.same({}, u.choices)
      assert.same({ prompt_tokens = 8, completion_tokens = 4, total_tokens = 12,
        prompt_tokens_details = { cached_tokens = 0 } }, u.usage)
    end)

    it("streams a chat completion: the role first, content deltas, no usage unless asked", function()
      local status, text = http(sim.port, "POST", "/v1/chat/completions", { model = "sql-lora", stream = true,
        messages = { { role = "user", content = "hi" } }, max_tokens = 3 })
      assert.equal(200, status)
      local ev = events(text)
      assert.equal(5, #ev) -- role, 3 tokens, [DONE]
      local first = json.decode(ev[1])
      assert.equal("chat.completion.chunk", first.object)
      assert.equal("sql-lora", first.model)
      assert.same({ role = "assistant", content = "" }, first.choices[1].delta)
      for i = 2, 4 do
        local c = json.decode(ev[i])
        assert.is_string(c.choices[1].delta.content)
        assert.is_nil(c.usage)
      end
      assert.equal("length", json.decode(ev[4]).choices[1].finish_reason)
      assert.equal("[DONE]", ev[5])
    end)

    it("honours n: n choices with different texts, usage counting each", function()
      local body = { model = MODEL, prompt = ("abcd"):rep(8), max_tokens = 4 }
      local _, one = post(sim.port, "/v1/completions", body)
      body.n = 3
      local status, r = post(sim.port, "/v1/completions", body)
      assert.equal(200, status)
      assert.equal(3, #r.choices)
      for i, c in ipairs(r.choices) do
        assert.equal(i - 1, c.index)
        assert.equal("length", c.finish_reason)
      end
      assert.equal(one.choices[1].text, r.choices[1].text) -- choice 0 is the n = 1 text
      assert.not_equal(r.choices[1].text, r.choices[2].text)
      assert.not_equal(r.choices[2].text, r.choices[3].text)
      assert.equal(12, r.usage.completion_tokens)
      status, r = post(sim.port, "/v1/chat/completions", { model = MODEL, n = 2, max_tokens = 2,
        messages = { { role = "user", content = "hi" } } })
      assert.equal(200, status)
      assert.equal(2, #r.choices)
      assert.equal(1, r.choices[2].index)
      assert.equal("assistant", r.choices[2].message.role)
      for _, bad in ipairs({ 0, 129, "2", 1.5 }) do
        local st, e = post(sim.port, "/v1/completions", { model = MODEL, prompt = "x", n = bad })
        assert.equal(400, st)
        assert.equal("n", e.error.param)
      end
    end)

    it("streams n choices: a chunk per choice per token, each choice's text as unstreamed", function()
      local body = { model = MODEL, prompt = ("abcd"):rep(8), max_tokens = 3, n = 2 }
      local _, whole = post(sim.port, "/v1/completions", body)
      body.stream = true
      local status, text = http(sim.port, "POST", "/v1/completions", body)
      assert.equal(200, status)
      local ev = events(text)
      assert.equal(7, #ev) -- 3 tokens x 2 choices, [DONE]
      local joined, last = { [0] = "", [1] = "" }, {}
      for i = 1, 6 do
        local c = json.decode(ev[i]).choices[1]
        joined[c.index] = joined[c.index] .. c.text
        last[c.index] = c.finish_reason
      end
      assert.equal(whole.choices[1].text, joined[0])
      assert.equal(whole.choices[2].text, joined[1])
      assert.same({ [0] = "length", [1] = "length" }, last)
      -- chat: the role opens each choice
      status, text = http(sim.port, "POST", "/v1/chat/completions", { model = MODEL, stream = true,
        n = 2, max_tokens = 1, messages = { { role = "user", content = "hi" } } })
      assert.equal(200, status)
      ev = events(text)
      assert.equal(5, #ev) -- 2 roles, 2 tokens, [DONE]
      assert.same({ role = "assistant", content = "" }, json.decode(ev[2]).choices[1].delta)
      assert.equal(1, json.decode(ev[2]).choices[1].index)
    end)

    describe("embeddings", function()
      -- the base64 form the OpenAI Python SDK asks for: little-endian float32s
      local ffi = require "ffi"
      local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
      local function floats(b64)
        local bytes = {}
        local bits, n = 0, 0
        for ch in b64:gmatch("[^=]") do
          bits = bits * 64 + (B64:find(ch, 1, true) - 1)
          n = n + 6
          if n >= 8 then
            n = n - 8
            bytes[#bytes + 1] = string.char(math.floor(bits / 2 ^ n) % 256)
            bits = bits % 2 ^ n
          end
        end
        local raw = table.concat(bytes)
        local f = ffi.cast("const float *", raw)
        local out = {}
        for i = 0, #raw / 4 - 1 do
          out[#out + 1] = f[i]
        end
        return out
      end
      local function norm(v)
        local s = 0
        for _, x in ipairs(v) do
          s = s + x * x
        end
        return math.sqrt(s)
      end

      it("answers a vector per input, unit length, the same for the same text", function()
        local status, r, h = post(sim.port, "/v1/embeddings", { model = MODEL,
          input = { "hello", "world", "hello" } })
        assert.equal(200, status)
        assert.equal("list", r.object)
        assert.equal(MODEL, r.model)
        assert.equal(MODEL, h["x-sim-model"])
        assert.equal(3, #r.data)
        for i, d in ipairs(r.data) do
          assert.equal("embedding", d.object)
          assert.equal(i - 1, d.index)
          assert.equal(32, #d.embedding)
          assert.near(1, norm(d.embedding), 1e-5)
        end
        assert.same(r.data[1].embedding, r.data[3].embedding)
        assert.not_same(r.data[1].embedding, r.data[2].embedding)
        assert.equal(r.usage.prompt_tokens, r.usage.total_tokens)
        local _, again = post(sim.port, "/v1/embeddings", { model = MODEL, input = "hello",
          dimensions = 8 })
        assert.equal(8, #again.data[1].embedding)
      end)

      it("answers the OpenAI SDK's call: encoding_format base64, the same vector", function()
        local _, plain = post(sim.port, "/v1/embeddings", { model = "sql-lora", input = "hi there" })
        local status, r = post(sim.port, "/v1/embeddings", { model = "sql-lora", input = "hi there",
          encoding_format = "base64" })
        assert.equal(200, status)
        assert.is_string(r.data[1].embedding)
        local v = floats(r.data[1].embedding)
        assert.equal(32, #v)
        for i = 1, 32 do
          assert.near(plain.data[1].embedding[i], v[i], 1e-6)
        end
      end)

      it("refuses a missing input, a bad encoding_format or dimensions, an unknown model", function()
        local st, e = post(sim.port, "/v1/embeddings", { model = MODEL })
        assert.equal(400, st)
        assert.equal("input", e.error.param)
        st, e = post(sim.port, "/v1/embeddings", { model = MODEL, input = "x", encoding_format = "int8" })
        assert.equal(400, st)
        assert.equal("encoding_format", e.error.param)
        st, e = post(sim.port, "/v1/embeddings", { model = MODEL, input = "x", dimensions = 0 })
        assert.equal(400, st)
        assert.equal("dimensions", e.error.param)
        st, e = post(sim.port, "/v1/embeddings", { model = "nope", input = "x" })
        assert.equal(404, st)
        assert.equal("model_not_found", e.error.code)
      end)
    end)

    it("answers the other vLLM routes minimally, in their response shapes", function()
      local st, r = post(sim.port, "/tokenize", { prompt = "abcdefgh" })
      assert.equal(200, st)
      assert.equal(2, r.count)
      assert.equal(2, #r.tokens)
      st, r = post(sim.port, "/detokenize", { tokens = { 1, 2 } })
      assert.equal(200, st)
      assert.is_string(r.prompt)
      st, r = post(sim.port, "/pooling", { input = "x" })
      assert.equal(200, st)
      assert.equal("pooling", r.data[1].object)
      assert.equal(MODEL, r.model) -- vLLM's default: the model served
      st, r = post(sim.port, "/classify", { input = { "a", "b" } })
      assert.equal(200, st)
      assert.equal(2, #r.data)
      assert.equal(2, r.data[1].num_classes)
      for _, path in ipairs({ "/score", "/v1/score" }) do
        st, r = post(sim.port, path, { text_1 = "q", text_2 = { "a", "b" } })
        assert.equal(200, st)
        assert.equal("score", r.data[2].object)
      end
      for _, path in ipairs({ "/rerank", "/v1/rerank", "/v2/rerank" }) do
        st, r = post(sim.port, path, { query = "q", documents = { "a", "b", "c" }, top_n = 2 })
        assert.equal(200, st)
        assert.equal(2, #r.results)
        assert.is_true(r.results[1].relevance_score >= r.results[2].relevance_score)
      end
      st, r = post(sim.port, "/v1/responses", { model = MODEL, input = "hi" })
      assert.equal(200, st)
      assert.equal("response", r.object)
      assert.equal("output_text", r.output[1].content[1].type)
      st, r = post(sim.port, "/v1/messages", { model = MODEL, max_tokens = 5,
        messages = { { role = "user", content = "hi" } } })
      assert.equal(200, st)
      assert.equal("message", r.type)
      assert.equal("text", r.content[1].type)
      st, r = post(sim.port, "/v1/messages", { model = MODEL, stream = true, max_tokens = 5,
        messages = { { role = "user", content = "hi" } } })
      assert.equal(400, st) -- not streamed by the simulator
      assert.equal("stream", r.error.param)
      local f = os.tmpname()
      S.write(f, "RIFF....WAVE")
      local out = sh(("%s -s -D - -F model=%s -F 'file=@%s;type=audio/wav' "
        .. "http://127.0.0.1:%d/v1/audio/transcriptions"):format(CURL, "sql-lora", f, sim.port))
      os.remove(f)
      assert.matches("x-sim-model: sql-lora", out, 1, true)
      assert.matches('"text":', out, 1, true)
    end)

    it("lists the base model and its adapters", function()
      local status, text = http(sim.port, "GET", "/v1/models")
      assert.equal(200, status)
      local r = json.decode(text)
      assert.equal("list", r.object)
      assert.equal(3, #r.data)
      assert.equal(MODEL, r.data[1].id)
      assert.equal("model", r.data[1].object)
      assert.equal("sql-lora", r.data[2].id)
      assert.equal(MODEL, r.data[2].parent)
      assert.equal("chat-lora", r.data[3].id)
    end)

    it("serves the vLLM metric names and counts requests per endpoint", function()
      local before = metrics(sim.port + 1)
      for _ = 1, 2 do
        assert.equal(200, (post(sim.port + 1, "/v1/completions", { model = MODEL, prompt = "hi" })))
      end
      local m, text = metrics(sim.port + 1)
      for _, name in ipairs({ "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info", "vllm:cache_config_info",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count" }) do
        assert.is_number(m[name], name)
      end
      assert.matches("# TYPE vllm:num_requests_waiting gauge\n", text, 1, true)
      assert.matches("# TYPE vllm:prefix_cache_hits_total counter\n", text, 1, true)
      assert.matches('vllm:num_requests_running{engine="0",model_name="' .. MODEL .. '"} 0.0\n', text, 1, true)
      assert.matches('vllm:cache_config_info{block_size="16",[^}]*num_gpu_blocks="256"} 1.0\n', text)
      local key = 'lupin_sim_requests_total{endpoint="127.0.0.1:' .. (sim.port + 1) .. '"}'
      assert.equal(before[key] + 2, m[key])
      assert.equal(2, m["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"])
      -- --instant releases all tokens at once: every inter-token interval is 0
      assert.is_true(m["vllm:inter_token_latency_seconds_count"] > 0)
      assert.equal(0, m["vllm:inter_token_latency_seconds_sum"])
    end)

    it("reuses a keep-alive connection for consecutive requests", function()
      local url = "http://127.0.0.1:" .. sim.port .. "/v1/models"
      local out = sh((CURL .. " -s -o /dev/null -o /dev/null -w '%%{num_connects} ' %s %s"):format(url, url))
      assert.equal("1 0 ", out)
    end)

    --- Raw bytes over one TCP connection (bash's /dev/tcp); returns all the server sent until it closed.
    local function raw(port, bytes)
      local f = os.tmpname()
      S.write(f, bytes)
      local out = sh(("bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d; cat %s >&3; timeout 10 cat <&3'"):format(port, f))
      os.remove(f)
      return out
    end

    it("answers pipelined requests in order on one connection and honours Connection: close", function()
      local body = json.encode({ model = MODEL, prompt = "hi", max_tokens = 2 })
      local post1 = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-request-id: one\r\nContent-Length: %d\r\n\r\n%s")
        :format(#body, body)
      local out = raw(sim.port, post1 .. "GET /health HTTP/1.1\r\nHost: x\r\nx-request-id: two\r\n\r\n"
        .. "GET /v1/models HTTP/1.1\r\nHost: x\r\nx-request-id: three\r\nConnection: close\r\n\r\n")
      local ids = {}
      for id in out:gmatch("x%-request%-id: (%w+)") do
        ids[#ids + 1] = id
      end
      assert.same({ "one", "two", "three" }, ids)
      assert.matches('"object":"text_completion"', out, 1, true)
      assert.matches("connection: close\r\n\r\n{\"object\":\"list\"", out, 1, true)
    end)

    it("answers Expect: 100-continue so a client sends its body without waiting", function()
      local f = os.tmpname()
      S.write(f, json.encode({ model = MODEL, prompt = "E" .. LONG, max_tokens = 1 })) -- its own prefix
      -- without the 100 the client would hold the body back past --max-time
      local out = sh(("%s -s -o /dev/null -w '%%{http_code}' -H 'Expect: 100-continue' --expect100-timeout 60"
        .. " --max-time 10 --data-binary @%s http://127.0.0.1:%d/v1/completions"):format(CURL, f, sim.port))
      os.remove(f)
      assert.equal("200", out)
    end)

    it("answers malformed HTTP with 400 and closes", function()
      local out = raw(sim.port, "BLAH /x\r\n\r\n")
      assert.matches("^HTTP/1.1 400 Bad Request\r\n", out)
      assert.matches("Malformed HTTP request: ", out, 1, true)
      assert.matches("connection: close", out, 1, true)
    end)

    it("reports a repeated long prompt's cached tokens and counts the hits in tokens", function()
      local p = sim.port + 1
      local before = metrics(p)
      local body = { model = MODEL, prompt = LONG, max_tokens = 2 }
      local _, first = post(p, "/v1/completions", body)
      assert.equal(507, first.usage.prompt_tokens)
      assert.equal(0, first.usage.prompt_tokens_details.cached_tokens)
      local _, second = post(p, "/v1/completions", body)
      assert.equal(496, second.usage.prompt_tokens_details.cached_tokens) -- 31 full blocks of 16
      local m = metrics(p)
      assert.equal(496, m["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"])
      assert.equal(1014, m["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"])
      -- another adapter does not share the base model's blocks
      local _, other = post(p, "/v1/completions", { model = "chat-lora", prompt = LONG, max_tokens = 2 })
      assert.equal(0, other.usage.prompt_tokens_details.cached_tokens)
      -- nor does another endpoint
      local _, elsewhere = post(sim.port, "/v1/completions", body)
      assert.equal(0, elsewhere.usage.prompt_tokens_details.cached_tokens)
    end)

    -- vLLM takes token ids for a prompt; a token a id, cached like text
    it("serves a prompt of token ids or of lists of them, a token an id, its blocks cached", function()
      local ids, first, second = {}, {}, {}
      for i = 1, 40 do
        ids[i] = 1000 + i
        table.insert(i <= 25 and first or second, 1000 + i)
      end
      local p = sim.port + 1
      local _, r = post(p, "/v1/completions", { model = MODEL, prompt = ids, max_tokens = 1 })
      assert.equal(40, r.usage.prompt_tokens)
      assert.equal(0, r.usage.prompt_tokens_details.cached_tokens)
      -- the same ids in two lists: one prompt, the same two full blocks of 16
      _, r = post(p, "/v1/completions", { model = MODEL, prompt = { first, second }, max_tokens = 1 })
      assert.equal(40, r.usage.prompt_tokens)
      assert.equal(32, r.usage.prompt_tokens_details.cached_tokens)
      ids[1] = 7 -- another first token: nothing in common
      _, r = post(p, "/v1/completions", { model = MODEL, prompt = ids, max_tokens = 1 })
      assert.equal(0, r.usage.prompt_tokens_details.cached_tokens)
    end)

    describe("errors, in the OpenAI shape", function()
      local function expect(status, message, path, body, param, code)
        local st, r, h = post(sim.port, path or "/v1/completions", body)
        assert.equal(status, st)
        assert.is_table(r, "not JSON: " .. tostring(r))
        assert.matches(message, r.error.message, 1, true)
        assert.is_string(r.error.type)
        assert.equal(param or json.null, r.error.param)
        assert.equal(code or json.null, r.error.code)
        return r, h
      end

      it("400 for invalid JSON, naming the position", function()
        expect(400, "Invalid JSON in request body: ", nil, '{"model": ')
        expect(400, "(line 1, column 2)", nil, "{x}")
      end)

      it("400 for a body that is not an object", function()
        expect(400, "The request body must be a JSON object, got an array", nil, "[1]")
      end)

      it("400 for a missing model, prompt or messages", function()
        expect(400, "Missing required parameter 'model'", nil, { prompt = "x" }, "model")
        expect(400, "Missing required parameter 'prompt'", nil, { model = MODEL }, "prompt")
        expect(400, "Missing required parameter 'messages'", "/v1/chat/completions", { model = MODEL }, "messages")
      end)

      it("404 for an unknown model, listing what is served", function()
        local r = expect(404, "The model 'gpt-9' does not exist: this endpoint serves '" .. MODEL
          .. "', 'sql-lora', 'chat-lora'", nil, { model = "gpt-9", prompt = "x" }, "model", "model_not_found")
        assert.equal("invalid_request_error", r.error.type)
      end)

      it("400 for wrong types and bounds", function()
        expect(400, "'model' must be a string, got an integer", nil, { model = 3, prompt = "x" }, "model")
        expect(400, "'max_tokens' must be an integer, got a string", nil,
          { model = MODEL, prompt = "x", max_tokens = "5" }, "max_tokens")
        expect(400, "'max_tokens' must be at least 1, got 0", nil, { model = MODEL, prompt = "x", max_tokens = 0 },
          "max_tokens")
        expect(400, "'stream' must be a boolean, got a string", nil, { model = MODEL, prompt = "x", stream = "yes" },
          "stream")
        local shapes = "'prompt' must be a string, or a non-empty array of strings, of token ids or"
          .. " of non-empty arrays of token ids"
        expect(400, shapes .. ", got an integer", nil, { model = MODEL, prompt = 5 }, "prompt")
        expect(400, shapes .. ", got an array", nil, '{"model":"' .. MODEL .. '","prompt":[]}', "prompt")
        expect(400, shapes .. ": prompt[1] is a string, prompt[0] an array", nil,
          { model = MODEL, prompt = { { 1 }, "x" } }, "prompt")
        expect(400, shapes .. ": prompt[1] is an empty array, prompt[0] an array", nil,
          '{"model":"' .. MODEL .. '","prompt":[[1],[]]}', "prompt")
        expect(400, "'prompt' must be a list of token ids (integers), got a number", nil,
          { model = MODEL, prompt = { 1, 2.5 } }, "prompt")
        expect(400, "token id -1 in 'prompt' is out of range: ids are 0 to 4294967295", nil,
          { model = MODEL, prompt = { -1 } }, "prompt")
        expect(400, "'messages' must be a non-empty array of messages, got a string", "/v1/chat/completions",
          { model = MODEL, messages = "hi" }, "messages")
        expect(400, "messages[0] must be an object with a string 'role'", "/v1/chat/completions",
          { model = MODEL, messages = { { content = "hi" } } }, "messages")
        expect(400, "'stream_options' can only be set when 'stream' is true", nil,
          { model = MODEL, prompt = "x", stream_options = { include_usage = true } }, "stream_options")
      end)

      it("400 when prompt and output exceed the context length", function()
        expect(400, "This model's maximum context length is 32768 tokens. However, you requested 33007 tokens "
          .. "(507 in the prompt, 32500 in the completion)", nil, { model = MODEL, prompt = LONG, max_tokens = 32500 },
          "prompt")
      end)

      it("404 for an unknown route and 405 with Allow for a wrong method", function()
        local st, text = http(sim.port, "GET", "/v2/nothing?x=1")
        assert.equal(404, st)
        assert.matches("Unknown route GET /v2/nothing: this server serves POST /v1/completions",
          json.decode(text).error.message, 1, true)
        local h
        st, text, h = http(sim.port, "GET", "/v1/chat/completions")
        assert.equal(405, st)
        assert.equal("Method GET is not allowed on /v1/chat/completions: use POST", json.decode(text).error.message)
        assert.equal("POST", h["allow"])
        st = http(sim.port, "DELETE", "/metrics")
        assert.equal(405, st)
      end)

      it("keeps serving after every error", function()
        assert.equal(200, (post(sim.port, "/v1/completions", { model = MODEL, prompt = "still here" })))
      end)
    end)
  end)

  it("evicts least recently used blocks, a prompt's end before its start", function()
    local sim = start("--instant --num-gpu-blocks 64")
    local function cached(prefix)
      local _, r = post(sim.port, "/v1/completions", { model = MODEL, prompt = prefix .. LONG, max_tokens = 1 })
      return r.usage.prompt_tokens_details.cached_tokens
    end
    -- each prompt: 31 hashed blocks and a partial one; 64 blocks hold two prompts
    assert.equal(0, cached("Z"))
    assert.equal(0, cached("Y"))
    assert.equal(0, cached("X")) -- takes 29 of Z's blocks, its last ones first
    assert.equal(16, cached("Z")) -- Z's first block survived
    assert.equal(0, sim.stop())
  end)

  it("413 for a body over --max-body-bytes", function()
    local sim = start("--instant --max-body-bytes 100")
    local st, r = post(sim.port, "/v1/completions", { model = MODEL, prompt = ("x"):rep(200) })
    assert.equal(413, st)
    assert.matches("Request body too large: the limit is 100 bytes", r.error.message, 1, true)
    assert.equal(0, sim.stop())
  end)

  it("shows the queue, the running batch and KV usage while requests are in flight", function()
    local sim = start("--max-num-seqs 1 --itl-ms 200 --num-gpu-blocks 100")
    for _ = 1, 3 do
      post_later(sim.port, "/v1/completions", { model = MODEL, prompt = LONG, max_tokens = 100 })
    end
    local m = eventually(function()
      local m = metrics(sim.port)
      return m["vllm:num_requests_running"] == 1 and m["vllm:num_requests_waiting"] == 2 and m
    end)
    assert.is_table(m, "never saw 1 running and 2 waiting")
    assert.is_true(m["vllm:kv_cache_usage_perc"] >= 0.32) -- 507 tokens: 32 of 100 blocks
    assert.equal(m["vllm:kv_cache_usage_perc"], m["vllm:gpu_cache_usage_perc"])
    assert.equal(0, sim.stop()) -- in-flight requests do not keep it from exiting
  end)

  it("takes a request whose client hung up out of the batch and frees its blocks", function()
    local sim = start("--itl-ms 100 --max-num-seqs 1")
    local f = os.tmpname()
    S.write(f, json.encode({ model = MODEL, prompt = LONG, max_tokens = 1000, stream = true }))
    -- this client gives up after a second, mid-stream
    os.execute(("(%s -s -N -o /dev/null --max-time 1 --data-binary @%s http://127.0.0.1:%d/v1/completions;"
      .. " rm -f %s) >/dev/null 2>&1 &"):format(CURL, f, sim.port, f))
    assert.truthy(eventually(function() return metrics(sim.port)["vllm:num_requests_running"] == 1 end))
    assert.truthy(eventually(function()
      local m = metrics(sim.port)
      return m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0
    end, 200))
    assert.equal(0, metrics(sim.port)["vllm:request_success_total"])
    assert.equal(0, sim.stop())
  end)

  it("queues prefills behind each other with --prefill-serial", function()
    local sim = start("--prefill-serial --prefill-overhead-ms 1000 --itl-ms 0")
    -- one shell starts the three clients together, so they arrive within a few ms
    local f = os.tmpname()
    S.write(f, json.encode({ model = MODEL, prompt = "p", max_tokens = 2 }))
    local one = ("%s -s -o /dev/null --max-time 30 --data-binary @%s http://127.0.0.1:%d/v1/completions &")
      :format(CURL, f, sim.port)
    os.execute("(" .. one:rep(3, " ") .. " wait; rm -f " .. f .. ") >/dev/null 2>&1 &")
    local m = eventually(function()
      local m = metrics(sim.port)
      return m["vllm:request_success_total"] == 3 and m
    end, 200)
    assert.is_table(m, "the three requests did not finish")
    -- 1 s each, one after another: TTFTs of about 1, 2 and 3 s, so at most two
    -- under 2.5 s (arrivals would have to be a second apart to spoil it)
    local labels = '{engine="0",model_name="' .. MODEL .. '",le="2.5"}'
    assert.is_true(m["vllm:time_to_first_token_seconds_bucket" .. labels] <= 2)
    assert.equal(0, sim.stop())
  end)

  it("reports running and waiting LoRA adapters under --max-loras", function()
    local sim = start("--lora a,b --max-loras 1 --itl-ms 200")
    local _, idle = metrics(sim.port)
    assert.matches('vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} ', idle,
      1, true)
    post_later(sim.port, "/v1/completions", { model = "a", prompt = "x", max_tokens = 100 })
    eventually(function() return metrics(sim.port)["vllm:num_requests_running"] == 1 end)
    post_later(sim.port, "/v1/completions", { model = "b", prompt = "y", max_tokens = 100 })
    post_later(sim.port, "/v1/completions", { model = MODEL, prompt = "z", max_tokens = 100 })
    local text = eventually(function()
      local m, page = metrics(sim.port)
      return m["vllm:num_requests_running"] == 2 and m["vllm:num_requests_waiting"] == 1 and page
    end)
    assert.is_string(text, "never saw the base-model request pass the adapter that waits")
    local ts = text:match('vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",'
      .. 'waiting_lora_adapters="b"} (%S+)')
    assert.is_true(tonumber(ts) > 1.6e9)
    -- earlier label sets stay exported, as with vLLM's labelled gauge; the current one is the latest
    local series = {}
    for labels, v in text:gmatch("vllm:lora_requests_info{([^}]*)} (%S+)") do
      series[#series + 1] = { labels = labels, v = tonumber(v) }
    end
    assert.is_true(#series >= 2)
    table.sort(series, function(x, y) return x.v > y.v end)
    assert.matches('running_lora_adapters="a",waiting_lora_adapters="b"', series[1].labels, 1, true)
    assert.matches('running_lora_adapters="",waiting_lora_adapters=""', series[#series].labels, 1, true)
    assert.equal(0, sim.stop())
  end)

  it("answers 500 on every request with --error-rate 1 and counts them", function()
    local sim = start("--instant --error-rate 1")
    local st, r = post(sim.port, "/v1/completions", { model = MODEL, prompt = "x" })
    assert.equal(500, st)
    assert.equal("server_error", r.error.type)
    assert.matches("Injected failure: endpoint 127.0.0.1:" .. sim.port .. " answers 500", r.error.message, 1, true)
    assert.equal(200, (http(sim.port, "GET", "/v1/models")))
    assert.equal(1, metrics(sim.port)['lupin_sim_injected_failures_total{endpoint="127.0.0.1:' .. sim.port
      .. '",kind="error"}'])
    assert.equal(0, sim.stop())
  end)

  it("drops the connection mid-stream with --drop-rate 1", function()
    local sim = start("--itl-ms 1 --drop-rate 1")
    local st, text, _, rc = http(sim.port, "POST", "/v1/completions", { model = MODEL, prompt = "x", max_tokens = 8,
      stream = true })
    assert.equal(200, st)
    assert.equal(18, rc) -- curl: transfer closed with outstanding read data
    local ev = events(text)
    assert.equal(4, #ev) -- half the tokens, then nothing
    assert.is_nil(text:find("[DONE]", 1, true))
    local _, _, _, rc2 = http(sim.port, "POST", "/v1/completions", { model = MODEL, prompt = "x" })
    assert.equal(52, rc2) -- curl: empty reply from server
    assert.equal(2, metrics(sim.port)['lupin_sim_injected_failures_total{endpoint="127.0.0.1:' .. sim.port
      .. '",kind="drop"}'])
    assert.equal(0, sim.stop())
  end)

  it("runs --slow-endpoints --slow-factor times slower", function()
    -- large enough that a loaded machine's timer delays cannot close the gap
    local sim = start("--itl-ms 20 --prefill-overhead-ms 2 --slow-endpoints 1 --slow-factor 25", 2)
    for i = 0, 1 do
      assert.equal(200, (post(sim.port + i, "/v1/completions", { model = MODEL, prompt = "x", max_tokens = 3 })))
    end
    local fast, slow = metrics(sim.port), metrics(sim.port + 1)
    assert.is_true(slow["vllm:inter_token_latency_seconds_sum"] > 4 * fast["vllm:inter_token_latency_seconds_sum"])
    assert.equal(0, sim.stop())
  end)

  --- The mean of a histogram's observations since `before` (a metrics() table).
  local function mean_since(m, before, name)
    local n = m[name .. "_count"] - (before and before[name .. "_count"] or 0)
    return (m[name .. "_sum"] - (before and before[name .. "_sum"] or 0)) / n, n
  end

  it("makes a decode step longer per running request with --itl-ms-per-seq", function()
    -- a step is 1 + 30 x running ms: 31 alone, 121 with four. The prefill's
    -- overhead lets all four arrive before the first of them schedules a step.
    local sim = start("--itl-ms 1 --itl-ms-per-seq 30 --prefill-overhead-ms 300")
    local body = { model = MODEL, prompt = "alone", max_tokens = 8, stream = true }
    assert.equal(200, (http(sim.port, "POST", "/v1/completions", body)))
    local alone = metrics(sim.port)
    local one, n1 = mean_since(alone, nil, "vllm:inter_token_latency_seconds")
    assert.equal(7, n1)
    local f = os.tmpname()
    S.write(f, json.encode({ model = MODEL, prompt = "four", max_tokens = 8, stream = true }))
    local curl = ("%s -s -N -o /dev/null --max-time 30 --data-binary @%s http://127.0.0.1:%d/v1/completions &")
      :format(CURL, f, sim.port)
    os.execute("(" .. curl:rep(4, " ") .. " wait; rm -f " .. f .. ") >/dev/null 2>&1 &")
    local m = eventually(function()
      local m = metrics(sim.port)
      return m["vllm:request_success_total"] == 5 and m
    end, 200)
    assert.is_table(m, "the four requests did not finish")
    local four, n4 = mean_since(m, alone, "vllm:inter_token_latency_seconds")
    assert.equal(28, n4)
    -- about 3.9 times; timer delays on a loaded machine only close part of the gap
    assert.is_true(four >= 2 * one, ("mean step %.3f s with four running, %.3f s alone"):format(four, one))
    assert.equal(0, sim.stop())
  end)

  it("changes an endpoint's speed at run time with POST /sim/speed, kept by /sim/reset", function()
    -- 200 uncached prompt tokens at 1 ms each: a 200 ms prefill, 1 s at factor 5
    local sim = start("--prefill-overhead-ms 0 --prefill-ms-per-token 1 --itl-ms 0 --slow-endpoints 1"
      .. " --slow-factor 7", 2)
    local function get_speed(port)
      local st, text = http(port, "GET", "/sim/speed")
      assert.equal(200, st)
      return json.decode(text)
    end
    assert.same({ endpoint = "127.0.0.1:" .. sim.port, factor = 1 }, get_speed(sim.port))
    assert.same({ endpoint = "127.0.0.1:" .. (sim.port + 1), factor = 7 }, get_speed(sim.port + 1))
    local function ttft(prompt)
      local before = metrics(sim.port)
      local st, r = post(sim.port, "/v1/completions", { model = MODEL, prompt = prompt, max_tokens = 2 })
      assert.equal(200, st)
      assert.equal(200, r.usage.prompt_tokens)
      assert.equal(0, r.usage.prompt_tokens_details.cached_tokens)
      return (mean_since(metrics(sim.port), before, "vllm:time_to_first_token_seconds"))
    end
    local normal = ttft(("a"):rep(800))
    local st, r = post(sim.port, "/sim/speed?factor=5")
    assert.equal(200, st)
    assert.same({ endpoint = "127.0.0.1:" .. sim.port, factor = 5 }, r)
    assert.equal(5, get_speed(sim.port).factor)
    assert.equal(7, get_speed(sim.port + 1).factor) -- one endpoint's speed only
    assert.equal(5, metrics(sim.port)['lupin_sim_speed_factor{endpoint="127.0.0.1:' .. sim.port .. '"}'])
    assert.equal(7, metrics(sim.port + 1)['lupin_sim_speed_factor{endpoint="127.0.0.1:' .. (sim.port + 1) .. '"}'])
    local slow = ttft(("b"):rep(800))
    assert.is_true(slow >= 2 * normal, ("TTFT %.3f s at factor 5, %.3f s at 1"):format(slow, normal))
    -- a reset, or a restart, is the cache's: the speed stays
    assert.equal(200, (post(sim.port, "/sim/reset")))
    assert.equal(200, (post(sim.port, "/sim/reset?restart=1")))
    assert.equal(5, get_speed(sim.port).factor)
    -- a fraction and the largest factor are taken; --slow-factor's is replaced
    assert.equal(0.5, select(2, post(sim.port, "/sim/speed?factor=0.5")).factor)
    assert.equal(1000, select(2, post(sim.port + 1, "/sim/speed?factor=1000")).factor)
    assert.equal(1000, get_speed(sim.port + 1).factor)
    assert.equal(0, sim.stop())
  end)

  it("refuses a bad /sim/speed factor with a 400 naming it, and other methods with 405", function()
    local sim = start("--instant")
    local range = "'factor' must be a number greater than 0 and at most 1000, got "
    for query, message in pairs({
      [""] = "Missing required parameter 'factor': a number greater than 0 and at most 1000",
      ["?other=2"] = "Missing required parameter 'factor'",
      ["?factor=0"] = range .. "'0'",
      ["?factor=-1"] = range .. "'-1'",
      ["?factor=nan"] = range .. "'nan'",
      ["?factor=inf"] = range .. "'inf'",
      ["?factor=1001"] = range .. "'1001'",
      ["?factor=fast"] = range .. "'fast'",
      ["?factor=5x"] = range .. "'5x'",
      ["?factor="] = range .. "''",
      ["?factor=" .. ("9"):rep(80)] = range .. "'" .. ("9"):rep(63) .. "...'",
    }) do
      local st, r = post(sim.port, "/sim/speed" .. query)
      assert.equal(400, st, query)
      assert.is_table(r, "not JSON: " .. tostring(r))
      assert.equal("invalid_request_error", r.error.type)
      assert.equal("factor", r.error.param)
      assert.matches(message, r.error.message, 1, true)
    end
    local st, text = http(sim.port, "GET", "/sim/speed")
    assert.equal(200, st)
    assert.equal(1, json.decode(text).factor) -- nothing above changed it
    local h
    st, text, h = http(sim.port, "DELETE", "/sim/speed")
    assert.equal(405, st)
    assert.equal("GET, POST", h["allow"])
    assert.equal("Method DELETE is not allowed on /sim/speed: use GET, POST", json.decode(text).error.message)
    local st2, _, h2 = http(sim.port, "GET", "/sim/oracle")
    assert.equal(405, st2)
    assert.equal("POST", h2["allow"])
    assert.equal(0, sim.stop())
  end)

  it("is deterministic under a seed: the same text and the same injected failures", function()
    local function run(seed)
      local sim = start("--instant --error-rate 0.5 --seed " .. seed)
      local statuses, texts = {}, {}
      for i = 1, 8 do
        local st, r = post(sim.port, "/v1/completions", { model = MODEL, prompt = "prompt " .. i, max_tokens = 6 })
        statuses[i] = st
        texts[i] = st == 200 and r.choices[1].text or ""
      end
      assert.equal(0, sim.stop())
      return table.concat(statuses, ","), table.concat(texts, "|")
    end
    local s1, t1 = run(42)
    local s2, t2 = run(42)
    local s3, t3 = run(43)
    assert.equal(s1, s2)
    assert.equal(t1, t2)
    assert.is_truthy(s1:find("500") and s1:find("200"), s1)
    assert.is_true(s1 ~= s3 or t1 ~= t3)
  end)

  it("refuses a port in use with a clear message and exit 1", function()
    local sim = start("--instant")
    local out = sh(("%s --port %d --endpoints 1 2>&1; echo rc=$?"):format(BIN, sim.port))
    assert.matches("endpoint 0: cannot listen on 127.0.0.1:" .. sim.port .. ": address already in use", out, 1, true)
    assert.matches("rc=1", out, 1, true)
    assert.equal(0, sim.stop())
  end)
end)
