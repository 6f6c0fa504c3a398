-- Generates plugins/README.md's parameter tables from the plugins' schemas,
-- so the documentation cannot drift from what a config is checked against.
-- Each plugin's section holds
--     <!-- params:<type> -->
--     (the table, generated)
--     <!-- /params -->
-- and this script rewrites what is between the two lines (`make plugin-docs`).
--
--     luajit plugins/tools/doc.lua [--check] [--readme FILE] [--plugins DIR]
--
-- --check rewrites nothing: it exits 1 and names each plugin whose table
-- differs, lacks its marker or its `### \`type\`` heading, and each marker or
-- heading naming no plugin.  LUA_PATH must reach the repository's lua/.
-- A plugin file is loaded with plain loadfile: `require` gives the SDK
-- module when it loads outside a runtime, else an inert stand-in (only the
-- returned table's `type` and `schema` are read; nothing is called).
local cjson = require "cjson"
local schema_check = require("lupin.schema").check

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local opts = { check = false, readme = nil,
  plugins = here:match("^(.*)/tools$") or (here == "tools" and ".") or here .. "/.." }
do
  local i = 1
  while arg and arg[i] do
    local a = arg[i]
    if a == "--check" then
      opts.check = true
    elseif a == "--readme" or a == "--plugins" then
      opts[a:sub(3)] = assert(arg[i + 1], a .. " needs a path")
      i = i + 1
    else
      io.stderr:write("usage: luajit plugins/tools/doc.lua [--check] [--readme FILE]"
        .. " [--plugins DIR]\n")
      os.exit(2)
    end
    i = i + 1
  end
  opts.readme = opts.readme or opts.plugins .. "/README.md"
end

-- An inert module: any field is a function returning another inert value.
local function inert()
  local t = {}
  return setmetatable(t, { __index = function() return inert end, __call = inert })
end

local function shim(name)
  local ok, mod = pcall(require, name)
  if ok then
    return mod
  end
  return inert()
end

local function load_plugin(path)
  local chunk, err = loadfile(path)
  if not chunk then
    error(err, 0)
  end
  setfenv(chunk, setmetatable({ require = shim }, { __index = _G }))
  local ok, p = pcall(chunk)
  if not ok then
    error(path .. ": " .. tostring(p), 0)
  end
  if type(p) ~= "table" or type(p.type) ~= "string" then
    error(path .. ": returns no plugin table with a type", 0)
  end
  local good, why = schema_check(p.schema or {})
  if not good then
    error(path .. ": " .. why, 0)
  end
  return p
end

local function plugin_files(dir)
  local list = {}
  local ls = io.popen("ls " .. dir .. "/*.lua 2>/dev/null")
  for line in ls:lines() do
    list[#list + 1] = line
  end
  ls:close()
  table.sort(list)
  return list
end

local function show(v, ftype)
  if v == nil then
    return ""
  elseif type(v) == "string" then
    return v == "" and '`""`' or "`" .. v .. "`"
  elseif type(v) == "table" then
    if next(v) == nil then
      return ftype == "array" and "`[]`" or "`{}`"
    end
    return "`" .. cjson.encode(v) .. "`"
  end
  return "`" .. tostring(v) .. "`"
end

local function bounds(f)
  local parts = {}
  if f.enum then
    local opts_ = {}
    for i, e in ipairs(f.enum) do
      opts_[i] = show(e)
    end
    parts[#parts + 1] = "one of " .. table.concat(opts_, ", ")
  end
  if f.above then
    parts[#parts + 1] = ("> %s%s"):format(f.above, f.max and (", ≤ %s"):format(f.max) or "")
  elseif f.min and f.max then
    parts[#parts + 1] = ("%s – %s"):format(f.min, f.max)
  elseif f.min then
    parts[#parts + 1] = ("≥ %s"):format(f.min)
  elseif f.max then
    parts[#parts + 1] = ("≤ %s"):format(f.max)
  end
  if f.fallback ~= nil then
    parts[#parts + 1] = ("below: %s, with a warning"):format(show(f.fallback))
  end
  return table.concat(parts, "; ")
end

local function cell(s)
  return (s:gsub("|", "\\|"):gsub("\n", " "))
end

--- The table of one plugin's parameters, as Markdown lines (no markers).
local function render(p)
  local names = {}
  for k in pairs(p.schema or {}) do
    names[#names + 1] = k
  end
  table.sort(names)
  if #names == 0 then
    return "Parameters: none."
  end
  local out = { "| parameter | type | default | bounds | description |",
    "|---|---|---|---|---|" }
  for _, name in ipairs(names) do
    local f = p.schema[name]
    local t = f.type .. (f.items and " of " .. f.items .. "s" or "")
    out[#out + 1] = ("| `%s` | %s | %s | %s | %s |"):format(name, t,
      f.required and "required" or show(f.default, f.type), cell(bounds(f)),
      cell(f.description or ""))
  end
  return table.concat(out, "\n")
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local plugins, order = {}, {}
for _, path in ipairs(plugin_files(opts.plugins)) do
  local p = load_plugin(path)
  local want = path:match("([^/]+)%.lua$")
  if p.type ~= want then
    error(("%s: its type is %q, not its file's name"):format(path, p.type), 0)
  end
  plugins[p.type] = p
  order[#order + 1] = p.type
end

local text = read(opts.readme)
local problems, seen = {}, {}

-- the headings: one `### \`type\`` per plugin, none for a type that is not one
for name in text:gmatch("\n### `([^`\n]+)`[ \t]*\n") do
  if not plugins[name] then
    problems[#problems + 1] = ("heading ### `%s`: no plugins/%s.lua"):format(name, name)
  end
  seen[name] = true
end
for _, t in ipairs(order) do
  if not seen[t] then
    problems[#problems + 1] = ("%s: no ### `%s` heading"):format(t, t)
  end
end

-- the blocks: replaced (or compared) one by one
local found = {}
local new = text:gsub("(<!%-%- params:([%w%-_%.]+) %-%->\n)(.-)(<!%-%- /params %-%->)",
  function(open, name, body, close)
    local p = plugins[name]
    if not p then
      problems[#problems + 1] = ("marker params:%s: no plugins/%s.lua"):format(name, name)
      return nil
    end
    if found[name] then
      problems[#problems + 1] = ("%s: two params markers"):format(name)
    end
    found[name] = true
    local want = render(p) .. "\n"
    if body ~= want then
      problems[#problems + 1] = ("%s: the parameter table differs from its schema"):format(name)
    end
    return open .. want .. close
  end)
for _, t in ipairs(order) do
  if not found[t] then
    problems[#problems + 1] = ("%s: no <!-- params:%s --> ... <!-- /params --> block"):format(t, t)
  end
end

if opts.check then
  if #problems > 0 then
    io.stderr:write(opts.readme .. ": out of date (make plugin-docs):\n  "
      .. table.concat(problems, "\n  ") .. "\n")
    os.exit(1)
  end
  io.write(opts.readme .. ": the parameter tables of ", #order, " plugins match their schemas\n")
  os.exit(0)
end

if new ~= text then
  local f = assert(io.open(opts.readme, "wb"))
  f:write(new)
  f:close()
end
-- what the tables cannot fix: a missing heading or marker, an unknown one
local left = {}
for _, msg in ipairs(problems) do
  if not msg:find("differs", 1, true) then
    left[#left + 1] = msg
  end
end
if #left > 0 then
  io.stderr:write(opts.readme .. ":\n  " .. table.concat(left, "\n  ") .. "\n")
  os.exit(1)
end
io.write(opts.readme .. ": ", #order, " parameter tables written\n")
