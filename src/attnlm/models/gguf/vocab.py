"""A tokenizer -> the ``tokenizer.*`` metadata of a GGUF file, as llama.cpp reads it.

Two kinds can be written:

* byte-level BPE (``tokenizer.ggml.model = "gpt2"``): ``tokens`` in GPT-2's byte alphabet (each
  byte a printable character), ``merges`` as ``"a b"`` in priority order, ``token_type`` (1
  normal, 3 control for special tokens, 5 unused for rows of the embedding beyond the
  tokenizer's vocabulary) and ``tokenizer.ggml.pre``, the name of the pre-tokenizer llama.cpp
  applies (``llama-vocab.cpp``), which must split text as the tokenizer's regex does;
* SentencePiece-style BPE from a ``tokenizer.json`` (Llama 2, Mistral, Phi-3, Gemma;
  ``tokenizer.ggml.model = "llama"``): ``tokens`` as they are (``▁`` for a space, ``<0xNN>``
  bytes), ``scores`` made from the merges (llama.cpp merges the adjacent pair whose
  concatenation has the highest score; a token's score is minus the rank of the first merge
  that makes it, so the merges keep their order), ``token_type`` (2 unknown, 6 byte, 3 control
  and 4 user-defined for added tokens), ``add_space_prefix`` from the normalizer's ``Prepend``
  (or a ``Metaspace`` pre-tokenizer's scheme) and ``add_bos_token`` from the post-processor.

==========================================  =============================================
tokenizer                                   ``tokenizer.ggml.pre``
==========================================  =============================================
attnlm byte-level BPE, pattern ``gpt2``     ``gpt-2`` (GPT-2's regex)
Hugging Face ``ByteLevel`` pre-tokenizer    ``gpt-2`` (its built-in regex is GPT-2's)
Hugging Face SentencePiece-style BPE        ``default`` (no regex: llama.cpp's ``llama`` model)
a GGUF file's own tokenizer (any model)     its own keys, copied (``llama`` ones too)
==========================================  =============================================

Other patterns (``cl100k``, a custom regex) have no llama.cpp pre-tokenizer that splits alike
in every case and are refused, as are other tokenizer kinds (char, word, classic BPE,
WordPiece) and SentencePiece-style files whose normalizer or pre-tokenizer llama.cpp cannot
follow, each in one line naming what is refused.
The byte-level kinds do not add BOS or EOS when encoding (``add_bos_token`` /
``add_eos_token`` false), as attnlm's own encoders do not add them.
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


SPACE = "\u2581"  # ▁
UNKNOWN, USER_DEFINED, BYTE = 2, 4, 6
_REPLACE_SPACE = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}


def _space_prefix(doc: dict[str, Any]) -> bool:
    """llama.cpp's ``add_space_prefix`` for a SentencePiece-style ``tokenizer.json``; InputError
    where its normalizer or pre-tokenizer does something llama.cpp's ``llama`` model cannot."""
    norm, pre = doc.get("normalizer"), doc.get("pre_tokenizer")
    steps = (norm or {}).get("normalizers", []) if (norm or {}).get("type") == "Sequence" else [
        norm] if norm else []  # fmt: skip
    prepend = [s for s in steps if s.get("type") == "Prepend"]
    rest = [s for s in steps if s.get("type") != "Prepend"]
    if norm is not None:
        if rest != [_REPLACE_SPACE] or prepend not in ([], [{"type": "Prepend", "prepend": SPACE}]):
            raise InputError(
                "tokenizer: a tokenizer.json normalizer other than Prepend('▁') + Replace(' ', "
                "'▁') cannot be written to GGUF (llama.cpp's SentencePiece model has no other)"
            )
        if pre is None or (pre.get("type") == "Split" and pre.get("pattern") == {"String": " "}):
            return bool(prepend)  # (a split at spaces finds none once they are ▁)
    elif pre is not None and pre.get("type") == "Metaspace" and not pre.get("split", True):
        scheme = pre.get("prepend_scheme") or (
            "always" if pre.get("add_prefix_space", True) else "never")  # fmt: skip
        if pre.get("replacement", SPACE) == SPACE and scheme == "never":
            return False
        # "always" / "first" put no ▁ before a text that starts with a space: llama.cpp does
    raise InputError(
        f"tokenizer: a tokenizer.json pre_tokenizer {(pre or {}).get('type')!r} with this "
        "normalizer cannot be written to GGUF (supported: none, a Split at ' ', or a Metaspace "
        "without split or prefix; llama.cpp puts a space before every text, Metaspace does "
        "not before one that starts with a space)"
    )


def _hf_spm(tok: Any) -> tuple[list[str], list[int], list[float], bool]:
    """tokens, types, scores and ``add_space_prefix`` of a SentencePiece-style tokenizer.json."""
    model = tok.doc["model"]
    if model.get("ignore_merges"):
        raise InputError("tokenizer: a BPE with ignore_merges cannot be written to GGUF")
    prefix = _space_prefix(tok.doc)
    n = tok.vocab_size
    tokens: list[str | None] = [None] * n
    types = [NORMAL] * n
    for text, i in model["vocab"].items():
        tokens[i] = text
        if model.get("byte_fallback") and len(text) == 6 and text.startswith("<0x"):
            types[i] = BYTE
    for t in tok.doc.get("added_tokens") or []:
        tokens[t["id"]] = t["content"]
        types[t["id"]] = CONTROL if t.get("special") else USER_DEFINED
    if model.get("unk_token") in model["vocab"]:
        types[model["vocab"][model["unk_token"]]] = UNKNOWN
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise InputError(f"tokenizer: token id {missing[0]} has no text")
    ids = {t: i for i, t in enumerate(tokens)}
    rank = {}
    for r, m in enumerate(model.get("merges") or []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        rank.setdefault(ids.get(a + b), r)
    lowest = -float(len(rank) + 1)  # a token no merge makes: after every merge
    scores = [-float(rank[i]) if i in rank else lowest for i in range(n)]
    return tokens, types, scores, prefix  # type: ignore[return-value]


def _llama_keys(tok: Any, n_vocab: int, bos_id: int | None, eos_id: int | None
                ) -> dict[str, Any]:  # fmt: skip
    tokens, types, scores, prefix = _hf_spm(tok)
    if len(tokens) > n_vocab:
        raise InputError(f"tokenizer: {len(tokens)} tokens but the model has {n_vocab} rows")
    for i in range(len(tokens), n_vocab):
        tokens.append(f"<|unused_{i}|>")
        types.append(UNUSED)
        scores.append(scores[-1] if scores else 0.0)
    ids = {t: i for i, t in enumerate(tokens)}
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": prefix,
        "tokenizer.ggml.add_bos_token": tok.bos_id is not None,
        "tokenizer.ggml.add_eos_token": False,
    }
    unk = tok.doc["model"].get("unk_token")
    if eos_id is None:
        eos_id = next((ids[t] for t in EOS_NAMES if t in ids), None)
    bos_id = tok.bos_id if tok.bos_id is not None else bos_id
    if bos_id is None:
        bos_id = next((ids[t] for t in BOS_NAMES if t in ids), None)
    named = {"bos": bos_id, "eos": eos_id, "unknown": ids.get(unk) if unk else None}
    meta.update({f"tokenizer.ggml.{k}_token_id": i for k, i in named.items() if i is not None})
    return meta


def metadata(tok: Any, n_vocab: int, bos_id: int | None = None, eos_id: int | None = None,
             chat_template: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The ``tokenizer.*`` keys for ``tok``, its token list padded to the model's ``n_vocab``
    embedding rows (with unused tokens ``<|unused_N|>``); InputError for what cannot be
    written."""
    kind = getattr(tok, "kind", "") or type(tok).__name__
    if kind == "hf-spm":
        meta = _llama_keys(tok, n_vocab, bos_id, eos_id)
    elif kind == "gguf":  # llama.cpp's own keys (byte-level or SentencePiece-style): copied
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
                f"tokenizer kind {kind!r} cannot be written to GGUF: only BPE tokenizers "
                "(attnlm's byte-level bpe, Hugging Face byte-level or SentencePiece-style BPE, "
                "a GGUF file's own) can"
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
