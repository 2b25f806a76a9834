"""A tokenizer -> the ``tokenizer.*`` metadata of a GGUF file, as llama.cpp reads it.

Only byte-level BPE can be written (``tokenizer.ggml.model = "gpt2"``): ``tokens`` in GPT-2's
byte alphabet (each byte a printable character), ``merges`` as ``"a b"`` in priority order,
``token_type`` (1 normal, 3 control for special tokens, 5 unused for rows of the embedding
beyond the tokenizer's vocabulary) and ``tokenizer.ggml.pre``, the name of the pre-tokenizer
llama.cpp applies (``llama-vocab.cpp``), which must split text as the tokenizer's regex does:

==========================================  =============================================
tokenizer                                   ``tokenizer.ggml.pre``
==========================================  =============================================
attnlm byte-level BPE, pattern ``gpt2``     ``gpt-2`` (GPT-2's regex)
Hugging Face ``ByteLevel`` pre-tokenizer    ``gpt-2`` (its built-in regex is GPT-2's)
a GGUF file's own tokenizer (any model)     its own keys, copied (``llama`` ones too)
==========================================  =============================================

Other patterns (``cl100k``, a custom regex) have no llama.cpp pre-tokenizer that splits alike
in every case and are refused, as are other tokenizer kinds (char, word, classic BPE,
WordPiece; SentencePiece-style vocabularies other than a GGUF file's own), each in one line
naming the kind.
BOS and EOS are not added when encoding (``add_bos_token`` / ``add_eos_token`` false), as
attnlm's own encoders do not add them.
"""

from __future__ import annotations

from typing import Any

from attnlm.base.errors import InputError

NORMAL, CONTROL, UNUSED = 1, 3, 5
#: special-token names taken as BOS / EOS when the model config does not say
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")
BOS_NAMES = ("<|startoftext|>", "<s>", "<|begin_of_text|>", "<bos>")


def _byte_chars(data: bytes) -> str:
    from attnlm.tokenizers.hf_bpe import BYTE_TO_CHAR

    return "".join(BYTE_TO_CHAR[b] for b in data)


def _attnlm_bpe(tok: Any) -> tuple[list[str], list[int], list[str], str]:
    if tok.pattern_name != "gpt2":
        what = tok.pattern_name or f"custom regex {tok.pattern!r}"
        raise InputError(
            f"tokenizer: byte-level BPE with pre-tokenization pattern {what} has no llama.cpp "
            "pre-tokenizer that splits alike (supported: gpt2)"
        )
    n = tok.vocab_size
    tokens: list[str | None] = [None] * n
    types = [NORMAL] * n
    for data, i in tok.ranks.items():
        tokens[i] = _byte_chars(data)
    for text, i in tok.special_tokens.items():
        tokens[i], types[i] = text, CONTROL
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise InputError(f"tokenizer: token id {missing[0]} has no text")
    merges = [f"{_byte_chars(a)} {_byte_chars(b)}" for a, b in tok.merges]
    return tokens, types, merges, "gpt-2"  # type: ignore[return-value]


def _hf_bpe(tok: Any) -> tuple[list[str], list[int], list[str], str]:
    doc = tok.doc
    pre = doc.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        raise InputError(
            f"tokenizer: Hugging Face pre_tokenizer {pre.get('type')!r} is not one llama.cpp "
            "names (supported: a single ByteLevel step, GPT-2's regex)"
        )
    if doc.get("normalizer"):
        raise InputError("tokenizer: a tokenizer.json normalizer cannot be written to GGUF")
    model = doc["model"]
    n = tok.vocab_size
    tokens: list[str | None] = [None] * n
    types = [NORMAL] * n
    for text, i in model["vocab"].items():
        tokens[i] = text
    for t in doc.get("added_tokens") or []:
        tokens[t["id"]] = t["content"]
        types[t["id"]] = CONTROL if t.get("special") else 4  # 4: user-defined
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise InputError(f"tokenizer: token id {missing[0]} has no text")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return tokens, types, merges, "gpt-2"  # type: ignore[return-value]


def metadata(tok: Any, n_vocab: int, bos_id: int | None = None, eos_id: int | None = None,
             chat_template: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The ``tokenizer.*`` keys for ``tok``, its token list padded to the model's ``n_vocab``
    embedding rows (with unused tokens ``<|unused_N|>``); InputError for what cannot be
    written."""
    kind = getattr(tok, "kind", "") or type(tok).__name__
    if kind == "gguf":  # llama.cpp's own keys (byte-level or SentencePiece-style): copied
        meta = {k: v for k, v in tok.metadata.items() if k != "tokenizer.chat_template"}
        if len(meta["tokenizer.ggml.tokens"]) != n_vocab:
            raise InputError(
                f"tokenizer: {len(meta['tokenizer.ggml.tokens'])} tokens for {n_vocab} "
                "embedding rows"
            )
    else:
        if kind == "bpe":
            tokens, types, merges, pre = _attnlm_bpe(tok)
        elif kind == "hf-bpe":
            tokens, types, merges, pre = _hf_bpe(tok)
        else:
            raise InputError(
                f"tokenizer kind {kind!r} cannot be written to GGUF: only byte-level BPE "
                "tokenizers (attnlm's bpe, Hugging Face byte-level BPE, GGUF gpt2) can"
            )
        if len(tokens) > n_vocab:
            raise InputError(
                f"tokenizer: {len(tokens)} tokens but the model has {n_vocab} embedding rows"
            )
        for i in range(len(tokens), n_vocab):
            tokens.append(f"<|unused_{i}|>")
            types.append(UNUSED)
        ids = {t: i for i, t in enumerate(tokens)}
        bos_id = bos_id if bos_id is not None else next(
            (ids[t] for t in BOS_NAMES if t in ids and types[ids[t]] == CONTROL), None)  # fmt: skip
        eos_id = eos_id if eos_id is not None else next(
            (ids[t] for t in EOS_NAMES if t in ids and types[ids[t]] == CONTROL), None)  # fmt: skip
        meta = {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.add_bos_token": False,
            "tokenizer.ggml.add_eos_token": False,
        }
        if bos_id is not None:
            meta["tokenizer.ggml.bos_token_id"] = bos_id
        if eos_id is not None:
            meta["tokenizer.ggml.eos_token_id"] = eos_id
    if chat_template:
        meta["tokenizer.chat_template"] = chat_template
    return meta
