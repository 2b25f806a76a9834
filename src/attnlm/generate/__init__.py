"""Generation: ``SamplingConfig``, logits filters, the decoding loop (decoding-state protocol,
sliding window, lookahead drafts), beam search, text prompts, stop strings and streaming.

Names are loaded on first use so that ``attnlm --help`` does not import torch.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".filters": "FILTERS apply_filters sampling_filters top_k top_p",
        ".loop": "decode generate",
        ".options": "DecodeOptions",
        ".sampling": "SamplingConfig",
        ".beam": "beam_search",
        ".text": "encode_prompt generate_text",
        ".translate": "translate translate_ids",
    },
)
