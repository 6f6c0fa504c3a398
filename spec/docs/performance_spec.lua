-- docs/performance.md is a reference, not a log: short, and every section
-- that gives a figure names the command that measures it, the date it was
-- measured and a commit.
local support = require "support"

local PATH = support.ROOT .. "/docs/performance.md"
local MAX_LINES = 400

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- A figure: a number followed by a unit.
local UNITS = { "µs", "ms", "ns", "s", "KB", "MB", "GB", "MiB", "B", "%", "×" }

local function has_figure(text)
  for _, unit in ipairs(UNITS) do
    local pat = "%d%s?" .. unit:gsub("%%", "%%%%")
    if unit:match("^%a") then
      pat = pat .. "%f[^%w]"
    end
    if text:match(pat) then
      return true
    end
  end
  return false
end

-- A command in a code span: something that runs a benchmark.
local function has_command(text)
  for span in text:gmatch("`([^`]+)`") do
    if span:match("make ") or span:match("%./build/") or span:match("bash ") then
      return true
    end
  end
  return false
end

local function has_date(text)
  return text:match("%f[%d]20%d%d%-%d%d%-%d%d%f[^%d]") ~= nil
end

-- A commit: 7 to 40 lower-case hex digits standing alone, at least one a-f.
local function has_commit(text)
  for word in text:gmatch("%f[%w][%w]+%f[^%w]") do
    if #word >= 7 and #word <= 40 and word:match("^[0-9a-f]+$") and word:match("[a-f]")
      and word:match("%d") then
      return true
    end
  end
  return false
end

-- Sections by heading (any level), code fences skipped for headings.
local function sections(text)
  local out, current, fence = {}, { title = "(top)", body = {} }, false
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if line:match("^```") then
      fence = not fence
    end
    local title = not fence and line:match("^#+%s+(.-)%s*$")
    if title then
      out[#out + 1] = current
      current = { title = title, body = {} }
    else
      current.body[#current.body + 1] = line
    end
  end
  out[#out + 1] = current
  for _, s in ipairs(out) do
    s.text = table.concat(s.body, "\n")
  end
  return out
end

local function lines(text)
  local n = 0
  for _ in text:gmatch("[^\n]*\n") do
    n = n + 1
  end
  return n
end

describe("docs/performance.md", function()
  local text = read(os.getenv("LUPIN_PERF_DOC") or PATH)

  it("is at most " .. MAX_LINES .. " lines", function()
    local n = lines(text)
    assert(n <= MAX_LINES, ("docs/performance.md has %d lines, the limit is %d"):format(n, MAX_LINES))
  end)

  it("names a command, a date and a commit in every section with a figure", function()
    local bad = {}
    for _, s in ipairs(sections(text)) do
      if has_figure(s.text) then
        local missing = {}
        if not has_command(s.text) then missing[#missing + 1] = "command" end
        if not has_date(s.text) then missing[#missing + 1] = "date" end
        if not has_commit(s.text) then missing[#missing + 1] = "commit" end
        if #missing > 0 then
          bad[#bad + 1] = s.title .. ": no " .. table.concat(missing, ", ")
        end
      end
    end
    assert(#bad == 0, "sections with figures but without:\n  " .. table.concat(bad, "\n  "))
  end)
end)
