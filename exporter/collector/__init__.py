"""Reading vLLM (what the specs call the collector): sources, parsing and window observations."""
