--- lupin.runtime.parsers: which parser reads a request, by its path
--- (llm-d-router's requestHandler.parsers).  Each parser type claims path
--- suffixes; a request goes to the parser whose claim is the longest suffix
--- of its path, else to the fallback (a parser claiming nothing:
--- passthrough-parser), else it is refused with a 400.  The config builds a
--- registry once (M.registry); a request's lookup is one table index for
--- the paths lupin serves (M.resolve).
local openai = require "lupin.runtime.openai"

local M = {}

--- The suffixes each parser type claims: upstream's, where lupin has the
--- row (lua/lupin/runtime/openai.lua), and lupin's vLLM routes under the
--- parser upstream describes as vLLM's own (vllmhttp-parser) or OpenAI's
--- (the audio routes).  An empty list: the fallback.
M.CLAIMS = {
  ["openai-parser"] = { "completions", "chat/completions", "completions/render",
    "chat/completions/render", "embeddings", "responses", "audio/transcriptions",
    "audio/translations" },
  ["anthropic-parser"] = { "messages", "messages/count_tokens" },
  ["vllmhttp-parser"] = { "inference/v1/generate", "tokenize", "detokenize", "pooling", "classify",
    "score", "rerank" },
  ["passthrough-parser"] = {},
}

--- The parsers without a requestHandler.parsers list, in upstream's order:
--- the fallback last, so a path none claims is forwarded unread.
M.DEFAULT = { "openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser" }

--- The parser types, sorted: what an error lists.
function M.types()
  local list = {}
  for t in pairs(M.CLAIMS) do
    list[#list + 1] = t
  end
  table.sort(list)
  return list
end

-- A parser as the engine reads it: the passthrough parser's model source.
local function parser(spec)
  local p = { name = spec.name, type = spec.type, passthrough = #M.CLAIMS[spec.type] == 0 }
  if p.passthrough then
    local params = type(spec.params) == "table" and spec.params or {}
    local header = params.modelHeader
    if header == nil then
      header = "x-gateway-model-name"
    end
    p.model = type(params.model) == "string" and params.model or nil
    p.model_header = type(header) == "string" and header ~= "" and header:lower() or nil
  end
  return p
end

-- The longest claim that path ends with, as { parser, row }, or nil.
local function longest(claims, path)
  path = path:gsub("/+$", "")
  for _, c in ipairs(claims) do
    if openai.ends_with(path, c.suffix) then
      return c.hit
    end
  end
end

--- The registry of parsers for a list of { name, type, params, path } (in
--- the config's order), as upstream's: a second parser of a type is
--- skipped, and so is every parser after the first fallback.  warn(path,
--- message) hears of each skip.  Returns { parsers, fallback, claims,
--- by_path, names }.
function M.registry(list, warn)
  local reg = { parsers = {}, claims = {}, by_path = {}, fallback = false }
  local seen = {}
  for i, spec in ipairs(list) do
    if seen[spec.type] == spec.name then
      warn(spec.path, ("parser %q is listed twice; the second entry is skipped: remove"
        .. " it"):format(spec.name))
    elseif seen[spec.type] then
      warn(spec.path, ("parser %q is a second %s (the first is %q); it is skipped, as"
        .. " upstream skips a type listed twice"):format(spec.name, spec.type, seen[spec.type]))
    else
      seen[spec.type] = spec.name
      local p = parser(spec)
      reg.parsers[#reg.parsers + 1] = p
      if p.passthrough then
        reg.fallback = { parser = p }
        for j = i + 1, #list do
          warn(list[j].path, ("parser %q comes after the fallback %q, which takes every path"
            .. " no parser before it claims; it is skipped: list it before %q"):format(
            list[j].name, spec.name, spec.name))
        end
        break
      end
      for _, suffix in ipairs(M.CLAIMS[p.type]) do
        local row = openai.ROUTES["/v1/" .. suffix] or openai.ROUTES["/" .. suffix]
        reg.claims[#reg.claims + 1] = { suffix = suffix, hit = { parser = p, row = row } }
      end
    end
  end
  table.sort(reg.claims, function(a, b)
    return #a.suffix > #b.suffix or (#a.suffix == #b.suffix and a.suffix < b.suffix)
  end)
  -- the paths lupin serves, each resolved once: a request's lookup is here
  for path, row in pairs(openai.ROUTES) do
    local hit = longest(reg.claims, path)
    reg.by_path[path] = hit and { parser = hit.parser, row = row } or reg.fallback
  end
  local names = {}
  for i, p in ipairs(reg.parsers) do
    names[i] = ("%s (%s)"):format(p.name, p.type)
  end
  reg.names = table.concat(names, ", ")
  return reg
end

--- The parser of a request path, as { parser, row } (row nil for the
--- fallback), or false when no parser claims it and there is no fallback.
function M.resolve(reg, path)
  local hit = reg.by_path[path]
  if hit ~= nil then
    return hit
  end
  return longest(reg.claims, path) or reg.fallback
end

--- The 400's message for a path no configured parser claims.
function M.unclaimed(reg, path)
  return ("no parser claims the path %s: the configured parsers (requestHandler.parsers) are"
    .. " %s; add one that claims it, or passthrough-parser last to forward any path"
    .. " unread"):format(path, reg.names)
end

return M
