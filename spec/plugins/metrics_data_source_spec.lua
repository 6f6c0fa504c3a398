-- The EPP's metrics-data-source: where an endpoint's metrics page is.  It
-- schedules nothing; its one effect is the path the host scrapes
-- (rt:metric_source), and it refuses what lupin cannot do (https, TLS).
local S = require "support"

local T = "metrics-data-source"
local BASE = "plugins:\n- type: queue-scorer\n- type: metrics-data-source\n"

local function load(params)
  local rt = S.runtime()
  local ok, err = rt:load_string(BASE .. (params and "  parameters: " .. params .. "\n" or ""),
    "cfg.yaml")
  return rt, ok, err
end

local function source(params)
  local rt, ok, err = load(params)
  assert(ok, err)
  local m = assert(rt:metric_source("x"))
  local logs = rt:logs()
  rt:free()
  return m, logs
end

local function fails(params)
  local rt, ok, err = load(params)
  rt:free()
  assert.is_nil(ok, "the config loaded")
  assert.matches("^cfg%.yaml:[34]: plugins%[1%]", err)
  return err
end

describe(T, function()
  it("path: the page the host scrapes, /metrics by default", function()
    assert.equal("/metrics", source().path)
    assert.equal("/stats/prom", source("{path: /stats/prom}").path)
  end)

  it("path: refuses one that is not an absolute URL path", function()
    assert.matches('path must be an absolute URL path such as "/metrics", got "metrics"',
      fails("{path: metrics}"), 1, true)
    assert.matches("absolute URL path", fails("{path: '/a b'}"), 1, true)
    assert.matches("parameters.path: must be a string", fails("{path: 7}"), 1, true)
  end)

  it("scheme: http only; https is refused with why, another value by the schema", function()
    assert.equal("/metrics", source("{scheme: http}").path)
    assert.matches('scheme "https" is not supported', fails("{scheme: https}"), 1, true)
    assert.matches('parameters.scheme: must be one of "http", "https", got "ftp"',
      fails("{scheme: ftp}"), 1, true)
  end)

  it("caCertPath, clientCertPath, clientKeyPath: refused (no TLS)", function()
    for _, k in ipairs({ "caCertPath", "clientCertPath", "clientKeyPath" }) do
      assert.matches(k .. " is not supported", fails("{" .. k .. ": /x.pem}"), 1, true)
    end
  end)

  it("insecureSkipVerify, families: accepted and ignored, type-checked", function()
    assert.equal("/metrics", source("{insecureSkipVerify: false, families: [a, b]}").path)
    assert.matches("parameters.insecureSkipVerify: must be a boolean",
      fails("{insecureSkipVerify: 'no'}"), 1, true)
    assert.matches("parameters.families: item 0 must be a string", fails("{families: [1]}"), 1,
      true)
  end)

  it("interval: accepted with a warning, the scrape period is the gateway's", function()
    local _, logs = source("{interval: 5s}")
    local warned = false
    for _, l in ipairs(logs) do
      warned = warned or l[2]:find('interval "5s" ignored: gateway.refreshIntervalMs', 1, true) ~= nil
    end
    assert.is_true(warned)
    assert.matches("parameters.interval: must be a string", fails("{interval: 5}"), 1, true)
  end)

  it("refuses unknown parameters", function()
    assert.matches('unknown parameter "timeout"', fails("{timeout: 1}"), 1, true)
  end)
end)
