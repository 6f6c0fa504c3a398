--- lupin.slo: a request's latency objectives (llm-d's SLO headers) and the
--- predictions predicted-latency-producer publishes for the request, which
--- latency-scorer, slo-headroom-tier-filter and latency-slo-admitter read.
--- The producer runs before the admission and the profiles and puts one
--- table at ctx.shared[slo.KEY]; without a producer in the config there is
--- none, and each reader falls back as upstream does.
---@class lupin.slo
local M = {}

--- Where the producer publishes the request's predictions in ctx.shared.
M.KEY = "predicted-latency"

--- The objectives' headers in milliseconds: llm-d-router's names, and the
--- older ones it still reads when the new one is absent.
M.TTFT_HEADER, M.TPOT_HEADER = "x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms"
M.OLD_TTFT_HEADER, M.OLD_TPOT_HEADER = "x-slo-ttft-ms", "x-slo-tpot-ms"

---@class lupin.SLO
---@field ttft number? the time-to-first-token objective in ms; nil when the request sets none
---@field tpot number? the time-per-output-token objective in ms; nil when the request sets none

---@class lupin.LatencyPrediction
---@field ttft number predicted time to first token, ms
---@field tpot number predicted time per output token, ms
---@field ttft_headroom number the objective minus the prediction (no objective: 0 − prediction)
---@field tpot_headroom number likewise; 0 when not streaming
---@field ttft_valid boolean the prediction is below the TTFT objective
---@field tpot_valid boolean the prediction is below the TPOT objective (true when not streaming)
---@field valid boolean both are
---@field dispatched integer requests in flight there through this gateway (ep.in_flight)

---@class lupin.LatencyPredictions
---@field slo lupin.SLO the request's objectives
---@field streaming boolean the producer's streamingMode: TPOT counts only when streaming
---@field prefix table<integer, number> prefix-cache match 0..1 by endpoint id, predictions or not
---@field endpoints table<integer, lupin.LatencyPrediction> by endpoint id: only endpoints with a prediction

-- How much of a refused value a message quotes: it becomes a 400 body.
local SHOWN = 40

local function show(v)
  if #v > SHOWN then
    v = v:sub(1, SHOWN) .. "..."
  end
  v = v:gsub('[%c"\\]', function(c)
    return ("\\x%02x"):format(c:byte())
  end)
  return ('"%s"'):format(v)
end

-- A positive finite decimal ("150", "12.5", "2e3"), or nil: no sign but an
-- optional "+", no hexadecimal, no "nan" or "inf" (and nothing that
-- overflows to it).
local function positive(v)
  local s = v:match("^%s*(.-)%s*$")
  local mantissa = s:match("^%+?(%d*%.?%d*)[eE][-+]?%d+$") or s:match("^%+?(%d*%.?%d*)$")
  local n = mantissa and mantissa:find("%d") and tonumber(s)
  if n and n > 0 and n < math.huge then
    return n
  end
  return nil
end

-- One objective: the header's value in ms, the old name's when the new one
-- is absent; nil when both are; nil and a message when the value is bad.
local function objective(headers, name, old)
  local v = headers[name]
  if v == nil then
    name, v = old, headers[old]
    if v == nil then
      return nil
    end
  end
  local n = positive(v)
  if not n then
    return nil, ("%s must be a positive number of milliseconds, got %s"):format(name, show(v))
  end
  return n
end

--- The request's TTFT objective in ms (x-llm-d-slo-ttft-ms, else
--- x-slo-ttft-ms): nil when it sets none; nil and a message naming the
--- header when its value is not a positive number.
---@param headers table<string, string> lower-case names
---@return number? ttft
---@return string? message
function M.ttft(headers)
  return objective(headers, M.TTFT_HEADER, M.OLD_TTFT_HEADER)
end

--- The request's TPOT objective in ms, as M.ttft.
---@param headers table<string, string> lower-case names
---@return number? tpot
---@return string? message
function M.tpot(headers)
  return objective(headers, M.TPOT_HEADER, M.OLD_TPOT_HEADER)
end

--- Both objectives in ms (nil: absent), or nil, nil and the message of the
--- first bad value ("x-llm-d-slo-ttft-ms must be a positive number of
--- milliseconds, got \"abc\"": a 400's body).
---@param headers table<string, string> lower-case names
---@return number? ttft
---@return number? tpot
---@return string? message
function M.parse(headers)
  local ttft, err = M.ttft(headers)
  if err then
    return nil, nil, err
  end
  local tpot
  tpot, err = M.tpot(headers)
  if err then
    return nil, nil, err
  end
  return ttft, tpot
end

--- The predictions published for the request, or nil when no producer ran.
---@param ctx lupin.Ctx
---@return lupin.LatencyPredictions?
function M.predictions(ctx)
  return ctx.shared[M.KEY]
end

return M
