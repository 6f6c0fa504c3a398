-- The OpenAI request checks a host asks for at request begin
-- (lupin_request_desc.check_body): strict JSON, then the fields scheduling
-- and the model servers rely on, each refusal naming the parameter.
local cjson = require "cjson.safe"

local byte = string.byte

-- Request bodies are read as RFC 8259 says: no NaN, Infinity or hex numbers
-- (lua-cjson takes them by default).  UTF-8 is checked before, in C
-- (core/request.c, with utf8proc), which passes where it failed.
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

--- The API path of a body a host sent without one: chat when it has
--- "messages", else completions (bodies that do not decode included).
function M.path_of(text)
  local body = text and cjson.decode(text)
  return type(body) == "table" and body.messages ~= nil and "/v1/chat/completions"
    or "/v1/completions"
end

--- Checks the body of the OpenAI request path names.  bad_utf8_at: the
--- offset of its first byte that is not UTF-8 (core/request.c), or nil.
--- Returns the decoded body, or nil, a message a person can act on and the
--- offending parameter.
---@return table? body, string? message, string? param
function M.check(path, text, bad_utf8_at)
  text = text or ""
  if bad_utf8_at then
    return bad(("the request body is not valid UTF-8 at byte %d (0x%02x): JSON text must be"
      .. " UTF-8 (RFC 8259)"):format(bad_utf8_at + 1, byte(text, bad_utf8_at + 1)))
  end
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
  return body
end

return M
