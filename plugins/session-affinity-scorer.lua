-- llm-d's session affinity scorer, with its two strategies.
-- encoded_endpoint_header (default): the client sends back the token it was
-- given, base64 (standard, padded) of the serving endpoint's namespace/name;
-- it scores 1.0 on that endpoint, 0 on every other.  An endpoint's namespace
-- is its `namespace` label, else "default"; a token of the bare name (lupin's
-- earlier tokens) still matches.  No token, one naming no candidate, or one
-- that is not valid base64 (logged) scores 0 everywhere.
-- session_id: the client's own session id (the first non-empty header of
-- sessionIdConfig.sources) is bound to the endpoint that served it; a bound
-- session scores 1.0 there, an unbound one 0 everywhere.  Bindings unused for
-- evictionTtlSeconds are forgotten.  profileName: the profile whose endpoint is
-- pinned (default the primary).
local DEFAULT_HEADER, DEFAULT_SESSION_HEADER = "x-session-token", "x-session-id"
local TTL, SWEEP = 300, 10 -- seconds: upstream's defaults
local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local VALUE = {}
for i = 1, 64 do
  VALUE[ALPHABET:byte(i)] = i - 1
end

local function encode(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n, group = a * 65536 + (b or 0) * 256 + (c or 0), {}
    for j = 1, 4 do
      local v = math.floor(n / 64 ^ (4 - j)) % 64
      group[j] = ALPHABET:sub(v + 1, v + 1)
    end
    group[3], group[4] = b and group[3] or "=", c and group[4] or "="
    out[#out + 1] = table.concat(group)
  end
  return table.concat(out)
end

-- Strict standard base64 (Go's base64.StdEncoding); nil when invalid.
local function decode(s)
  local pad = #(s:match("=*$"))
  if #s % 4 ~= 0 or pad > 2 then
    return nil
  end
  local out = {}
  for i = 1, #s, 4 do
    local n, last = 0, i + 3 == #s
    for j = i, i + 3 do
      local v = VALUE[s:byte(j)]
      if not v and not (last and j > #s - pad) then
        return nil
      end
      n = n * 64 + (v or 0)
    end
    local bytes = string.char(math.floor(n / 65536), math.floor(n / 256) % 256, n % 256)
    out[#out + 1] = last and bytes:sub(1, 3 - pad) or bytes
  end
  return table.concat(out)
end

-- "namespace/name", as upstream's NamespacedName.String().
local function namespace_of(ep)
  return (ep.labels and ep.labels.namespace) or "default"
end

local function id_of(ep)
  return namespace_of(ep) .. "/" .. ep.name
end

-- Whether want names ep: its id_of, or its bare name.  Compared in place: the
-- scorer asks for every candidate, and an id made per endpoint was a string
-- per endpoint per request.
local function names(want, ep)
  local name = ep.name
  if want == name then
    return true
  end
  local ns = namespace_of(ep)
  local at = #ns + 2 -- where the name starts after "<ns>/"
  return #want == at - 1 + #name and want:byte(at - 1) == 47 -- "/"
    and want:find(ns, 1, true) == 1 and want:find(name, at, true) == at
end

local function chosen(self, result)
  local res = result and result.profiles[self.profile or result.primary]
  return res and res.endpoints[1]
end

local function session_id(self, headers)
  for _, h in ipairs(self.sources) do
    local v = headers[h] and headers[h]:match("^%s*(.-)%s*$")
    if v and v ~= "" then
      return v
    end
  end
end

-- The session-id strategy's config: its header sources (attribute sources are
-- published by upstream plugins lupin does not have: they never match).
local function session_config(c, env)
  local sources, ttl = {}, c.evictionTtlSeconds or 0
  for i, src in ipairs(c.sources or {}) do
    if type(src) ~= "table" or (src.header == nil) == (src.attribute == nil) then
      error(("sessionIdConfig.sources[%d]: exactly one of header or attribute must be set"):format(
        i - 1), 0)
    elseif src.header then
      sources[#sources + 1] = tostring(src.header):lower()
    else
      env.log("warn", "sessionIdConfig.sources[%d]: request attribute %q is never set in lupin;"
        .. " only header sources match", i - 1, tostring(src.attribute))
    end
  end
  for _, k in ipairs({ "evictionTtlSeconds", "evictionSweepSeconds" }) do
    if type(c[k] or 0) ~= "number" or (c[k] or 0) < 0 then
      error(("sessionIdConfig.%s must be a number > 0, got %s"):format(k, tostring(c[k])), 0)
    end
  end
  if #(c.sources or {}) == 0 then
    sources[1] = DEFAULT_SESSION_HEADER
  end
  local sweep = c.evictionSweepSeconds or 0
  return sources, ttl > 0 and ttl or TTL, sweep > 0 and sweep or SWEEP
end

---@type lupin.Plugin
return {
  type = "session-affinity-scorer",
  schema = {
    strategy = { type = "string", default = "encoded_endpoint_header",
      enum = { "encoded_endpoint_header", "session_id" },
      description = "a token header naming the endpoint, or the client's own session id" },
    encodedEndpointHeaderConfig = { type = "object", default = {},
      description = "header: the token's request and response header (x-session-token)" },
    sessionIdConfig = { type = "object", default = {},
      description = "sources ([{header} or {attribute}], tried in order; x-session-id),"
        .. " evictionTtlSeconds (300; 0: 300), evictionSweepSeconds (10)" },
    profileName = { type = "string",
      description = "the profile whose endpoint is pinned (default: the primary)" },
  },
  encode = encode,
  decode = decode,
  id_of = id_of,

  new = function(p, env)
    local header = p.encodedEndpointHeaderConfig.header
    local self = { by_id = p.strategy == "session_id", profile = p.profileName, now = env.now,
      header = (type(header) == "string" and header ~= "" and header or DEFAULT_HEADER):lower(),
      bindings = {}, swept = env.now() } -- session id -> { name, seen }
    if self.by_id then
      self.sources, self.ttl, self.sweep = session_config(p.sessionIdConfig, env)
    end
    return self
  end,

  migrate = function(self, old)
    if self.by_id and old.by_id then
      self.bindings = old.bindings
    end
  end,

  score = function(self, ctx, endpoints)
    local want
    if self.by_id then
      local b = self.bindings[session_id(self, ctx.request.headers) or false]
      want = b and self.now() - b.seen <= self.ttl and b.name
    else
      local token = ctx.request.headers[self.header]
      if token and token ~= "" then
        want = decode(token)
        if not want then
          ctx:log("warn", "ignoring %s: not valid base64", self.header)
        end
      end
    end
    local scores = {}
    if not want then
      for i = 1, #endpoints do
        scores[i] = 0
      end
      return scores
    end
    for i = 1, #endpoints do
      scores[i] = names(want, endpoints[i]) and 1 or 0
    end
    return scores
  end,

  -- session_id: bind the session to the endpoint that serves it, and forget
  -- bindings past their TTL.
  pre_request = function(self, ctx, result)
    local id, ep = self.by_id and session_id(self, ctx.request.headers), chosen(self, result)
    if not (id and ep) then
      return
    end
    local now = self.now()
    if now - self.swept >= self.sweep then
      self.swept = now
      for k, b in pairs(self.bindings) do
        if now - b.seen > self.ttl then
          self.bindings[k] = nil
        end
      end
    end
    self.bindings[id] = { name = ep.name, seen = now }
  end,

  response_header = function(self, ctx)
    local ep = not self.by_id and chosen(self, ctx.result)
    if ep then
      ctx:set_response_header(self.header, encode(id_of(ep)))
    end
  end,
}
