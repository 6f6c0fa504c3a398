-- Ended requests reused (core/request.c's spares): spec/core/request_reuse.c,
-- built by make with liblupin's C allocations counted, runs lifecycles once
-- warm, requests that reuse one with a longer id, a model or a kept head,
-- and more requests in flight than spares are kept.
local S = require "support"

describe("requests reused after their end", function()
  it("make no C allocation a lifecycle once warm, and each reads its own id and model", function()
    local out = S.program("request-reuse", S.FIXTURES)
    assert.matches("request-reuse: no C allocation a lifecycle once warm, each request reads "
      .. "its own\nrc=0", out, 1, true)
  end)
end)
