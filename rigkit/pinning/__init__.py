"""Pinning models: the Hub API client and the pin of each catalog entry's exact file."""
