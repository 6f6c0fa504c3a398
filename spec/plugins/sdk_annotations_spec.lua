-- The plugin SDK's LuaLS annotations (lua-language-server is not in Debian, so
-- this spec does its part): every built-in plugin marks its table as a
-- lupin.Plugin, every SDK field a plugin uses is annotated on its class, and
-- every lupin.* type an annotation names is defined.
local support = require "support"

local ROOT = support.ROOT

local function lines_of(path)
  local out = {}
  for line in io.lines(path) do
    out[#out + 1] = line
  end
  return out
end

local function ls(pattern)
  local out = {}
  for f in io.popen("ls " .. pattern):lines() do
    out[#out + 1] = f
  end
  return out
end

-- The classes and aliases of the runtime's modules: ---@class blocks with
-- their ---@field lines, plus the functions and fields assigned to the local
-- a class annotates (`---@class lupin.prefix` over `local M = {}`).
local function sdk()
  local classes, aliases = {}, {}
  for _, file in ipairs(ls(ROOT .. "/lua/lupin/*.lua " .. ROOT .. "/lua/lupin/*/*.lua")) do
    local cur, bound = nil, {}
    for _, line in ipairs(lines_of(file)) do
      local class = line:match("^%-%-%-@class ([%w_.]+)")
      local alias = line:match("^%-%-%-@alias ([%w_.]+)")
      if class then
        cur = class
        classes[class] = classes[class] or {}
      elseif alias then
        aliases[alias] = true
      elseif cur and line:match("^%-%-%-@field [%w_]") then
        classes[cur][line:match("^%-%-%-@field ([%w_]+)")] = true
      elseif cur and line:match("^local [%w_]+ =") then
        bound[line:match("^local ([%w_]+) =")] = cur
        cur = nil
      elseif not line:match("^%-%-%-") then
        cur = nil
      end
      local v, name = line:match("^function ([%w_]+)[.:]([%w_]+)")
      if not v then
        v, name = line:match("^([%w_]+)%.([%w_]+) =")
      end
      if v and bound[v] then
        classes[bound[v]][name] = true
      end
    end
  end
  return classes, aliases
end

local CLASSES, ALIASES = sdk()

local function plugin_files()
  local files = ls(ROOT .. "/plugins/*.lua")
  for _, f in ipairs(ls(ROOT .. "/examples/plugins/*.lua")) do
    files[#files + 1] = f
  end
  return files
end

-- Which class a plugin's expression reads a field of, by how plugins name
-- things: patterns whose capture is the field.
local USES = {
  { "lupin.Ctx", "%f[%w_]ctx%.([%a_]+)" },
  { "lupin.Ctx", "%f[%w_]ctx:([%a_]+)" },
  { "lupin.RequestView", "%f[%w_]request%.([%a_]+)" },
  { "lupin.RequestView", "%f[%w_]req%.([%a_]+)" },
  { "lupin.Endpoint", "%f[%w_]ep%.([%a_]+)" },
  { "lupin.Endpoint", "_ep%.([%a_]+)" },
  { "lupin.Endpoint", "%f[%w_]endpoints%[[^%]]+%]%.([%a_]+)" },
  { "lupin.Endpoint", "%f[%w_]candidates%[[^%]]+%]%.([%a_]+)" },
  { "lupin.Scored", "%f[%w_]scored%.([%a_]+)" },
  { "lupin.Result", "%f[%w_]result%.([%a_]+)" },
  { "lupin.Response", "%f[%w_]response%.([%a_]+)" },
  { "lupin.Env", "%f[%w_]env%.([%a_]+)" },
  { "lupin.prefix", "%f[%w_]prefix%.([%a_]+)" },
  { "lupin.PrefixIndex", "%f[%w_]index:([%a_]+)" },
  { "lupin.Hashes", "%f[%w_]hashes%.([%a_]+)" },
  { "lupin.picker", "%f[%w_]picker%.([%a_]+)" },
}

describe("the plugin SDK's annotations", function()
  it("define the classes plugins use", function()
    for _, use in ipairs(USES) do
      assert.truthy(CLASSES[use[1]], use[1] .. " has no ---@class")
    end
    assert.truthy(CLASSES["lupin.Plugin"])
    assert.truthy(CLASSES["lupin.SchemaField"])
  end)

  it("mark every plugin's table as a lupin.Plugin", function()
    for _, file in ipairs(plugin_files()) do
      local lines = lines_of(file)
      local ok = false
      for i, line in ipairs(lines) do
        if line == "return {" then
          ok = lines[i - 1] == "---@type lupin.Plugin"
        end
      end
      assert.is_true(ok, file .. ": no ---@type lupin.Plugin over its return {")
    end
  end)

  it("annotate every field and method the plugins use", function()
    local missing = {}
    for _, file in ipairs(plugin_files()) do
      local text = table.concat(lines_of(file), "\n")
      text = text:gsub("%-%-[^\n]*", "") -- comments say things, they use nothing
      for _, use in ipairs(USES) do
        for field in text:gmatch(use[2]) do
          if not CLASSES[use[1]][field] then
            missing[#missing + 1] = ("%s: %s.%s"):format(file:match("[^/]+$"), use[1], field)
          end
        end
      end
      -- a method of the plugin table taking ctx is an extension point: a
      -- misspelt one would never be called
      local body = text:match("\nreturn (%b{})")
      for key, params in body:gmatch("\n  ([%a_]+) = function%(([^)]*)%)") do
        if params:match("^[%w_]+, ctx") and not CLASSES["lupin.Plugin"][key] then
          missing[#missing + 1] = ("%s: lupin.Plugin.%s"):format(file:match("[^/]+$"), key)
        end
      end
    end
    assert.same({}, missing)
  end)

  it("annotate every extension point and hook of lupin.points as a lupin.Plugin field", function()
    for _, row in ipairs(require("lupin.generation.points")) do
      assert.truthy(CLASSES["lupin.Plugin"][row.name], row.name)
    end
  end)

  it("name only lupin.* types that are defined", function()
    local files = ls(ROOT .. "/lua/lupin/*.lua " .. ROOT .. "/lua/lupin/*/*.lua")
    for _, f in ipairs(plugin_files()) do
      files[#files + 1] = f
    end
    local undefined = {}
    for _, file in ipairs(files) do
      for _, line in ipairs(lines_of(file)) do
        if line:match("^%s*%-%-%-@") then
          -- types are capitalised (lupin.Endpoint); lower-case names are
          -- modules, and prose mentions them ("from lupin.config.parse")
          for name in line:gmatch("lupin%.[A-Z][%w_]*") do
            local known = CLASSES[name] or ALIASES[name]
            -- the first word after @field is a field name, not a type
            if not known and not line:match("^%s*%-%-%-@field " .. name:gsub("%.", "%%.")) then
              undefined[#undefined + 1] = file:match("[^/]+$") .. ": " .. name
            end
          end
        end
      end
    end
    assert.same({}, undefined)
  end)

  it("come with a .luarc.json that finds the SDK modules", function()
    local cjson = require "cjson"
    local rc = cjson.decode(assert(io.open(ROOT .. "/.luarc.json")):read("*a"))
    assert.equal("LuaJIT", rc["runtime.version"])
    local found = false
    for _, p in ipairs(rc["runtime.path"]) do
      found = found or p == "lua/?.lua"
    end
    assert.is_true(found)
  end)
end)
