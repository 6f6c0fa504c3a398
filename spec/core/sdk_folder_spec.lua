-- The SDK door is a folder: every module directly in lua/lupin/ is what a
-- plugin may require (lupin.testing, the author's kit, and sdk.lua, types
-- only, aside), every module in its subfolders is the runtime's own and
-- refused, and docs/plugins.md names exactly the folder's modules.
local S = require "support"

local function modules(find_args)
  local p = io.popen(("cd %s/lua && find lupin %s -name '*.lua' | sort"):format(S.ROOT, find_args))
  local names = {}
  for path in p:lines() do
    names[#names + 1] = path:gsub("/init%.lua$", ""):gsub("%.lua$", ""):gsub("/", ".")
  end
  p:close()
  return names
end

local ASIDE = { ["lupin.testing"] = true, ["lupin.sdk"] = true }
local function sdk()
  local names = {}
  for _, name in ipairs(modules("-maxdepth 1")) do
    if not ASIDE[name] then
      names[#names + 1] = name
    end
  end
  return names
end

local dir
setup(function()
  dir = S.tmpdir()
end)

-- Loads a plugin whose file requires `name`; returns nil or the error.
local function require_error(name)
  local tname = "req-" .. name:gsub("%.", "-")
  S.write(("%s/%s.lua"):format(dir, tname), ([[
local m = require(%q)
assert(type(m) == "table" or type(m) == "function", "nothing came back")
return { type = %q, score = function() return { 1 } end }
]]):format(name, tname))
  local rt = S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
  local ok, err = rt:load_string(S.json.encode({ plugins = { { type = tname } } }))
  rt:free()
  return not ok and err or nil
end

describe("the SDK folder", function()
  it("lets a plugin require every module directly in lua/lupin/", function()
    local names = sdk()
    assert.truthy(#names >= 9, "the SDK folder was not read")
    for _, name in ipairs(names) do
      assert.is_nil(require_error(name), name)
    end
  end)

  it("refuses every module of the runtime's subfolders, and the test kit", function()
    local inner = modules("-mindepth 2")
    assert.truthy(#inner >= 20, "the subfolders were not read")
    inner[#inner + 1] = "lupin.testing"
    for _, name in ipairs(inner) do
      local err = require_error(name)
      assert.truthy(err, name .. " was reachable from a plugin")
      assert.matches(('require "%s" is not allowed in a plugin'):format(name), err, 1, true)
    end
  end)

  it("holds every module the built-in plugins require", function()
    local allowed = { cjson = true, ["cjson.safe"] = true, ["table.new"] = true,
      ["table.clear"] = true }
    for _, name in ipairs(sdk()) do
      allowed[name] = true
    end
    local p = io.popen(("cd %s && cat plugins/*.lua"):format(S.ROOT))
    local text = p:read("*a")
    p:close()
    local outside = {}
    for name in text:gmatch('require%s*%(?%s*"([^"]+)"') do
      if not allowed[name] then
        outside[#outside + 1] = name
      end
    end
    assert.same({}, outside)
  end)

  it("is the list docs/plugins.md gives authors", function()
    local row
    for line in io.lines(S.ROOT .. "/docs/plugins.md") do
      if line:match("^| `require` |") then
        row = line
      end
    end
    assert.truthy(row, "docs/plugins.md has no `require` row")
    local documented = {}
    for name in row:gmatch("`(lupin%.[%w_.]+)`") do
      documented[#documented + 1] = name
    end
    table.sort(documented)
    assert.same(sdk(), documented)
  end)
end)
