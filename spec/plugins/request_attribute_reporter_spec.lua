-- GIE's request-attribute-reporter reports CEL values to Envoy's dynamic
-- metadata; lupin serve has no Envoy, so the plugin checks its attributes
-- at load, says once that they are not reported, and does nothing.
local K = require "plugins.kit"
local S = require "support"
local cjson = require "cjson"

local T = "request-attribute-reporter"

local function err_of(attributes)
  return K.load_error({ cjson.encode({ type = T, parameters = { attributes = attributes } }) })
end

local GOOD = { key = { namespace = "envoy.lb", name = "tokens" },
  expression = "response.usage.total_tokens", condition = "response.code == 200" }

describe(T, function()
  it("attributes: defaults to none", function()
    assert.same({ attributes = {} }, K.params(S.runtime(), T, {}))
  end)

  it("loads well-formed attributes, says they are not reported, and schedules as without it",
    function()
      local rt = S.loaded(K.config({ { type = T, parameters = { attributes = { GOOD,
        { key = { name = "n" }, expression = "1" } } } }, { type = "max-score-picker" } },
        { { pluginRef = "max-score-picker" } }))
      local said = false
      for _, l in ipairs(rt:logs()) do
        said = said or l[2]:find("2 attribute(s) not reported", 1, true) ~= nil
      end
      assert.is_true(said)
      S.endpoints(rt, 1)
      assert.same({ "ep1" }, (K.picks(rt)))
      assert.same({}, K.instance(rt, T, "self"))
      rt:free()
    end)

  it("refuses an attribute without a key name, an expression, or of the wrong types", function()
    local function bad(a, msg)
      local err = err_of({ a })
      assert.matches("^spec%.json:3: plugins%[0%]: plugin \"request%-attribute%-reporter\"", err)
      assert.matches("attributes[0]: " .. msg, err, 1, true)
    end
    bad({ expression = "1" }, "key.name must be a non-empty string")
    bad({ key = { name = "" }, expression = "1" }, "key.name must be a non-empty string")
    bad({ key = { name = "n", namespace = 1 }, expression = "1" }, "key.namespace must be a string")
    bad({ key = { name = "n" } }, "expression must be a non-empty CEL expression")
    bad({ key = { name = "n" }, expression = "  " }, "expression must be a non-empty CEL expression")
    bad({ key = { name = "n" }, expression = "1", condition = true },
      "condition must be a CEL expression")
    assert.matches("parameters.attributes: item 0 must be an object", err_of({ "x" }), 1, true)
    assert.matches("parameters.attributes: must be an array", err_of("x"), 1, true)
    assert.matches('unknown parameter "attribute"', K.load_error({ cjson.encode({ type = T,
      parameters = { attribute = {} } }) }), 1, true)
  end)
end)
