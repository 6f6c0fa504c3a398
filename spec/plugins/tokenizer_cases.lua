-- The cases of the two plugin types that stand for llm-d's tokenizers
-- (tokenizer, token-producer): lupin runs no tokenizer (its plugins estimate
-- tokens from characters), so each loads so upstream configs port, takes its
-- parameters without acting on them, logs why once, and does nothing.
local K = require "plugins.kit"
local S = require "support"
local cjson = require "cjson"

local ALL = { modelName = "m", backend = "hf", vllm = { url = "http://x" }, sglang = {}, hf = {},
  ["local"] = { path = "/tok.json" }, tokenizersPoolConfig = { workers = 2 } }

-- env: the spec file's (busted's describe, it and assert live there)
return function(env, T)
  setfenv(1, env)
  local function err_of(params)
    return K.load_error({ cjson.encode({ type = T, parameters = params }) })
  end

  describe(T, function()
    it("takes every upstream parameter, logs that tokens are estimated, and does nothing", function()
      local rt = S.loaded(K.config({ { type = T, parameters = ALL }, { type = "max-score-picker" } },
        { { pluginRef = "max-score-picker" } }))
      local said = false
      for _, l in ipairs(rt:logs()) do
        said = said or l[2]:find(T .. ": accepted, no effect: the precise prefix plugins"
          .. " tokenize through the endpoints", 1, true) ~= nil
      end
      assert.is_true(said)
      assert.same({}, K.instance(rt, T, "self"))
      S.endpoints(rt, 2)
      local picks = K.picks(rt, { path = "/v1/completions", body = '{"model":"m","prompt":"hi"}' })
      assert.equal(1, #picks)
      rt:free()
    end)

    it("has no defaults: what is not given stays unset", function()
      assert.same({}, K.params(S.runtime(), T, {}))
    end)

    it("refuses each parameter of the wrong type, and unknown ones", function()
      assert.matches("parameters.modelName: must be a string", err_of({ modelName = 1 }), 1, true)
      assert.matches("parameters.backend: must be a string", err_of({ backend = {} }), 1, true)
      for _, k in ipairs({ "vllm", "sglang", "hf", "local", "tokenizersPoolConfig" }) do
        assert.matches("parameters." .. k .. ": must be an object", err_of({ [k] = "x" }), 1, true)
      end
      assert.matches('unknown parameter "model"', err_of({ model = "m" }), 1, true)
    end)
  end)
end
