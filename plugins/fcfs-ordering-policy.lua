-- The EPP's fcfs-ordering-policy: within a flow, first come, first served
-- (arrival order).  The default ordering of every priority band.  An
-- ordering policy of flow control (docs/flow-control.md): less(a, b) says
-- whether queued item a is served before b.
---@type lupin.Plugin
return {
  type = "fcfs-ordering-policy",
  schema = {},

  less = function(_, a, b)
    return a.seq < b.seq
  end,
}
