-- CONTRIBUTING.md's commit habit, held from the commit that set it up on:
-- a subject of at most 72 characters, and a body saying why (merges aside).
-- Older history is as it was; a clone without it (shallow) skips the check.
local S = require "support"

local SINCE = "b7a1290" -- the first commit after CI began checking habits

local function git(args)
  local p = io.popen(("git -C %s %s 2>/dev/null"):format(S.ROOT, args))
  local out = p:read("*a")
  p:close()
  return out
end

describe("the commit history", function()
  local known = git("rev-parse --verify --quiet " .. SINCE .. "^{commit}") ~= ""

  it("keeps subjects to 72 characters and gives each change its why", function()
    if not known then
      pending("no history back to " .. SINCE .. " in this clone")
      return
    end
    local bad = {}
    local log = git("log --format=%h%x00%P%x00%s%x00%b%x1e " .. SINCE .. "^..HEAD")
    for entry in log:gmatch("([^\30]+)\30") do
      local hash, parents, subject, body = entry:match("^%s*(%x+)%z([^%z]*)%z([^%z]*)%z(.*)$")
      assert.truthy(hash, "unreadable log entry: " .. entry)
      local merge = parents:find(" ", 1, true) ~= nil
      if #subject > 72 then
        bad[#bad + 1] = ("%s: subject of %d characters: %s"):format(hash, #subject, subject)
      elseif not merge and not body:find("%S") then
        bad[#bad + 1] = ("%s: no body saying why: %s"):format(hash, subject)
      end
    end
    assert.same({}, bad)
  end)
end)
