-- luacheck config: LuaJIT, busted specs, and one fixture that is broken on purpose.
std = "luajit"
max_line_length = 120
files["spec"] = { std = "+busted" }
exclude_files = { "spec/fixtures/plugins/test-broken-syntax.lua" }
