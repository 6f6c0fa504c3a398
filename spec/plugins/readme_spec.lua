-- plugins/README.md against the plugins: each built-in plugin has its own
-- section, whose parameter table is what plugins/tools/doc.lua makes of its
-- schema (`make plugin-docs`); and each has its own spec file.
local S = require "support"

local ROOT = S.ROOT

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then
    f:close()
  end
  return f ~= nil
end

local function plugin_types()
  local list = {}
  local p = io.popen("ls " .. ROOT .. "/plugins/*.lua")
  for line in p:lines() do
    list[#list + 1] = line:match("([^/]+)%.lua$")
  end
  p:close()
  assert(#list > 40, "plugins found: " .. #list)
  return list
end

-- Runs the generator; returns its exit status and what it printed.  A plain
-- luajit, without the sanitizers a make test-asan run preloads (lua-cjson's
-- buffers live until exit, which LeakSanitizer would report).
local function doc(args)
  local p = io.popen(("cd %s && env -u LD_PRELOAD LUA_PATH='lua/?.lua;lua/?/init.lua;;' luajit plugins/tools/doc.lua"
    .. " %s 2>&1; echo \"exit=$?\""):format(ROOT, args))
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("exit=(%d+)%s*$")), out
end

local function set(list)
  local s = {}
  for _, v in ipairs(list) do
    s[v] = true
  end
  return s
end

local function replace_once(text, old, new)
  local i, j = text:find(old, 1, true)
  assert(i, "not in the README: " .. old)
  assert(not text:find(old, j + 1, true), "twice in the README: " .. old)
  return text:sub(1, i - 1) .. new .. text:sub(j + 1)
end

describe("plugins/README.md", function()
  local README = read(ROOT .. "/plugins/README.md")
  local TYPES = plugin_types()

  it("has the parameter tables the schemas make (else: make plugin-docs)", function()
    local status, out = doc("--check")
    assert.equal(0, status, out)
    assert.matches("the parameter tables of " .. #TYPES .. " plugins match", out, 1, true)
  end)

  it("has a ### `type` section and a params block for every plugin, in that section", function()
    for _, t in ipairs(TYPES) do
      local at = README:find("\n### `" .. t .. "`\n", 1, true)
      assert.truthy(at, t .. ": no ### `" .. t .. "` heading")
      local marker = README:find("<!-- params:" .. t .. " -->\n", 1, true)
      assert.truthy(marker, t .. ": no <!-- params:" .. t .. " --> marker")
      local next_heading = README:find("\n##", at + 1, true) or #README
      assert.truthy(marker > at and marker < next_heading,
        t .. ": its params block is not under its heading")
    end
  end)

  it("has no section or params block for a plugin that does not exist", function()
    local known = set(TYPES)
    for name in README:gmatch("\n### `([^`\n]+)`") do
      assert.truthy(known[name], "### `" .. name .. "`: no plugins/" .. name .. ".lua")
    end
    for name in README:gmatch("\n<!%-%- params:(%S+) %-%->\n") do
      assert.truthy(known[name], "params:" .. name .. ": no plugins/" .. name .. ".lua")
    end
  end)

  describe("the check fails, naming the plugin, on a README", function()
    local tmp
    before_each(function()
      tmp = os.tmpname()
    end)
    after_each(function()
      os.remove(tmp)
    end)

    local function check(text)
      write(tmp, text)
      return doc("--check --readme " .. tmp)
    end

    it("whose table differs from the schema", function()
      local status, out = check(replace_once(README,
        "| `threshold` | integer | `128` | ≥ 1;", "| `threshold` | integer | `64` | ≥ 1;"))
      assert.equal(1, status, out)
      assert.matches("load-aware-scorer: the parameter table differs from its schema", out, 1, true)
      -- and writing puts the schema's table back: the README as committed
      status, out = doc("--readme " .. tmp)
      assert.equal(0, status, out)
      assert.equal(README, read(tmp))
    end)

    it("that lacks a plugin's params block or heading", function()
      local status, out = check((README:gsub("<!%-%- params:queue%-scorer %-%->\n.-<!%-%- /params %-%->\n",
        "")))
      assert.equal(1, status, out)
      assert.matches("queue-scorer: no <!-- params:queue-scorer -->", out, 1, true)
      status, out = check(replace_once(README, "### `tokenizer`\n", "### The tokenizer\n"))
      assert.equal(1, status, out)
      assert.matches("tokenizer: no ### `tokenizer` heading", out, 1, true)
    end)

    it("with a section or a block for a plugin that does not exist", function()
      local status, out = check(README .. "\n### `no-such-plugin`\n\n<!-- params:no-such-plugin -->\n"
        .. "<!-- /params -->\n")
      assert.equal(1, status, out)
      assert.matches("heading ### `no-such-plugin`: no plugins/no-such-plugin.lua", out, 1, true)
      assert.matches("marker params:no-such-plugin: no plugins/no-such-plugin.lua", out, 1, true)
    end)
  end)
end)

describe("every built-in plugin", function()
  it("has its spec, spec/plugins/<type with '-' → '_'>_spec.lua", function()
    local missing = {}
    for _, t in ipairs(plugin_types()) do
      local spec = "spec/plugins/" .. t:gsub("%-", "_") .. "_spec.lua"
      if not exists(ROOT .. "/" .. spec) then
        missing[#missing + 1] = spec
      end
    end
    assert.same({}, missing)
  end)
end)
