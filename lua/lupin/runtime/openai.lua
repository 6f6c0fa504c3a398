-- The request checks a host asks for at request begin
-- (lupin_request_desc.check_body), one row per API route vLLM serves: strict
-- JSON (or a multipart form), the model, the fields the route needs, each
-- refusal naming the parameter; and the text each route feeds the prefix
-- scorer (ctx.request.prompt).
local cjson = require "cjson.safe"
local json = require "lupin.runtime.json"

local ffi = require "ffi"
local byte = string.byte

-- Request bodies are read as RFC 8259 says: no NaN, Infinity or hex numbers
-- (lua-cjson takes them by default).  UTF-8 is checked as simdjson parses
-- (lupin.json.decode_utf8), which gives where it failed.
local strict = cjson.new()
strict.decode_invalid_numbers(false)

local M = {}

local function bad(message, param)
  return nil, message, param
end

local function shown(v)
  return cjson.encode(v) or tostring(v)
end

-- --- what a field may hold (a check returns nil, or a message) ------------

local KINDS = {}

-- a completion prompt: a string, or a list of strings or token ids
function KINDS.prompt(v, name)
  if type(v) == "table" then
    for i, s in ipairs(v) do
      if type(s) ~= "string" and type(s) ~= "number" and type(s) ~= "table" then
        return ("%s[%d] must be a string, got %s"):format(name, i - 1, type(s))
      end
    end
  elseif type(v) ~= "string" then
    return ("%s must be a string or a list of strings, got %s"):format(name, type(v))
  end
end

-- the input of embeddings, pooling, classify: the same shapes as a prompt
KINDS.input = KINDS.prompt

-- chat messages: a list of objects, each with a string role
function KINDS.messages(v, name)
  if type(v) ~= "table" or (next(v) ~= nil and #v == 0) then
    return ('"%s" must be a list of {"role", "content"} objects'):format(name)
  end
  for i, msg in ipairs(v) do
    if type(msg) ~= "table" or type(msg.role) ~= "string" then
      return ('%s[%d] must be an object with a string "role"'):format(name, i - 1)
    end
  end
end

-- the Responses API's input: a string or a list of items
function KINDS.items(v, name)
  if type(v) ~= "string" and (type(v) ~= "table" or (next(v) ~= nil and #v == 0)) then
    return ('"%s" must be a string or a list of input items, got %s'):format(name, shown(v))
  end
end

-- a string, or a list (of strings, or of multimodal parts)
function KINDS.texts(v, name)
  if type(v) ~= "string" and type(v) ~= "table" then
    return ('"%s" must be a string or a list, got %s'):format(name, shown(v))
  end
end

function KINDS.tokens(v, name)
  if type(v) ~= "table" or (next(v) ~= nil and #v == 0) then
    return ('"%s" must be a list of token ids, got %s'):format(name, shown(v))
  end
  for i, t in ipairs(v) do
    if type(t) ~= "number" or t ~= math.floor(t) then
      return ("%s[%d] must be an integer token id, got %s"):format(name, i - 1, shown(t))
    end
  end
end

function KINDS.integer(v, name)
  if type(v) ~= "number" or v ~= math.floor(v) or v - v ~= 0 then
    return ('"%s" must be an integer, got %s'):format(name, shown(v))
  end
end

-- --- what each route feeds the prefix scorer -------------------------------

local function join(p)
  if type(p) == "string" then
    return p
  elseif type(p) == "table" then
    local parts = {}
    for i, s in ipairs(p) do
      parts[i] = type(s) == "table" and (cjson.encode(s) or "") or tostring(s)
    end
    return table.concat(parts, " ")
  end
  return ""
end

-- JSON with object keys sorted: what the prefix scorer hashes must not
-- depend on the order a table's keys happen to come in (it differs from one
-- process to the next), or a gateway restart would miss every cache.
local function canonical(v, out)
  if type(v) ~= "table" then
    out[#out + 1] = cjson.encode(v) or "null"
  elseif v[1] ~= nil or next(v) == nil then
    out[#out + 1] = "["
    for i = 1, #v do
      if i > 1 then
        out[#out + 1] = ","
      end
      canonical(v[i], out)
    end
    out[#out + 1] = "]"
  else
    local keys = {}
    for k in pairs(v) do
      keys[#keys + 1] = tostring(k)
    end
    table.sort(keys)
    out[#out + 1] = "{"
    for i, k in ipairs(keys) do
      out[#out + 1] = (i > 1 and "," or "") .. cjson.encode(k) .. ":"
      canonical(v[k], out)
    end
    out[#out + 1] = "}"
  end
  return out
end

--- A value as the prompt of a chat request writes it: JSON, object keys
--- sorted (lupin.precise finds a prefix's whole messages with it).
function M.canonical(v)
  return table.concat(canonical(v, {}))
end

local function json_of(v)
  if v == nil then
    return ""
  end
  return type(v) == "string" and v or table.concat(canonical(v, {}))
end

local PROMPTS = {}

function PROMPTS.prompt(body)
  return join(body.prompt)
end

function PROMPTS.messages(body)
  return type(body.messages) == "table" and json_of(body.messages) or ""
end

-- tokenize takes a prompt or messages: what it tokenizes runs no model, so
-- it records nothing; but the text is the same request's
function PROMPTS.either(body)
  return body.prompt ~= nil and PROMPTS.prompt(body) or PROMPTS.messages(body)
end

function PROMPTS.input(body)
  return body.input ~= nil and join(body.input) or PROMPTS.messages(body)
end

-- the instructions (a system prompt) come before the input
function PROMPTS.responses(body)
  local pre = type(body.instructions) == "string" and body.instructions or ""
  return pre .. json_of(body.input)
end

-- Anthropic: the system prompt, then the messages
function PROMPTS.anthropic(body)
  return json_of(body.system) .. PROMPTS.messages(body)
end

-- vLLM's generate takes token ids: their text is the prefix
function PROMPTS.token_ids(body)
  return join(body.token_ids)
end

-- a cross-encoder scores query + document pairs: the query is the shared prefix
function PROMPTS.query(body)
  return join(body.query or body.text_1 or body.queries or body.data_1)
end

function PROMPTS.none()
  return ""
end

-- --- the routes ------------------------------------------------------------
--
-- One row per path.  model: required, or optional where vLLM makes it so
-- (it serves one model then); form: a multipart/form-data body (audio);
-- need: the fields the body must hold, each {name, kind}, a list of names
-- meaning one of them; prompt: what feeds ctx.request.prompt.

-- (a completion's prompt; a body with messages and no prompt, sent to a
-- path no row names, is read as chat)
local COMPLETIONS = { api = "completions", model = true, need = { { "prompt", "prompt" } },
  prompt = PROMPTS.either }
local SCORE = { api = "score", need = { { { "text_1", "queries", "data_1" }, "texts" },
  { { "text_2", "documents", "data_2" }, "texts" } }, prompt = PROMPTS.query }
local RERANK = { api = "rerank", need = { { "query", "texts" }, { "documents", "texts" } },
  prompt = PROMPTS.query }
local AUDIO = { api = "audio", model = true, form = true, need = {}, prompt = PROMPTS.none }
local CHAT = { api = "chat", model = true, need = { { "messages", "messages" } },
  prompt = PROMPTS.messages }

M.ROUTES = {
  ["/v1/completions"] = COMPLETIONS,
  ["/v1/chat/completions"] = CHAT,
  -- render: the prompt the engine would run, run no further; the parent's body
  ["/v1/completions/render"] = COMPLETIONS,
  ["/v1/chat/completions/render"] = CHAT,
  ["/v1/embeddings"] = { api = "embeddings", model = true, need = { { "input", "input" } },
    prompt = PROMPTS.input },
  ["/v1/responses"] = { api = "responses", model = true, need = { { "input", "items" } },
    prompt = PROMPTS.responses },
  ["/v1/messages"] = { api = "messages", model = true,
    need = { { "messages", "messages" }, { "max_tokens", "integer" } }, prompt = PROMPTS.anthropic },
  -- a token count, forwarded as sent: its body is not checked (raw), as upstream
  ["/v1/messages/count_tokens"] = { api = "count_tokens", raw = true, need = {},
    prompt = PROMPTS.none },
  -- vLLM's pre-tokenized generate (the vllmhttp parser's own path upstream)
  ["/inference/v1/generate"] = { api = "generate", need = { { "token_ids", "tokens" } },
    prompt = PROMPTS.token_ids },
  ["/v1/audio/transcriptions"] = AUDIO,
  ["/v1/audio/translations"] = AUDIO,
  ["/tokenize"] = { api = "tokenize", need = { { { "prompt", "messages" }, "either" } },
    prompt = PROMPTS.none },
  ["/detokenize"] = { api = "detokenize", need = { { "tokens", "tokens" } }, prompt = PROMPTS.none },
  ["/pooling"] = { api = "pooling", need = { { { "input", "messages" }, "either" } },
    prompt = PROMPTS.input },
  ["/classify"] = { api = "classify", need = { { { "input", "messages" }, "either" } },
    prompt = PROMPTS.input },
  ["/score"] = SCORE,
  ["/v1/score"] = SCORE,
  ["/rerank"] = RERANK,
  ["/v1/rerank"] = RERANK,
  ["/v2/rerank"] = RERANK,
}

--- The API paths of the routes, sorted: what a host lists for an unknown one.
function M.paths()
  local list = {}
  for p in pairs(M.ROUTES) do
    list[#list + 1] = p
  end
  table.sort(list)
  return list
end

-- The rows by path suffix (no leading "/"), longest first: a path no row
-- names exactly, such as a prefixed /openai/v1/chat/completions, takes the
-- row of the longest suffix it ends with, as upstream's parsers match.
local SUFFIXES = {}
for path, row in pairs(M.ROUTES) do
  SUFFIXES[#SUFFIXES + 1] = { path:gsub("^/v1/", ""):gsub("^/", ""), row }
end
table.sort(SUFFIXES, function(a, b)
  return #a[1] > #b[1] or (#a[1] == #b[1] and a[1] < b[1])
end)

--- Whether path ends with suffix (both without their trailing "/").
function M.ends_with(path, suffix)
  return path:sub(-#suffix) == suffix
end

--- The row that reads a body sent to path: its own, the longest suffix's,
--- else the completions row (as the EPP's openai parser does).
function M.route(path)
  local row = M.ROUTES[path]
  if row then
    return row
  end
  path = path:gsub("/+$", "")
  for _, s in ipairs(SUFFIXES) do
    if M.ends_with(path, s[1]) then
      return s[2]
    end
  end
  return COMPLETIONS
end
local route_of = M.route

--- The text of a decoded body the prefix scorer hashes, as its route reads it.
---@return string
function M.prompt(path, body)
  if type(body) ~= "table" then
    return ""
  end
  return route_of(path).prompt(body)
end

-- "either": tokenize's prompt or messages, pooling's input or messages
function KINDS.either(v, name)
  local k = name == "messages" and KINDS.messages or KINDS.prompt
  return k(v, name)
end

-- what a missing field should hold, for the message
local HINTS = { prompt = "a string or a list of strings", input = "a string or a list of strings",
  messages = 'a list of {"role", "content"} objects', items = "a string or a list of items",
  texts = "a string or a list of strings", tokens = "a list of token ids", integer = "an integer",
  either = "a string, or a list of messages" }

-- each need's names as a list, once, so the check allocates nothing
for _, route in pairs(M.ROUTES) do
  for _, n in ipairs(route.need) do
    if type(n[1]) == "string" then
      n[1] = { n[1] }
    end
  end
end

local function check_need(body, route)
  for _, n in ipairs(route.need) do
    local names, kind = n[1], n[2]
    local found
    for _, name in ipairs(names) do
      if body[name] ~= nil and body[name] ~= cjson.null then
        found = name
        break
      end
    end
    if not found then
      local list = #names == 1 and ('"%s"'):format(names[1])
        or ('one of "%s"'):format(table.concat(names, '", "'))
      return bad(("missing %s: a %s request needs it (%s)"):format(list, route.api, HINTS[kind]),
        names[1])
    end
    local err = KINDS[kind](body[found], found)
    if err then
      return bad(err, found)
    end
  end
  return true
end

-- Byte i of a text: a string, or a pointer into the host's memory (a
-- body to check, which the core passes without a Lua copy: json.text).
local function byte_at(text, i)
  if type(text) == "string" then
    return byte(text, i)
  end
  return ffi.cast("const uint8_t *", text)[i - 1]
end

-- Whether a JSON text of len bytes opens an array with its first token:
-- cjson decodes [] and {} alike.  A byte loop, not a pattern: string.match
-- would stop LuaJIT's trace of validate, which runs for every request.
local function is_array_text(text, len)
  for i = 1, len do
    local b = byte_at(text, i)
    if b == 91 then -- [
      return true
    end
    if b ~= 32 and b ~= 9 and b ~= 10 and b ~= 13 then
      return false
    end
  end
  return false
end

local NUMBERS = { "max_tokens", "max_completion_tokens", "max_output_tokens", "temperature",
  "top_p", "n" }

--- The API path of a body a host sent without one: chat when it has
--- "messages", else completions (bodies that do not decode included).
--- text: a string, or a pointer and its len (json.text).
function M.path_of(text, len)
  local body = text and json.decode(text, cjson, len)
  return type(body) == "table" and body.messages ~= nil and "/v1/chat/completions"
    or "/v1/completions"
end

-- --- multipart/form-data (RFC 7578): the audio routes ----------------------

-- The boundary a content-type names, or nil.
local function boundary_of(content_type)
  if type(content_type) ~= "string" or not content_type:lower():find("^%s*multipart/form%-data") then
    return nil
  end
  local b = content_type:match('[Bb][Oo][Uu][Nn][Dd][Aa][Rr][Yy]="([^"]+)"')
    or content_type:match("[Bb][Oo][Uu][Nn][Dd][Aa][Rr][Yy]=([^;%s]+)")
  return b
end

--- The fields of a multipart/form-data body: name -> value for the text
--- parts, name -> { filename = ..., size = n } for the files.  nil and a
--- message when it is not one.
function M.form(text, content_type)
  local b = boundary_of(content_type)
  if not b then
    return nil, ("this route takes a multipart/form-data body (the OpenAI SDK's file upload);"
      .. " got content-type %s"):format(content_type and shown(content_type) or "none")
  end
  local delim = "--" .. b
  local fields, pos = {}, text:find(delim, 1, true)
  if not pos then
    return nil, ("the multipart body holds no part (no boundary %q)"):format(b)
  end
  while true do
    pos = pos + #delim
    if text:sub(pos, pos + 1) == "--" then
      return fields
    end
    local head_end = text:find("\r\n\r\n", pos, true)
    local next_at = head_end and text:find("\r\n" .. delim, head_end + 4, true)
    if not next_at then
      return nil, "the multipart body ends inside a part (no closing boundary)"
    end
    local head = text:sub(pos, head_end - 1)
    local name = head:match('[Nn]ame="([^"]*)"')
    if name then
      local filename = head:match('[Ff]ilename="([^"]*)"')
      local value = text:sub(head_end + 4, next_at - 1)
      fields[name] = filename and { filename = filename, size = #value } or value
    end
    pos = next_at + 2
  end
end

-- The form's fields as a body: the model, the stream flag ("true"), the rest.
local function check_form(route, text, content_type)
  local fields, err = M.form(text, content_type)
  if not fields then
    return bad(err)
  end
  if fields.stream ~= nil then
    if fields.stream ~= "true" and fields.stream ~= "false" then
      return bad(('"stream" must be true or false, got %s'):format(shown(fields.stream)), "stream")
    end
    fields.stream = fields.stream == "true"
  end
  if route.model and type(fields.model) ~= "string" then
    return bad('missing "model": add a "model" form field naming the model, e.g. "whisper"',
      "model")
  end
  if type(fields.file) ~= "table" then
    return bad('missing "file": the audio to transcribe, as a file part of the form', "file")
  end
  return fields
end

--- Checks the body of the request path names.  content_type: the
--- request's, for the multipart routes.  Returns the decoded body (a
--- form's fields for multipart), or nil, a message a person can act on and
--- the offending parameter.  text: a string, or a pointer and its len
--- (json.text), read only during the call.
---@return table? body, string? message, string? param
function M.check(path, text, content_type, len)
  return M.check_row(route_of(path), text, content_type, len)
end

--- M.check with the row given (lupin.runtime.parsers resolved it).
function M.check_row(route, text, content_type, len)
  text = text or ""
  if type(text) == "string" then
    len = #text
  end
  if route.form then -- binary audio: not UTF-8, not JSON
    local body, msg, param = check_form(route, json.text(text, len), content_type)
    if body and body.model ~= nil and body.model == "" then
      return bad('"model" must be a non-empty string', "model")
    end
    return body, msg, param
  end
  local body, err, bad_utf8_at = json.decode_utf8(text, strict, len)
  if bad_utf8_at then
    return bad(("the request body is not valid UTF-8 at byte %d (0x%02x): JSON text must be"
      .. " UTF-8 (RFC 8259)"):format(bad_utf8_at + 1, byte_at(text, bad_utf8_at + 1)))
  elseif body == nil then
    return bad(("the request body is not valid JSON (RFC 8259): %s"):format(tostring(err)))
  end
  if type(body) ~= "table" or is_array_text(text, len) then
    return bad("the request body must be a JSON object")
  end
  if body.model == nil and route.model then
    return bad('missing "model": name the model to use, e.g. "model": "llama"', "model")
  end
  if body.model ~= nil and (type(body.model) ~= "string" or body.model == "") then
    return bad(('"model" must be a non-empty string, got %s'):format(shown(body.model)), "model")
  end
  if body.stream ~= nil and type(body.stream) ~= "boolean" then
    return bad(('"stream" must be true or false, got %s'):format(shown(body.stream)), "stream")
  end
  for _, k in ipairs(NUMBERS) do
    local v = body[k]
    if v ~= nil and v ~= cjson.null and type(v) ~= "number" then
      return bad(('"%s" must be a number, got %s'):format(k, shown(v)), k)
    end
    if type(v) == "number" and v - v ~= 0 then -- 1e400 is valid JSON, read as infinity
      return bad(('"%s" must be a finite number, got %s'):format(k, tostring(v)), k)
    end
  end
  local ok, msg, param = check_need(body, route)
  if not ok then
    return nil, msg, param
  end
  return body
end

return M
