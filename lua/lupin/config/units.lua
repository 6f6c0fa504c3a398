--- lupin.config.units: the units a config's values are written in, read
--- wherever a section takes them (flow control, host sections, plugins):
--- Kubernetes quantities ("1k", "5Gi", 1000) and Go durations ("30s",
--- "1m0s", "500ms", 0).  Each returns nil for a value it does not read.
local M = {}

local QUANTITY = { [""] = 1, k = 1e3, M = 1e6, G = 1e9, T = 1e12, P = 1e15, E = 1e18,
  Ki = 2 ^ 10, Mi = 2 ^ 20, Gi = 2 ^ 30, Ti = 2 ^ 40, Pi = 2 ^ 50, Ei = 2 ^ 60, m = 1e-3 }

--- A Kubernetes resource quantity ("100", "1k", "5Gi", 1000) as a number.
function M.quantity(v)
  if type(v) == "number" then
    return v >= 0 and v or nil
  elseif type(v) ~= "string" then
    return nil
  end
  local num, suffix = v:match("^%+?(%d*%.?%d+)([%a]*)$")
  local mult = num and QUANTITY[suffix]
  if not mult then
    local mant, exp = v:match("^%+?(%d*%.?%d+)[eE]([-+]?%d+)$")
    return mant and tonumber(mant) * 10 ^ tonumber(exp)
  end
  return tonumber(num) * mult
end

local DURATION = { ns = 1e-9, us = 1e-6, ["µs"] = 1e-6, ms = 1e-3, s = 1, m = 60, h = 3600 }

--- A Go duration ("30s", "1m0s", "500ms", "0") in seconds.
function M.duration(v)
  if v == "0" or v == 0 then
    return 0
  elseif type(v) ~= "string" or v == "" then
    return nil
  end
  local total, rest = 0, v
  while rest ~= "" do
    local num, unit, tail = rest:match("^(%d*%.?%d+)([%aµ]+)(.*)$")
    if not num or not DURATION[unit] then
      return nil
    end
    total, rest = total + tonumber(num) * DURATION[unit], tail
  end
  return total
end

return M
