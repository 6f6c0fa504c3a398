-- Hostile HTTP framing against the real `lupin serve` (docs/bad-input.md):
-- request smuggling shapes and malformed framing are refused with a 400 in
-- the OpenAI error shape, the connection is closed, and the gateway keeps
-- serving.  Raw bytes go over a socket, as a client that means harm sends them.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local COMPLETION = { model = "m", prompt = "hello there", max_tokens = 5 }
local BODY = '{"model":"m","prompt":"hi","max_tokens":2}'

local dir = support.tmpdir()
local seq = 0

-- Writes bytes (any, NUL included) to the gateway and returns all it answers
-- until it closes the connection.
local function raw(gw, bytes)
  seq = seq + 1
  local path = ("%s/raw-%d"):format(dir, seq)
  support.write(path, bytes)
  local port = gw.base:match(":(%d+)$")
  return P.run(("bash -c 'exec 3<>/dev/tcp/127.0.0.1/%s; cat %s >&3; timeout 5 cat <&3'"):format(
    port, path))
end

local function post(headers, body)
  return "POST /v1/completions HTTP/1.1\r\nhost: x\r\n" .. headers .. "\r\n" .. (body or "")
end

local CASES = {
  { "Content-Length and Transfer-Encoding together (CL.TE)",
    post("content-length: 4\r\ntransfer-encoding: chunked\r\n", "0\r\n\r\n"),
    "unexpected content%-length header" },
  { "Transfer-Encoding with a space before the colon next to Content-Length",
    post("transfer-encoding : chunked\r\ncontent-length: " .. #BODY .. "\r\n", BODY),
    "whitespace in a header field name" },
  { "two Content-Length headers",
    post("content-length: 2\r\ncontent-length: 30\r\n", "{}"),
    "unexpected content%-length header" },
  { "a negative Content-Length", post("content-length: -1\r\n"),
    "invalid character in content%-length header" },
  { "a chunk size that is not hex",
    post("transfer-encoding: chunked\r\n", "zz\r\n{}\r\n0\r\n\r\n"),
    "invalid character in chunk size header" },
  { "a chunk size past 64 bits",
    post("transfer-encoding: chunked\r\n", "ffffffffffffffffff\r\n{}\r\n0\r\n\r\n"),
    "malformed HTTP request" },
  { "a Transfer-Encoding other than chunked",
    post("transfer-encoding: gzip\r\n", BODY), "invalid transfer%-encoding" },
  { "a NUL in a header value", "GET /v1/models HTTP/1.1\r\nhost: x\r\nx-a: a\0b\r\n\r\n",
    "invalid character in header" },
  { "a request line with a word too many", "GET / HTTP/1.1 extra\r\n\r\n",
    "invalid HTTP version" },
  { "a method that does not exist", "BREW /v1/models HTTP/1.1\r\n\r\n",
    "malformed HTTP request" },
}

describe("lupin serve, hostile HTTP framing", function()
  local sim, gw

  setup(function()
    sim = P.sim("--model m --itl-ms 1 --seed 7", 1)
    gw = P.gateway({
      kind = "EndpointPickerConfig",
      plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
      endpoints = { { name = "e1", address = "127.0.0.1", port = sim.ports[1] } },
      gateway = { maxBodyBytes = 4096, maxHeaderBytes = 2048 },
    })
  end)

  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  for _, case in ipairs(CASES) do
    it(("400 and a closed connection for %s"):format(case[1]), function()
      local out = raw(gw, case[2])
      local head, body = out:match("^(.-\r\n)\r\n(.*)$")
      assert.truthy(head, out)
      assert.truthy(head:match("^HTTP/1.1 400 "), out)
      assert.truthy(head:lower():match("connection: close\r\n"), out)
      assert.truthy(head:lower():match("content%-type: application/json\r\n"), out)
      -- one answer only: nothing the smuggled bytes asked for follows it
      assert.falsy(body:find("HTTP/1.1", 1, true), out)
      local e = json.decode(body).error
      assert.truthy(e.message:match(case[3]), e.message)
      assert.equal("invalid_request_error", e.type)
      local status, _, answer = P.post(gw.base, "/v1/completions", COMPLETION)
      assert.equal(200, status, answer)
    end)
  end
end)
