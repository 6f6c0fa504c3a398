-- endpoint-notification-source: llm-d-router's feed of pod changes to the
-- precise plugins.  lupin's pool is that feed, so it loads and does
-- nothing; as a dataLayer source it may name only precise plugins.
local S = require "support"

local function config(extractor)
  return {
    plugins = { { type = "endpoint-notification-source", name = "notes" },
      { type = "precise-prefix-cache-producer", name = "precise" },
      { type = "queue-scorer" }, { type = "max-score-picker" } },
    dataLayer = { sources = { { pluginRef = "notes",
      extractors = { { pluginRef = extractor } } } } },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "queue-scorer" },
      { pluginRef = "max-score-picker" } } } },
  }
end

describe("endpoint-notification-source", function()
  it("loads as a dataLayer source feeding a precise plugin, and scrapes nothing", function()
    local rt = S.loaded(config("precise"))
    finally(function() rt:free() end)
    S.endpoints(rt, 2)
    assert.equal(200, S.lifecycle(rt).status)
    -- the metrics source stays the default one
    assert.equal("/metrics", S.eval(rt, [[return require("lupin.runtime").current.data.path]]))
  end)

  it("refuses an extractor that is not a precise plugin, at its line", function()
    local rt = S.runtime()
    finally(function() rt:free() end)
    local ok, err = rt:load_string(S.json.encode(config("queue-scorer")), "notes.json")
    assert.is_nil(ok)
    assert.matches("^notes%.json:%d+: dataLayer%.sources%[0%]%.extractors%[0%]%.pluginRef", err)
    assert.matches("cannot read endpoint notifications", err, 1, true)
  end)
end)
