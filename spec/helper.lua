-- Loaded by busted before the specs (see .busted): finds the native module and
-- offers the small helpers every core spec uses.
local build = os.getenv("LUPIN_BUILD") or "build"
package.cpath = build .. "/?.so;" .. package.cpath
package.path = "spec/?.lua;" .. package.path
