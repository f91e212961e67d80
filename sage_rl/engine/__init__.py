"""The local sampling engine behind ``TransformersPolicy``: per-sequence KV caches kept between
turns and shared across prompts (``kv``), a native Llama-family forward pass with optional
bfloat16 compute (``decoder``), batched sampling (``sampler``) and continuous batching
(``engine``). docs/LOG.md has the measurements behind each choice.
"""
