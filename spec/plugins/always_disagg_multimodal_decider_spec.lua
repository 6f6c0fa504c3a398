-- always-disagg-multimodal-decider: encode apart for chat requests with
-- media.  Vectors from llm-d/llm-d-router
-- pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler_test.go
-- TestHasMultimodalContent.
local S = require "support"

local function decide(body)
  local rt = S.runtime()
  local v = S.eval(rt, ([[
    local m = require("lupin.generation.loader").load(%q, "always-disagg-multimodal-decider")
    local body = require("cjson").decode(%q)
    return m.disaggregate(m, { request = { body = body.b or false } }, { id = 1 })
  ]]):format(S.ROOT .. "/plugins/always-disagg-multimodal-decider.lua", S.json.encode({ b = body })))
  rt:free()
  return v
end

local function chat(...)
  local parts = { { type = "text", text = "describe this" } }
  for _, t in ipairs({ ... }) do
    parts[#parts + 1] = { type = t }
  end
  return { messages = { { role = "user", content = parts } } }
end

describe("always-disagg-multimodal-decider", function()
  it("says yes for image, video or audio parts (TestHasMultimodalContent)", function()
    assert.is_true(decide(chat("image_url")))
    assert.is_true(decide(chat("video_url")))
    assert.is_true(decide(chat("input_audio")))
    assert.is_true(decide(chat("image_url", "video_url", "input_audio")))
  end)

  it("says no for text only, no body, no chat messages", function()
    assert.is_false(decide(chat()))
    assert.is_false(decide(nil))
    assert.is_false(decide({ prompt = "an image_url" }))
    assert.is_false(decide({ messages = { { role = "user", content = "image_url" } } }))
    assert.is_false(decide({ messages = "not a list" }))
  end)
end)
