-- llm-d's session affinity: a client that sends back the `x-session-token`
-- it was given goes to the same endpoint.  The token is the serving
-- endpoint's name in standard base64 (with padding); it scores 1.0 on the
-- endpoint it names and 0 on every other.  No token, a token naming no
-- candidate, or one that is not valid base64 (logged) scores 0 everywhere.
local HEADER = "x-session-token"
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

---@type lupin.Plugin
return {
  type = "session-affinity-scorer",
  schema = {},
  encode = encode,
  decode = decode,

  score = function(_, ctx, endpoints)
    local token, want = ctx.request.headers[HEADER], nil
    if token and token ~= "" then
      want = decode(token)
      if not want then
        ctx:log("warn", "ignoring %s: not valid base64", HEADER)
      end
    end
    local scores = {}
    for i = 1, #endpoints do
      scores[i] = want ~= nil and endpoints[i].name == want and 1 or 0
    end
    return scores
  end,

  response_header = function(_, ctx)
    local result = ctx.result
    local ep = result and result.endpoints[1]
    if ep then
      ctx:set_response_header(HEADER, encode(ep.name))
    end
  end,
}
