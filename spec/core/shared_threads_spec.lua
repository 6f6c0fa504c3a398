-- Four threads, each with its own runtime on one lupin_shared, adding,
-- moving and removing endpoints and counting requests in and out at once
-- (spec/core/shared_threads.c, built by make): the counters hold exactly
-- what is in flight at every barrier, the ids agree, and all comes back to 0.
local S = require "support"

describe("runtimes on several threads sharing one lupin_shared", function()
  it("agree on ids and count every request in and out exactly", function()
    local out = S.program("shared-threads", "1000")
    assert.matches("shared-threads: 4 threads x 1000 rounds, 40000 requests, ids agree, "
      .. "counters back to 0\nrc=0", out, 1, true)
  end)
end)
