-- llm-d-router's endpoint-notification-source: it tells the precise prefix
-- plugins which pods come and go, so they subscribe to their KV events.
-- In lupin the pool's endpoints are that list and the host subscribes to
-- each (docs/kv-events.md): the plugin loads so configs port, and does
-- nothing.
---@type lupin.Plugin
return {
  type = "endpoint-notification-source",
  schema = {},
}
