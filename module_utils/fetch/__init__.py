"""Fetching a pinned GGUF: resumable, paced, hash-verified downloads (`model.py` is the entry)."""
