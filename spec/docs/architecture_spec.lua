-- docs/architecture.md's map ("Where things are") names every source file
-- of the tree, and only files that exist: a file added without its row, or
-- a row left behind by a move, fails here.  In a row's first cell a
-- backticked name without a folder is in the folder of the path before it
-- (`core/shared.c`, `prefix_shared.c`).
local S = require "support"

local SOURCES = "core host gateway cli nginx lua -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.lua'"

local function sources()
  local p = io.popen(("cd %s && find %s | sort"):format(S.ROOT, SOURCES))
  local list = {}
  for path in p:lines() do
    list[#list + 1] = path
  end
  p:close()
  return list
end

--- The paths the map's rows name, and the names that resolve to nothing.
local function mapped(text)
  local paths = {}
  for line in text:gmatch("[^\n]+") do
    local cell = line:match("^| ([^|]+) |")
    if cell then
      local dir
      for name in cell:gmatch("`([^`]+)`") do
        name = name:gsub(" .*$", "") -- "`host/lupin_host.h` (`liblupin-host.a`)"
        if name:find("/", 1, true) then
          dir = name:match("^(.*/)") or ""
          paths[#paths + 1] = name
        elseif dir and (name:match("%.[ch]$") or name:match("%.cpp$") or name:match("%.lua$")) then
          paths[#paths + 1] = dir .. name
        end
      end
    end
  end
  return paths
end

describe("docs/architecture.md's map", function()
  local f = assert(io.open(S.ROOT .. "/docs/architecture.md"))
  local text = f:read("*a")
  f:close()

  it("names every source file", function()
    local named = {}
    for _, p in ipairs(mapped(text)) do
      named[p] = true
    end
    local missing = {}
    for _, p in ipairs(sources()) do
      if not named[p] then
        missing[#missing + 1] = p
      end
    end
    assert.same({}, missing)
  end)

  it("names only files and folders that exist", function()
    local stale = {}
    for _, p in ipairs(mapped(text)) do
      local h = io.open(S.ROOT .. "/" .. p)
      if h then
        h:close()
      else
        stale[#stale + 1] = p
      end
    end
    assert.same({}, stale)
  end)
end)
