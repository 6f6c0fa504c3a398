-- llm-d-router's token-producer renders prompts to token IDs; lupin loads it
-- and does nothing (spec/plugins/tokenizer_cases.lua).
require("plugins.tokenizer_cases")(getfenv(1), "token-producer")
