"""The controller's model mirror: fetch once, verify, serve the rigs over HTTP with ranges."""
