"""voicepipe: a one-process voice-agent inference service."""

import os

__version__ = "0.1.0"

# oneDNN (torch's CPU kernels; the LLM's packed linears) keeps a compiled kernel for every matrix shape it meets, 1024
# of them by default, and the LLM's prefill meets a new shape with every prompt length: over 50 calls a server's
# memory grew by 155 MB (`voicepipe bench soak`; 124 MB with 64). 64 keep the decode shapes compiled, at no cost
# `voicepipe bench llm` could measure. Set here, before torch starts oneDNN (it reads this once); an environment
# variable set by the user wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")
