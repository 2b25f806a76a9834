"""A GGUF file's vocabulary as a Hugging Face ``tokenizer.json`` document
(:func:`gguf_document`), for :func:`attnlm.tokenizers.hf_export.hf_tokenizer`.

* byte-level BPE (``tokenizer.ggml.model = "gpt2"``, any ``tokenizer.ggml.pre`` attnlm reads):
  a ``BPE`` model holding every token, the merges as ``[left, right]`` pairs (a GGUF merge cut
  as llama.cpp cuts it), ``ignore_merges`` for Llama 3's pre-tokenizers; the pre-tokenizer as a
  ``Sequence`` of one ``Split`` (``Isolated``) per llama.cpp regex followed by ``ByteLevel``
  without its own regex (:func:`attnlm.tokenizers.gguf.hf_pre_tokenizer`), except GPT-2's: the
  one ``ByteLevel`` step with its own regex, which is GPT-2's (the form GPT-2's file has); a
  ``ByteLevel`` decoder.
* SentencePiece-style (``tokenizer.ggml.model = "llama"``), as ``transformers``' converter
  writes Llama's and Gemma's files: a ``BPE`` model with ``byte_fallback`` (``<0xNN>``
  tokens), the unknown token, and merges made from the scores (every pair of tokens whose
  concatenation is a token; the higher that token's score, the earlier the merge); a
  normalizer that puts ``▁`` in front (``add_space_prefix``) and turns spaces into ``▁``; a
  decoder that undoes it (``▁`` -> space, bytes, one leading space off).
* control, user-defined and unknown tokens (with llama.cpp's corrections by name) as added
  tokens, cut out of the text before the model sees it; control and unknown ones ``special``
  (left out by ``skip_special_tokens``); BOS / EOS added by a ``TemplateProcessing``
  post-processor when the file's ``add_bos_token`` / ``add_eos_token`` say so.

Not exact: ``tokenizers`` merges by the rank of a pair, llama.cpp's SentencePiece-style
tokenizer by the score of the merged token, leftmost first; the two differ when tokens of one
score compete for a symbol, or when a token is made of characters that are not tokens
themselves (``tokenizers`` spells such a character in bytes first).
"""

from __future__ import annotations

from typing import Any

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
ADDED = (CONTROL, USER_DEFINED, UNKNOWN)  # cut out of text before the model sees it
SPECIAL = (CONTROL, UNKNOWN)  # left out by skip_special_tokens
SPACE = "\u2581"  # ▁, SentencePiece's visible space


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece scores as BPE merges: each way of cutting a token in two tokens, ordered
    by the token's score (highest first), then its id, then the left part's length."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []
    for i, t in enumerate(tokens):
        for cut in range(1, len(t)):
            if t[:cut] in ids and t[cut:] in ids:
                found.append((-scores[i], i, cut, t[:cut], t[cut:]))
    found.sort()
    return [(a, b) for *_, a, b in found]


def _pair(parts: list[str]) -> tuple[str, str]:
    return (parts[0], parts[1]) if len(parts) == 2 else ("", "")


def gguf_document(tok: Any) -> dict[str, Any]:
    """The ``tokenizer.json`` document of a :class:`~attnlm.tokenizers.gguf.GGUFTokenizer`
    (see the module docstring); its post-processor is left to the caller (None here)."""
    from attnlm.tokenizers.gguf import PRE_NAMES, _llama_cpp_split, hf_pre_tokenizer

    tokens, types = list(tok.tokens), tok.token_types
    vocab = {t: i for i, t in enumerate(tokens)}
    if tok.model == "llama":
        pairs = spm_merges(tokens, tok.scores)
    else:
        pairs = [_pair(_llama_cpp_split(str(m))) for m in tok.metadata["tokenizer.ggml.merges"]]
    merges = [[a, b] for a, b in pairs if a in vocab and b in vocab and a + b in vocab]
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": k in SPECIAL}
        for i, (t, k) in enumerate(zip(tokens, types, strict=True)) if k in ADDED
    ]  # fmt: skip
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": bool(tok.ignore_merges), "vocab": vocab,
             "merges": merges}  # fmt: skip
    if tok.model == "llama":
        replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
        prefix = bool(tok.add_space_prefix)
        prepend = [{"type": "Prepend", "prepend": SPACE}] if prefix else []
        strip = [{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else []
        unk = tokens[tok.unk_id] if tok.unk_id is not None else None
        model.update(unk_token=unk, fuse_unk=True, byte_fallback=True)
        normalizer: Any = {"type": "Sequence", "normalizers": [*prepend, replace]}
        pre_tokenizer = None
        decoder = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, *strip]}  # fmt: skip
    else:
        kind, _ = PRE_NAMES[tok.pre]
        normalizer, pre_tokenizer = None, hf_pre_tokenizer(kind)
        if kind == "gpt2":  # GPT-2's regex is ByteLevel's own: its one step, as GPT-2's file
            # has it (and as ``export --gguf`` reads a folder back)
            pre_tokenizer = {"type": "ByteLevel", "add_prefix_space": False,
                             "trim_offsets": True, "use_regex": True}  # fmt: skip
        decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                   "use_regex": True}  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": decoder,
        "model": model,
    }


def gguf_roles(tok: Any) -> dict[str, int]:
    """``{"bos": id, ...}`` of a GGUF vocabulary worth naming in ``tokenizer_config.json``:
    those that are added tokens (naming a plain token would make ``transformers`` cut it out
    of text), and BOS / EOS when the tokenizer adds them."""
    added = {i for i, k in enumerate(tok.token_types) if k in ADDED}
    ids = {"bos": tok.bos_id, "eos": tok.eos_id, "pad": tok.pad_id, "unk": tok.unk_id}
    needed = {"bos": tok.add_bos, "eos": tok.add_eos}
    return {k: i for k, i in ids.items() if i is not None and (i in added or needed.get(k))}


def gguf_stop_ids(tok: Any) -> tuple[int, ...]:
    """The ids that end generation: EOS first, then llama.cpp's other end-of-generation ids."""
    eos = [tok.eos_id] if tok.eos_id is not None else []
    return tuple(dict.fromkeys(eos + sorted(tok.eog_ids)))
