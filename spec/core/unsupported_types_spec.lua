-- lua/lupin/config/unsupported.lua: each upstream plugin type lupin refuses
-- on purpose fails at its line with why and what to use instead, never as
-- an "unknown plugin type".  (The GIE-era SLO types are in datalayer_spec.)
local S = require "support"
local unsupported = require "lupin.config.unsupported"

-- type -> the alternative its message must name
local REFUSED = {
  ["burst-prefix-cache-producer"] = "cannot hold a request; use approx-prefix-cache-producer",
  ["mm-embeddings-cache-producer"] = "no index of the media items (images, audio, video) each endpoint has encoded; use"
    .. " prefix-cache-scorer",
  ["mm-embeddings-cache-scorer"] = "no index of the media items (images, audio, video) each endpoint has encoded; use"
    .. " prefix-cache-scorer",
  ["dcgm-data-source"] = "no DCGM exporter; use kv-cache-utilization-scorer and queue-scorer",
  ["dcgm-extractor"] = "no DCGM exporter; use kv-cache-utilization-scorer and queue-scorer",
  ["endpoint-attribute-filter"] = "no extractor-made attributes",
  ["endpoint-attribute-scorer"] = "no extractor-made attributes",
  ["program-aware-fairness"] = "least attained service",
  ["soft-reflective-ceiling-policy"] = "no usage-limit policies",
  ["test-one"] = "upstream's test binaries",
  ["test-two"] = "upstream's test binaries",
  ["test-plugin"] = "upstream's test binaries",
  ["test-picker"] = "upstream's test binaries",
  ["test-scorer"] = "upstream's test binaries",
  ["test-profile-handler"] = "upstream's test binaries",
  ["test-source"] = "upstream's test binaries",
  ["test-extractor"] = "upstream's test binaries",
  ["test-with-dependencies"] = "upstream's test binaries",
  ["test-with-nested-dependencies"] = "upstream's test binaries",
  ["mock-metrics-source"] = "not by any EPP image; use metrics-data-source",
}

-- The built-in plugins only: the spec fixtures' test-picker and test-scorer
-- would load in their place (see the last case).
local function load_error(text)
  local rt = S.runtime({ plugin_dirs = {} })
  local ok, err = rt:load_string(text, "cfg.yaml")
  rt:free()
  assert.is_nil(ok, "the config loaded")
  return err
end

describe("plugin types refused on purpose", function()
  for t, want in pairs(REFUSED) do
    it(t .. ": at its line, why and what to use", function()
      local err = load_error("plugins:\n- type: queue-scorer\n- name: x\n  type: " .. t
        .. "\n  parameters: {a: 1}\n")
      assert.matches(('^cfg.yaml:4: plugins%%[1%%]%%.type: plugin type "%s" is not supported: '):format(
        t:gsub("%p", "%%%0")), err)
      assert.matches(want, err, 1, true)
      assert.matches("; use [%w-]+", err)
      assert.is_nil(err:find("unknown plugin type", 1, true))
    end)
  end

  it("lists nothing lupin runs, and every refusal says what to use", function()
    for t, why in pairs(unsupported.TYPES) do
      local f = io.open(S.ROOT .. "/plugins/" .. t .. ".lua")
      if f then
        f:close()
      end
      assert.is_nil(f, t .. " is refused but plugins/ has it")
      assert.matches("; use ", why, 1, true)
    end
  end)

  it("loads a plugin directory's own file of a refused type's name", function()
    local rt = S.runtime() -- with spec/fixtures/plugins, which has a test-picker
    local ok, err = rt:load_string("plugins:\n- type: test-picker\n", "cfg.yaml")
    rt:free()
    assert(ok, err)
  end)

  it("refuses the plugin even when a flowControl reference names it", function()
    local err = load_error("featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n"
      .. "- type: program-aware-fairness\nflowControl:\n  defaultPriorityBand:\n"
      .. "    fairnessPolicyRef: program-aware-fairness\n")
    assert.matches('cfg.yaml:4: plugins[1].type: plugin type "program-aware-fairness" is not'
      .. " supported: ", err, 1, true)
  end)
end)
