-- Every link between the repository's Markdown files resolves in a plain
-- clone: the file exists, and an #anchor names one of its headings.
local support = require "support"

local ROOT = support.ROOT

local function read(path)
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local s = f:read("*a")
  f:close()
  return s
end

local function markdown_files()
  local files = {}
  -- find, not git: a tree unpacked from an archive has no .git (make test-fresh)
  local p = io.popen("cd " .. ROOT .. " && find . -name '*.md' -not -path './build*'"
    .. " -not -path './.git/*' -not -path '*/out/*' | sort")
  for line in p:lines() do
    files[#files + 1] = line:gsub("^%./", "")
  end
  p:close()
  return files
end

-- GitHub's heading anchors: lower case, punctuation dropped, spaces to '-'.
local function anchors(text)
  local set, fence = {}, false
  for line in text:gmatch("[^\n]*") do
    if line:match("^```") then
      fence = not fence
    elseif not fence then
      local title = line:match("^#+%s+(.-)%s*$")
      if title then
        set[title:lower():gsub("[^%w%s%-\128-\255]", ""):gsub("%s", "-")] = true
      end
    end
  end
  return set
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

local function normalize(path)
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." then
      parts[#parts] = nil
    elseif part ~= "." then
      parts[#parts + 1] = part
    end
  end
  return table.concat(parts, "/")
end

local function links(text)
  local out, fence = {}, false
  for line in text:gmatch("[^\n]*") do
    if line:match("^```") then
      fence = not fence
    elseif not fence then
      for target in line:gmatch("%]%(([^)%s]+)%)") do
        out[#out + 1] = target
      end
    end
  end
  return out
end

describe("the documentation's links", function()
  it("name files and headings that exist", function()
    local broken, count = {}, 0
    for _, file in ipairs(markdown_files()) do
      local text = assert(read(ROOT .. "/" .. file))
      for _, target in ipairs(links(text)) do
        if not target:match("^%a[%w+.-]*:") then -- http:, mailto: are not ours
          count = count + 1
          local path, anchor = target:match("^([^#]*)#?(.*)$")
          local resolved = path == "" and file or normalize(dirname(file) .. "/" .. path)
          local body = read(ROOT .. "/" .. resolved)
          if not body and os.execute("test -d " .. ROOT .. "/" .. resolved) ~= 0 then
            broken[#broken + 1] = file .. ": " .. target .. " (no such file)"
          elseif anchor ~= "" and not (body and anchors(body)[anchor]) then
            broken[#broken + 1] = file .. ": " .. target .. " (no such heading)"
          end
        end
      end
    end
    assert.truthy(count > 30, "links found: " .. count)
    assert.same({}, broken)
  end)

  it("the README's set-up lines come first, and it stays short", function()
    local readme = assert(read(ROOT .. "/README.md"))
    local block = readme:match("^# lupin\n\n```sh\n(.-)\n```")
    assert.truthy(block and block:find("make run", 1, true) and block:find("make test", 1, true))
    local _, lines = readme:gsub("\n", "")
    assert.truthy(lines <= 140, "README.md has " .. lines .. " lines: move detail to docs/")
  end)
end)
