"""Can a llama-server configuration start here: GGUF shapes, the memory model, the checks (server.py is the entry)."""
