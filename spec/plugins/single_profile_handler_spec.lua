local K = require "plugins.kit"
local S = require "support"

local T = "single-profile-handler"

local function stats(rt, plugin)
  local out = {}
  for _, st in ipairs(rt:plugin_stats()) do
    if st.plugin == plugin then
      out[st.point] = st.calls
    end
  end
  return out
end

describe(T, function()
  it("runs the one profile once and makes it the primary", function()
    local rt = S.loaded({
      plugins = { { type = T }, { type = "queue-scorer" } },
      schedulingProfiles = { { name = "only", plugins = { { pluginRef = "queue-scorer" } } } },
    })
    S.endpoints(rt, 2, { { waiting_queue_size = 3 }, { waiting_queue_size = 1 } })
    assert.same({ "ep2" }, (K.picks(rt)))
    -- asked twice: once to run "only", once more to learn there is nothing left
    assert.same({ pick_profiles = 2, process_results = 1 }, stats(rt, T))
    assert.same({ score = 1 }, stats(rt, "queue-scorer"))
    assert.same({}, S.eval(rt, [[
      local m = require("lupin.generation.loader").load("]] .. S.ROOT .. [[/plugins/single-profile-handler.lua",
        "single-profile-handler")
      local again = m.pick_profiles(nil, nil, { only = {} }, { only = false })
      return #again == 0 and {} or again]]))
  end)

  it("is the default handler when the config names none", function()
    local rt = S.loaded(K.config({ { type = "queue-scorer" } }, { { pluginRef = "queue-scorer" } }))
    S.endpoints(rt, 1)
    local _, res = K.picks(rt)
    assert.equal(200, res.status)
    assert.same({ pick_profiles = 2, process_results = 1 }, stats(rt, T))
  end)

  it("fails the request when its only profile finds no endpoint", function()
    local rt = S.loaded({
      plugins = { { type = T }, { type = "prefill-filter" } },
      schedulingProfiles = { { name = "only", plugins = { { pluginRef = "prefill-filter" } } } },
    })
    S.endpoints(rt, 1)
    local _, res = K.picks(rt)
    assert.equal(503, res.status)
    assert.equal("prefill-filter", res.plugin)
  end)

  it("refuses a config with two profiles, and parameters", function()
    local rt = S.runtime()
    local ok, err = rt:load_string([[{
  "plugins": [{"type": "single-profile-handler"}, {"type": "queue-scorer"}],
  "schedulingProfiles": [
    {"name": "a", "plugins": [{"pluginRef": "queue-scorer"}]},
    {"name": "b", "plugins": [{"pluginRef": "queue-scorer"}]}
  ]
}]], "spec.json")
    assert.is_nil(ok)
    assert.matches("^spec%.json:2: plugins%[0%]: single%-profile%-handler runs one profile but 2 are"
      .. " defined", err)
    err = K.load_error({ '{"type": "single-profile-handler", "parameters": {"profile": "a"}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.profile: unknown parameter", err)
  end)
end)
