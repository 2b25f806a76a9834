"""Translation with any encoder-decoder family (one that defines ``prepare_decoding``): greedy,
sampled (:class:`~attnlm.generate.sampling.SamplingConfig`) or beam search, in batches, from
token ids or from text through a :class:`~attnlm.data.pairs.PairTokenizers`.

The model's :class:`~attnlm.models.base.DecodingSetup` says where decoding starts (its start
token), what it conditions on (the padded sources) and how each step's scores are processed
(banned padding, a forced end token at the length limit); the decoders of
:mod:`attnlm.generate.loop` and :mod:`attnlm.generate.beam` do the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnlm.base.errors import InputError
from attnlm.generate.beam import EARLY_STOPPING, beam_search
from attnlm.generate.loop import decode
from attnlm.generate.options import DecodeOptions
from attnlm.generate.sampling import SamplingConfig, masking, token_limit


def default_max_new_tokens(sources: Sequence[Sequence[int]]) -> int:
    """The length limit used when none is given: twice the longest source plus 10."""
    return 2 * max(len(s) for s in sources) + 10


def translate_ids(
    model: torch.nn.Module,
    sources: Sequence[Sequence[int]],
    *,
    num_beams: int = 1,
    sampling: SamplingConfig | None = None,
    max_new_tokens: int | None = None,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    batch_size: int = 64,
    compile: bool | Any = False,
    vocab_limit: int | None = None,
) -> list[list[int]]:
    """Output ids of each source (start token first, end token last when produced).

    ``num_beams > 1``: beam search (``sampling`` must then be None or greedy); otherwise
    greedy (``sampling=None`` or temperature 0) or sampling. ``max_new_tokens`` defaults to
    :func:`default_max_new_tokens` per batch. ``compile``: greedy and sampled decoding run
    every step after the start token through the compiled step
    (:mod:`attnlm.runtime.compiled`; True, or a
    :class:`~attnlm.runtime.compiled.CompiledStep`), the same tokens; beam search stays
    uncompiled (its rows and their cross-attention grouping change from step to step).
    ``vocab_limit``: ids from there on are never output (a model with more output rows than
    its target tokenizer has ids: :func:`target_limit`).
    """
    if not hasattr(model, "prepare_decoding"):
        raise InputError(f"{type(model).__name__} is not a translation model")
    if not sources:
        return []
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if early_stopping not in EARLY_STOPPING:
        raise InputError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    if num_beams > 1 and sampling is not None and not sampling.greedy:
        raise InputError("beam search does not sample: leave out the temperature or the beams")
    out: list[list[int]] = []
    for i in range(0, len(sources), batch_size):
        chunk = [list(s) for s in sources[i : i + batch_size]]
        n = max_new_tokens or default_max_new_tokens(chunk)
        if num_beams > 1:
            out += beam_search(model, chunk, num_beams, length_penalty, early_stopping,
                               max_new_tokens=n, vocab_limit=vocab_limit)  # fmt: skip
            continue
        setup = model.prepare_decoding(chunk)
        cfg = (sampling or SamplingConfig(temperature=0)).with_(max_new_tokens=n)
        new = decode(
            model,
            setup.prompts,
            sampling=cfg,
            eos_id=setup.eos_id,
            state_batch=setup.state_batch,
            process=masking(setup.process, vocab_limit),
            options=DecodeOptions(compile=compile),
        )
        start = setup.prompts if setup.keep_prompt else [[] for _ in chunk]
        out += [list(p) + row for p, row in zip(start, new)]
    return out


def translate(
    model: torch.nn.Module, tokenizers: Any, texts: Sequence[str], **options: Any
) -> list[str]:
    """Translate source sentences to target text (``tokenizers``: a
    :class:`~attnlm.data.pairs.PairTokenizers`); ``options`` as :func:`translate_ids`."""
    sources = []
    for i, text in enumerate(texts):
        if not tokenizers.tokens(text, "source"):
            raise InputError(f"sentence {i + 1} is empty: nothing to translate")
        sources.append(tokenizers.encode_source(text))
    options.setdefault("vocab_limit", target_limit(model, tokenizers))
    return [tokenizers.decode_target(ids) for ids in translate_ids(model, sources, **options)]


def target_limit(model: Any, tokenizers: Any) -> int | None:
    """The target side's id count (special ids included) where the model's output rows
    outnumber it, else None: ids from there on name no target text and are never output."""
    return token_limit(model, tokenizers.target_ids)
