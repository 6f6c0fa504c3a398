-- What the gateway host (lupin serve, gateway/gwlua.c) asks of the Lua side:
-- the JSON work, since the C side has no JSON library of its own (DESIGN.md §3:
-- the C side uses lua-cjson through the runtime's Lua state).
local cjson = require "cjson.safe"
local config = require "lupin.config"
local explain = require "lupin.explain"

local byte = string.byte

-- Request bodies are read as RFC 8259 says: no NaN, Infinity or hex numbers
-- (lua-cjson takes them by default).  UTF-8 is checked before, in C
-- (gateway/gwlua.c).
local strict = cjson.new()
strict.decode_invalid_numbers(false)

local M = {}

local function bad(message, param)
  return nil, message, param
end

local function check_prompt(body)
  local p = body.prompt
  if p == nil then
    return bad('missing "prompt": a completion request needs a prompt (a string or a list of'
      .. " strings)", "prompt")
  end
  if type(p) == "table" then
    for i, s in ipairs(p) do
      if type(s) ~= "string" and type(s) ~= "number" and type(s) ~= "table" then
        return bad(("prompt[%d] must be a string, got %s"):format(i - 1, type(s)), "prompt")
      end
    end
  elseif type(p) ~= "string" then
    return bad(("prompt must be a string or a list of strings, got %s"):format(type(p)), "prompt")
  end
  return true
end

local function check_messages(body)
  local m = body.messages
  if type(m) ~= "table" or (next(m) ~= nil and #m == 0) then
    return bad('"messages" must be a list of {"role", "content"} objects', "messages")
  end
  for i, msg in ipairs(m) do
    if type(msg) ~= "table" or type(msg.role) ~= "string" then
      return bad(('messages[%d] must be an object with a string "role"'):format(i - 1), "messages")
    end
  end
  return true
end

-- Whether a JSON text's first token opens an array: cjson decodes [] and {}
-- alike.  A byte loop, not a pattern: string.match would stop LuaJIT's trace
-- of validate, which runs for every request.
local function is_array_text(text)
  for i = 1, #text do
    local b = byte(text, i)
    if b == 91 then -- [
      return true
    end
    if b ~= 32 and b ~= 9 and b ~= 10 and b ~= 13 then
      return false
    end
  end
  return false
end

local NUMBERS = { "max_tokens", "max_completion_tokens", "temperature", "top_p", "n" }

-- The body validate decoded, for the request about to begin with it: the
-- request view (lupin.ctx) takes it instead of decoding the same text again.
-- Strings are interned, so the comparison is by identity.  Taken once.
local decoded_text, decoded_body

function M.take_decoded(text)
  if text ~= decoded_text then
    return nil
  end
  local body = decoded_body
  decoded_text, decoded_body = nil, nil
  return body
end

--- Checks an OpenAI request body.  Returns the model and the stream flag, or
--- nil, a message a person can act on, and the offending parameter.
function M.validate(path, text)
  local body, err = strict.decode(text)
  if body == nil then
    return bad(("the request body is not valid JSON (RFC 8259): %s"):format(tostring(err)))
  end
  if type(body) ~= "table" or is_array_text(text) then
    return bad("the request body must be a JSON object")
  end
  if body.model == nil then
    return bad('missing "model": name the model to use, e.g. "model": "llama"', "model")
  end
  if type(body.model) ~= "string" or body.model == "" then
    return bad(('"model" must be a non-empty string, got %s'):format(cjson.encode(body.model)),
      "model")
  end
  if body.stream ~= nil and type(body.stream) ~= "boolean" then
    return bad(('"stream" must be true or false, got %s'):format(cjson.encode(body.stream)),
      "stream")
  end
  for _, k in ipairs(NUMBERS) do
    local v = body[k]
    if v ~= nil and v ~= cjson.null and type(v) ~= "number" then
      return bad(('"%s" must be a number, got %s'):format(k, cjson.encode(v)), k)
    end
    if type(v) == "number" and v - v ~= 0 then -- 1e400 is valid JSON, read as infinity
      return bad(('"%s" must be a finite number, got %s'):format(k, tostring(v)), k)
    end
  end
  local ok, msg, param
  if path == "/v1/chat/completions" then
    ok, msg, param = check_messages(body)
  else
    ok, msg, param = check_prompt(body)
  end
  if not ok then
    return nil, msg, param
  end
  decoded_text, decoded_body = text, body
  return body.model, body.stream == true
end

--- Merges the /v1/models answers of the endpoints into one list, each model
--- once (first seen wins).
function M.models(bodies)
  local seen, data = {}, {}
  for _, text in ipairs(bodies) do
    local b = cjson.decode(text)
    if type(b) == "table" and type(b.data) == "table" then
      for _, m in ipairs(b.data) do
        if type(m) == "table" and type(m.id) == "string" and not seen[m.id] then
          seen[m.id] = true
          data[#data + 1] = m
        end
      end
    end
  end
  if #data == 0 then -- cjson would write an empty table as {}
    return '{"object":"list","data":[]}'
  end
  -- lua-cjson 2.1 escapes every "/" ("meta-llama\/Llama..."): valid JSON,
  -- but not what clients compare ids against.  cjson writes a backslash as
  -- "\\" and never a bare "/", so each "\/" left is an escaped slash.
  return (cjson.encode({ object = "list", data = data }):gsub("\\/", "/"))
end

--- Sets the Lua memory limit (maxLuaMemoryBytes, --max-lua-memory).
function M.memory_limit(bytes)
  require("lupin.engine").set_memory_limit(bytes) -- not at the top: engine needs this module
end

--- The gateway's settings and static endpoints from a generation.
function M.settings(gen)
  return gen and gen.gateway or {}
end

function M.endpoints(gen)
  return gen and gen.endpoints or {}
end

M.endpoints_file = config.endpoints_file

-- explain records (gateway/explain.c, `lupin explain`)
M.explain_summary = explain.summary
M.explain_text = explain.text
M.explain_path = explain.path

--- The plugin directories the current generation was loaded from (home's,
--- the runtime's, the config's pluginDirs): the gateway watches them.
function M.plugin_dirs(gen)
  return gen and gen.plugin_dirs or {}
end

return M
