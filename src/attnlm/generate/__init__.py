"""Generation: logits filters, the decoding loop (KV cache, sliding window, lookahead drafts),
text prompts, stop strings and streaming.

Names are loaded on first use so that ``attnlm --help`` does not import torch.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

_EXPORTS = {
    "FILTERS": "attnlm.generate.filters",
    "apply_filters": "attnlm.generate.filters",
    "sampling_filters": "attnlm.generate.filters",
    "top_k": "attnlm.generate.filters",
    "top_p": "attnlm.generate.filters",
    "decode": "attnlm.generate.loop",
    "generate": "attnlm.generate.loop",
    "encode_prompt": "attnlm.generate.text",
    "generate_text": "attnlm.generate.text",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
