-- llm-d-router's always-disagg-multimodal-decider (disagg-profile-handler's
-- deciders.encode): the encode profile runs for chat requests with an image,
-- video or audio part (image_url, video_url, input_audio), not for text.
local disagg = require "lupin.disagg"

---@type lupin.Plugin
return {
  type = "always-disagg-multimodal-decider",
  schema = {},

  disaggregate = function(_, ctx)
    return disagg.multimodal(ctx.request.body)
  end,
}
