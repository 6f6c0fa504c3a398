-- The EPP's metrics-data-source: where an endpoint's Prometheus page is.  It
-- schedules nothing: the host scrapes `path` on each endpoint (lupin serve
-- every gateway.refreshIntervalMs) and reads it with the names the
-- core-metrics-extractor gives (lupin.datalayer).
local UNSUPPORTED = "lupin serve scrapes model servers over plain HTTP"

---@type lupin.Plugin
return {
  type = "metrics-data-source",
  schema = {
    scheme = { type = "string", default = "http", enum = { "http", "https" },
      description = "the scrape's protocol (http only)" },
    path = { type = "string", default = "/metrics", description = "the page's path" },
    insecureSkipVerify = { type = "boolean", default = true,
      description = "accepted, ignored: there is no TLS" },
    caCertPath = { type = "string", description = "https only: not supported" },
    clientCertPath = { type = "string", description = "https only: not supported" },
    clientKeyPath = { type = "string", description = "https only: not supported" },
    interval = { type = "string",
      description = "accepted, ignored: gateway.refreshIntervalMs sets the scrape period" },
    families = { type = "array", items = "string",
      description = "accepted, ignored: lupin reads only the families it maps anyway" },
  },

  new = function(params, env)
    if params.scheme ~= "http" then
      error(('scheme "%s" is not supported: %s; use "http"'):format(params.scheme, UNSUPPORTED), 0)
    end
    for _, k in ipairs({ "caCertPath", "clientCertPath", "clientKeyPath" }) do
      if params[k] then
        error(("%s is not supported: %s (no TLS); remove it"):format(k, UNSUPPORTED), 0)
      end
    end
    if params.path:sub(1, 1) ~= "/" or params.path:find("[%s%c]") then
      error(("path must be an absolute URL path such as \"/metrics\", got %q"):format(
        params.path), 0)
    end
    if params.interval then
      env.log("warn", "interval %q ignored: gateway.refreshIntervalMs sets the scrape period",
        params.interval)
    end
    return { path = params.path }
  end,
}
