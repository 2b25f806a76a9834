"""Generation: logits filters, the decoding loop (KV cache, sliding window), text and streaming."""

from attnlm.generate.filters import FILTERS, apply_filters, sampling_filters, top_k, top_p
from attnlm.generate.loop import decode, generate
from attnlm.generate.text import encode_prompt, generate_text

__all__ = [
    "FILTERS",
    "apply_filters",
    "decode",
    "encode_prompt",
    "generate",
    "generate_text",
    "sampling_filters",
    "top_k",
    "top_p",
]
