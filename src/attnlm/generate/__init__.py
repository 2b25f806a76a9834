"""Generation: ``SamplingConfig``, logits filters, the decoding loop (decoding-state protocol,
sliding window, lookahead drafts), beam search, text prompts, stop strings and streaming.

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
    "SamplingConfig": "attnlm.generate.sampling",
    "beam_search": "attnlm.generate.beam",
    "encode_prompt": "attnlm.generate.text",
    "generate_text": "attnlm.generate.text",
    "translate": "attnlm.generate.translate",
    "translate_ids": "attnlm.generate.translate",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
