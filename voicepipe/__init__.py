"""voicepipe: a one-process voice-agent inference service."""

import os

__version__ = "0.1.0"

# oneDNN (torch's CPU kernels; the LLM's packed linears) keeps a compiled kernel for every matrix shape it meets, 1024
# of them by default, and the LLM's prefill meets a new shape with every prompt length: over 50 calls a server's
# memory grew by 155 MB (`voicepipe bench soak`; 124 MB with 64). 64 keep the decode shapes compiled, at no cost
# `voicepipe bench llm` could measure. Set here, before torch starts oneDNN (it reads this once); an environment
# variable set by the user wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")
# libgomp (the OpenMP threads of torch and of the LLM's fused kernels) keeps a thread that waits for the next
# parallel region spinning for 300000 rounds by default, milliseconds. A step's layers are regions with the engine
# thread's Python between them; beside one busy process on two cores, that spin held the core the engine thread
# needed, and one-token steps took 300-470 ms where they take 15. With 10000 rounds the longest took 69 ms, and a
# quiet machine decodes as fast within noise (`voicepipe bench llm`: 181 against 185 tok/s; docs/benchmarks.md).
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
