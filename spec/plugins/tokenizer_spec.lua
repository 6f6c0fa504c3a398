-- llm-d's tokenizer plugin turns prompts into token IDs; lupin loads it and
-- does nothing (spec/plugins/tokenizer_cases.lua).
require("plugins.tokenizer_cases")(getfenv(1), "tokenizer")
