-- Turns a single-profile routing config into its P/D form for the `pd` family
-- of bench/routing/run.sh: the profile is copied into `prefill` and `decode`
-- profiles behind llm-d's prefill and decode filters, run by
-- pd-profile-handler (prefill when at least `threshold` prompt characters are
-- uncached on the decode endpoint) with prefill-header-handler.
--   luajit bench/routing/pd.lua IN.json THRESHOLD > OUT.json
local cjson = require "cjson"
local f = assert(io.open(arg[1]))
local cfg = cjson.decode(f:read("*a"))
f:close()
local refs = cfg.schedulingProfiles[1].plugins
local plugins = cfg.plugins
plugins[#plugins + 1] = { type = "prefill-filter" }
plugins[#plugins + 1] = { type = "decode-filter" }
plugins[#plugins + 1] = { type = "pd-profile-handler",
  parameters = { threshold = tonumber(arg[2]) or 256 } }
plugins[#plugins + 1] = { type = "prefill-header-handler" }
local function profile(name, filter)
  local list = { { pluginRef = filter } }
  for _, r in ipairs(refs) do
    list[#list + 1] = r
  end
  return { name = name, plugins = list }
end
cfg.schedulingProfiles = { profile("prefill", "prefill-filter"), profile("decode", "decode-filter") }
cfg.pluginDirs = { "../plugins" }
io.write(cjson.encode(cfg), "\n")
