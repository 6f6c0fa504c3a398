-- requestHandler.parsers (lua/lupin/runtime/parsers.lua, the config's
-- build_parsers): which parser reads a request, by its path, as
-- llm-d-router's loader and registry choose; the defaults, the older
-- top-level parser, and each error and warning at its file, line and field.
local S = require "support"
local K = require "plugins.kit"

-- The config: text after the profile (line 8 on), more plugins before it.
local function load(text, plugins)
  local rt = S.runtime()
  local ok, err = rt:load_string("plugins:\n- type: spec-request-probe\n- type: max-score-picker\n"
    .. (plugins or "") .. "schedulingProfiles:\n- name: d\n  plugins:\n"
    .. "  - pluginRef: max-score-picker\n" .. (text or ""), "cfg.yaml")
  return rt, ok, err
end

local function loaded(text, plugins)
  local rt, ok, err = load(text, plugins)
  assert(ok, err)
  S.endpoints(rt, 1)
  return rt
end

local function fails(text, ...)
  local rt, ok, err = load(text)
  rt:free()
  assert.is_nil(ok, "the config loaded")
  for _, want in ipairs({ ... }) do
    assert.matches(want, err, 1, true)
  end
end

local function warnings(rt)
  local out = {}
  for _, l in ipairs(rt:logs()) do
    out[#out + 1] = l[2]
  end
  return table.concat(out, "\n")
end

local n = 0
-- One request with body checks, as lupin serve sends it: the status, the
-- message, and what the probe saw (nil when no plugin ran).
local function send(rt, path, body, headers)
  n = n + 1
  local id = "r" .. n
  local req = assert(rt:begin({ id = id, path = path, body = body, headers = headers,
    check_body = true }))
  local res = req:schedule()
  req:finish("ok")
  return res.status, res.message, K.instance(rt, "spec-request-probe", "self.seen")[id]
end

local CHAT = '{"model":"m","messages":[{"role":"user","content":"hi"}]}'
local MESSAGES = '{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}'

describe("requestHandler.parsers", function()
  it("defaults to openai, anthropic, vllmhttp, then passthrough for any other path", function()
    local rt = loaded()
    assert.equal("openai-parser (openai-parser), anthropic-parser (anthropic-parser),"
      .. " vllmhttp-parser (vllmhttp-parser), passthrough-parser (passthrough-parser)",
      S.eval(rt, "return require('lupin.runtime').current.parsers.names"))
    -- each claimed path checked by its parser's row
    assert.equal(400, (send(rt, "/v1/chat/completions", '{"model":"m"}')))
    assert.equal(200, (send(rt, "/v1/chat/completions", CHAT)))
    local status, msg = send(rt, "/v1/messages", CHAT)
    assert.equal(400, status)
    assert.matches('missing "max_tokens"', msg, 1, true)
    assert.equal(200, (send(rt, "/v1/messages", MESSAGES)))
    status, msg = send(rt, "/inference/v1/generate", '{"model":"m"}')
    assert.equal(400, status)
    assert.matches('missing "token_ids"', msg, 1, true)
    local _, seen
    status, _, seen = send(rt, "/inference/v1/generate", '{"token_ids":[5,6]}')
    assert.equal(200, status)
    assert.equal("5 6", seen.prompt)
    assert.equal(400, (send(rt, "/tokenize", "{}")))
    -- the token count is forwarded as sent (upstream's anthropic parser)
    assert.equal(200, (send(rt, "/v1/messages/count_tokens", "not json")))
    -- a path no parser claims: the fallback reads no body
    status, _, seen = send(rt, "/v1/custom/thing", "not json",
      { ["x-gateway-model-name"] = "hm" })
    assert.equal(200, status)
    assert.same({ model = "hm", prompt = "", stream = false, body_model = false, body = false },
      seen)
    rt:free()
  end)

  it("every claim of a parser type has its row in the route table", function()
    local parsers = require "lupin.runtime.parsers"
    local reg = parsers.registry({ { name = "o", type = "openai-parser" },
      { name = "a", type = "anthropic-parser" }, { name = "v", type = "vllmhttp-parser" } },
      error)
    assert.equal(#parsers.CLAIMS["openai-parser"] + #parsers.CLAIMS["anthropic-parser"]
      + #parsers.CLAIMS["vllmhttp-parser"], #reg.claims)
    for _, c in ipairs(reg.claims) do
      assert.is_table(c.hit.row, c.suffix)
    end
    -- and every route lupin serves is claimed by one of them
    for path, hit in pairs(reg.by_path) do
      assert.truthy(hit, path)
    end
    assert.same({ "anthropic-parser", "openai-parser", "passthrough-parser", "vllmhttp-parser" },
      parsers.types())
  end)

  it("a path is read by the parser claiming its longest suffix, prefixed paths too", function()
    local rt = loaded()
    local status, msg = send(rt, "/openai/v1/chat/completions", '{"model":"m"}')
    assert.equal(400, status)
    assert.matches('missing "messages"', msg, 1, true)
    assert.equal(200, (send(rt, "/openai/v1/chat/completions", CHAT)))
    status, msg = send(rt, "/anthropic/v1/messages", CHAT)
    assert.equal(400, status)
    assert.matches('missing "max_tokens"', msg, 1, true)
    rt:free()
  end)

  it("looks a served path up in a table made once per config", function()
    local rt = loaded([[
requestHandler:
  parsers:
  - pluginRef: anthropic-parser
]])
    local by_path = S.eval(rt, [[
      local out = {}
      for path, hit in pairs(require('lupin.runtime').current.parsers.by_path) do
        out[path] = hit and hit.parser.type or false
      end
      return out]])
    assert.equal(#require("lupin.runtime.openai").paths(), (function()
      local c = 0
      for _ in pairs(by_path) do
        c = c + 1
      end
      return c
    end)())
    assert.equal("anthropic-parser", by_path["/v1/messages"])
    assert.equal("anthropic-parser", by_path["/v1/messages/count_tokens"])
    assert.is_false(by_path["/v1/completions"])
    rt:free()
  end)

  it("an explicit list gains no fallback: an unclaimed path is a 400 naming it and the list",
    function()
      local rt = loaded([[
requestHandler:
  parsers:
  - pluginRef: openai-parser
]])
      assert.equal(200, (send(rt, "/v1/chat/completions", CHAT)))
      local status, msg, seen = send(rt, "/v1/messages", MESSAGES)
      assert.equal(400, status)
      assert.is_nil(seen, "a plugin saw the refused request")
      assert.equal("no parser claims the path /v1/messages: the configured parsers"
        .. " (requestHandler.parsers) are openai-parser (openai-parser); add one that claims it,"
        .. " or passthrough-parser last to forward any path unread", msg)
      assert.equal(400, (send(rt, "/tokenize", '{"prompt":"x"}')))
      rt:free()
    end)

  it("takes named plugins with their parameters, in order", function()
    local rt = loaded([[
requestHandler:
  parsers:
  - pluginRef: claude
  - pluginRef: pt
]], "- {type: passthrough-parser, name: pt, parameters: {model: cfg-model}}\n"
      .. "- {type: anthropic-parser, name: claude}\n")
    assert.equal("claude (anthropic-parser), pt (passthrough-parser)",
      S.eval(rt, "return require('lupin.runtime').current.parsers.names"))
    local status, _, seen = send(rt, "/v1/chat/completions", "{not json")
    assert.equal(200, status)
    assert.equal("cfg-model", seen.model)
    assert.equal(400, (send(rt, "/v1/messages", CHAT)))
    rt:free()
  end)

  it("the older top-level parser is the list's one entry, as upstream maps it", function()
    local rt = loaded("parser: {pluginRef: openai-parser}\n")
    assert.equal("openai-parser (openai-parser)",
      S.eval(rt, "return require('lupin.runtime').current.parsers.names"))
    assert.equal(400, (send(rt, "/v1/messages", MESSAGES)))
    rt:free()
    -- with both, the list wins and the parser section is named in a warning
    rt = loaded([[
parser: {pluginRef: passthrough-parser}
requestHandler:
  parsers:
  - pluginRef: anthropic-parser
]])
    assert.equal("anthropic-parser (anthropic-parser)",
      S.eval(rt, "return require('lupin.runtime').current.parsers.names"))
    assert.matches('cfg.yaml:8: parser: both "parser" and "requestHandler.parsers"',
      warnings(rt), 1, true)
    rt:free()
  end)

  it("an empty list or section means the defaults", function()
    for _, text in ipairs({ "requestHandler: {parsers: []}\n", "requestHandler: {}\n" }) do
      local rt = loaded(text)
      assert.matches("^openai%-parser .*passthrough%-parser %(passthrough%-parser%)$",
        S.eval(rt, "return require('lupin.runtime').current.parsers.names"))
      rt:free()
    end
  end)

  it("skips a second parser of a type and those after the fallback, with warnings", function()
    local rt = loaded([[
requestHandler:
  parsers:
  - pluginRef: openai-parser
  - pluginRef: o2
  - pluginRef: openai-parser
  - pluginRef: passthrough-parser
  - pluginRef: anthropic-parser
]], "- {type: openai-parser, name: o2}\n")
    assert.equal("openai-parser (openai-parser), passthrough-parser (passthrough-parser)",
      S.eval(rt, "return require('lupin.runtime').current.parsers.names"))
    local w = warnings(rt)
    assert.matches('cfg.yaml:12: requestHandler.parsers[1]: parser "o2" is a second'
      .. ' openai-parser (the first is "openai-parser")', w, 1, true)
    assert.matches('cfg.yaml:13: requestHandler.parsers[2]: parser "openai-parser" is listed'
      .. " twice; the second entry is skipped", w, 1, true)
    assert.matches('cfg.yaml:15: requestHandler.parsers[4]: parser "anthropic-parser" comes'
      .. ' after the fallback "passthrough-parser"', w, 1, true)
    -- /v1/messages went to the fallback: no body read
    assert.equal(200, (send(rt, "/v1/messages", "x")))
    rt:free()
  end)

  it("refuses what names no parser, at the file, line and field", function()
    fails("requestHandler:\n  parsers:\n  - pluginRef: nope\n",
      "cfg.yaml:10: requestHandler.parsers[0].pluginRef: undefined pluginRef \"nope\": define a"
      .. ' parser plugin of that name under "plugins", or name a parser type (anthropic-parser,'
      .. " openai-parser, passthrough-parser, vllmhttp-parser)")
    fails("requestHandler:\n  parsers:\n  - pluginRef: openai-parser\n  - pluginRef:"
      .. " max-score-picker\n", "cfg.yaml:11: requestHandler.parsers[1].pluginRef: plugin"
      .. ' "max-score-picker" is a max-score-picker, not a parser')
    fails("requestHandler:\n  parsers:\n  - {}\n", "cfg.yaml:10: requestHandler.parsers[0]",
      'missing "pluginRef"')
    fails("requestHandler:\n  parsers:\n  - pluginRef: \"\"\n", "requestHandler.parsers[0]")
    fails("requestHandler:\n  parsers:\n  - {ref: x}\n", 'unknown field "ref"')
    fails("requestHandler:\n  parser: []\n", "cfg.yaml:9: requestHandler",
      'unknown field "parser"')
    fails("requestHandler:\n  parsers: openai-parser\n", "requestHandler.parsers",
      "must be an array")
    fails("parser: {pluginRef: nope}\n", "cfg.yaml:8: parser.pluginRef: undefined pluginRef")
  end)

  it("a parser in a profile is ignored with a warning, as upstream's loader takes it", function()
    local rt = S.runtime()
    assert(rt:load_string([[
plugins:
- type: max-score-picker
- type: vllmhttp-parser
schedulingProfiles:
- name: d
  plugins:
  - pluginRef: vllmhttp-parser
  - pluginRef: max-score-picker
]], "cfg.yaml"))
    assert.matches('cfg.yaml:7: schedulingProfiles[0].plugins[0]: plugin "vllmhttp-parser"'
      .. " (vllmhttp-parser) is a parser, not a filter, scorer or picker; its entry in profile"
      .. ' "d" is ignored', warnings(rt), 1, true)
    rt:free()
  end)
end)
