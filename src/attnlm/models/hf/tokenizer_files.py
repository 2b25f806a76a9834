"""The tokenizer files of a Hugging Face model folder (``attnlm export --out``), written so
that ``transformers.AutoTokenizer`` (and lm-evaluation-harness) load a tokenizer that encodes
as attnlm's does.

* ``tokenizer.json`` (the ``tokenizers`` library's format):

  - byte-level BPE (attnlm's ``bpe`` with the ``gpt2`` pattern, a Hugging Face byte-level BPE
    with GPT-2's ``ByteLevel`` step, a GGUF ``gpt2`` vocabulary with any ``tokenizer.ggml.pre``
    attnlm reads): a ``BPE`` model holding every token, the merges as ``[left, right]`` pairs
    (a GGUF merge cut as llama.cpp cuts it), ``ignore_merges`` for Llama 3's pre-tokenizers;
    the pre-tokenizer as a ``Sequence`` of one ``Split`` (``Isolated``) per llama.cpp regex
    followed by ``ByteLevel`` without its own regex
    (:func:`attnlm.tokenizers.gguf.hf_pre_tokenizer`), except GPT-2's: the one ``ByteLevel``
    step with its own regex, which is GPT-2's (the form GPT-2's file has, and the one
    ``attnlm export --gguf`` reads back from a folder); a ``ByteLevel`` decoder.
  - SentencePiece-style GGUF vocabularies (``tokenizer.ggml.model = "llama"``), as
    ``transformers`` writes Llama 2's file: a ``BPE`` model with ``byte_fallback`` (``<0xNN>``
    tokens), the unknown token, and merges made from the scores (every pair of tokens whose
    concatenation is a token; the higher that token's score, the earlier the merge); a
    normalizer that puts ``▁`` in front (``add_space_prefix``) and turns spaces into ``▁``; a
    decoder that undoes it (``▁`` -> space, bytes, one leading space off).
  - control, user-defined and unknown tokens as added tokens, cut out of the text before the
    model sees it; control and unknown ones ``special`` (left out by ``skip_special_tokens``).
  - a ``TemplateProcessing`` post-processor adding BOS / EOS when the tokenizer adds them (a
    GGUF file's ``add_bos_token`` / ``add_eos_token``; never for attnlm's own tokenizers).

* ``tokenizer_config.json``: ``tokenizer_class`` ``PreTrainedTokenizerFast``, ``bos_token``,
  ``eos_token``, ``pad_token``, ``unk_token`` where known (a token is named only when it is an
  added token, so that naming it does not make ``transformers`` cut a plain token out of
  text), ``add_bos_token``, ``add_eos_token``, ``model_max_length`` (the model's context
  length), ``clean_up_tokenization_spaces: false`` and the ``chat_template``.
  ``special_tokens_map.json`` is not written: ``transformers`` reads the same names from
  ``tokenizer_config.json``.
* ``generation_config.json``: ``bos_token_id``, ``eos_token_id`` (a list when several ids end
  generation: a GGUF vocabulary's end-of-generation ids, EOS first) and ``pad_token_id``.

BOS: ``AutoTokenizer.from_pretrained(folder)(text)["input_ids"]`` (``add_special_tokens=True``,
its default) equals ``tok.encode(text, add_special_tokens=True)``, and with
``add_special_tokens=False`` it equals attnlm's default ``tok.encode(text)`` (no BOS / EOS). For
SmolLM2 and the other files that do not ask for BOS the two are the same; a Llama 3-style or
SentencePiece-style GGUF vocabulary asks for BOS, which ``transformers`` then adds by default
as llama.cpp does, while attnlm's ``generate`` and ``eval`` encode without it.

Not exact: ``tokenizers`` merges by the rank of a pair, llama.cpp's SentencePiece-style
tokenizer by the score of the merged token, leftmost first; the two differ when tokens of one
score compete for a symbol, or when a token is made of characters that are not tokens
themselves (``tokenizers`` spells such a character in bytes first). Regular expressions run on
Oniguruma in ``tokenizers`` and on Python's ``regex`` in attnlm: their Unicode tables may
differ on characters newer than either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
ADDED = (CONTROL, USER_DEFINED, UNKNOWN)  # cut out of text before the model sees it
SPECIAL = (CONTROL, UNKNOWN)  # left out by skip_special_tokens
SPACE = "\u2581"  # ▁, SentencePiece's visible space
#: the files :func:`write_tokenizer_files` writes (and removes when it cannot write them)
FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


@dataclass
class Vocabulary:
    """What the files are made of: every token (``tokens[i]`` has id ``i``) with its type
    (llama.cpp's numbering: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte),
    the merges in priority order, the model (``byte-level`` / ``spm``), the pre-tokenizer
    type (a key of :data:`attnlm.tokenizers.gguf.PRE_TOKENIZERS`) and the special ids."""

    model: str
    tokens: list[str]
    types: list[int]
    merges: list[tuple[str, str]]
    pre: str = "gpt2"
    ignore_merges: bool = False
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    bos: int | None = None
    eos: int | None = None
    pad: int | None = None
    unk: int | None = None
    eog: tuple[int, ...] = ()


# -- the vocabulary of a tokenizer --------------------------------------------------------------


def vocabulary(tok: Any, n_vocab: int, bos_id: int | None = None,
               eos_id: int | None = None) -> Vocabulary | None:  # fmt: skip
    """The :class:`Vocabulary` of ``tok`` for a model with ``n_vocab`` embedding rows
    (``bos_id`` / ``eos_id``: the model config's, for tokenizers that do not say); None for a
    tokenizer these files cannot describe (char, word, classic BPE, WordPiece, byte-level BPE
    with another pattern)."""
    if getattr(tok, "kind", "") == "gguf":
        return _gguf_vocabulary(tok)
    from attnlm.models.gguf.vocab import metadata

    try:
        meta = metadata(tok, n_vocab, bos_id, eos_id)
    except InputError:
        return None
    tokens = [str(t) for t in meta["tokenizer.ggml.tokens"]]
    types = [int(k) for k in meta["tokenizer.ggml.token_type"]]
    merges = [_pair(str(m).split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    return Vocabulary("byte-level", tokens, types, merges, bos=bos, eos=eos,
                      eog=(eos,) if eos is not None else ())  # fmt: skip


def _pair(parts: list[str]) -> tuple[str, str]:
    return (parts[0], parts[1]) if len(parts) == 2 else ("", "")


def _gguf_vocabulary(tok: Any) -> Vocabulary:
    from attnlm.tokenizers.gguf import PRE_NAMES, _llama_cpp_split

    tokens, types = list(tok.tokens), tok.token_types
    eog = tuple(dict.fromkeys([i for i in (tok.eos_id,) if i is not None] + sorted(tok.eog_ids)))
    common = dict(add_bos=tok.add_bos, add_eos=tok.add_eos, bos=tok.bos_id, eos=tok.eos_id,
                  pad=tok.pad_id, unk=tok.unk_id, eog=eog)  # fmt: skip
    if tok.model == "llama":
        merges = _spm_merges(tokens, tok.scores)
        return Vocabulary("spm", tokens, types, merges, add_space_prefix=tok.add_space_prefix,
                          **common)  # fmt: skip
    merges = [_pair(_llama_cpp_split(str(m))) for m in tok.metadata["tokenizer.ggml.merges"]]
    kind, _ = PRE_NAMES[tok.pre]
    return Vocabulary("byte-level", tokens, types, merges, pre=kind,
                      ignore_merges=tok.ignore_merges, **common)  # fmt: skip


def _spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
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


# -- the documents --------------------------------------------------------------------------------


def tokenizer_json(v: Vocabulary) -> dict[str, Any]:
    """The ``tokenizer.json`` document of ``v`` (see the module docstring)."""
    from attnlm.tokenizers.gguf import hf_pre_tokenizer

    vocab = {t: i for i, t in enumerate(v.tokens)}
    merges = [[a, b] for a, b in v.merges if a in vocab and b in vocab and a + b in vocab]
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": k in SPECIAL}
        for i, (t, k) in enumerate(zip(v.tokens, v.types, strict=True)) if k in ADDED
    ]  # fmt: skip
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": v.ignore_merges, "vocab": vocab, "merges": merges}  # fmt: skip
    if v.model == "spm":
        replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
        prepend = [{"type": "Prepend", "prepend": SPACE}] if v.add_space_prefix else []
        strip = [{"type": "Strip", "content": " ", "start": 1, "stop": 0}]
        strip = strip if v.add_space_prefix else []
        unk = v.tokens[v.unk] if v.unk is not None else None
        model.update(unk_token=unk, fuse_unk=True, byte_fallback=True)
        normalizer: Any = {"type": "Sequence", "normalizers": [*prepend, replace]}
        pre_tokenizer = None
        decoder = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, *strip]}  # fmt: skip
    else:
        normalizer, pre_tokenizer = None, hf_pre_tokenizer(v.pre)
        if v.pre == "gpt2":  # GPT-2's regex is ByteLevel's own: its one step, as GPT-2's file
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
        "post_processor": _post_processor(v),
        "decoder": decoder,
        "model": model,
    }


def _post_processor(v: Vocabulary) -> dict[str, Any] | None:
    """``TemplateProcessing`` adding BOS in front of / EOS after each sequence (``$A``, and
    ``$B`` of a pair), or None when neither is added."""
    bos = v.tokens[v.bos] if v.add_bos and v.bos is not None else None
    eos = v.tokens[v.eos] if v.add_eos and v.eos is not None else None
    if bos is None and eos is None:
        return None

    def template(part: str, type_id: int) -> list[dict[str, Any]]:
        special = [{"SpecialToken": {"id": t, "type_id": type_id}} if t else None
                   for t in (bos, eos)]  # fmt: skip
        seq = {"Sequence": {"id": part, "type_id": type_id}}
        return [x for x in (special[0], seq, special[1]) if x is not None]

    specials = {t: {"id": t, "ids": [i], "tokens": [t]}
                for t, i in ((bos, v.bos), (eos, v.eos)) if t is not None}  # fmt: skip
    return {"type": "TemplateProcessing", "single": template("A", 0),
            "pair": template("A", 0) + template("B", 1), "special_tokens": specials}  # fmt: skip


def _named(v: Vocabulary) -> dict[str, int]:
    """``{"bos": id, ...}`` for the special ids worth naming: added tokens, and BOS / EOS when
    the tokenizer adds them (``transformers`` builds its template from the names)."""
    added = {i for i, k in enumerate(v.types) if k in ADDED}
    ids = {"bos": v.bos, "eos": v.eos, "pad": v.pad, "unk": v.unk}
    needed = {"bos": v.add_bos, "eos": v.add_eos}
    return {k: i for k, i in ids.items() if i is not None and (i in added or needed.get(k))}


def tokenizer_config(v: Vocabulary, context_length: int | None,
                     chat_template: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The ``tokenizer_config.json`` document of ``v`` (see the module docstring)."""
    doc: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    doc.update({f"{k}_token": v.tokens[i] for k, i in _named(v).items()})
    doc.update(add_bos_token=v.add_bos, add_eos_token=v.add_eos)
    if context_length:
        doc["model_max_length"] = int(context_length)
    doc["clean_up_tokenization_spaces"] = False
    if chat_template:
        doc["chat_template"] = chat_template
    return doc


def generation_config(v: Vocabulary) -> dict[str, Any]:
    """The ``generation_config.json`` document of ``v``: the ids ``transformers``' ``generate``
    starts, stops and pads with."""
    doc: dict[str, Any] = {}
    if v.bos is not None:
        doc["bos_token_id"] = v.bos
    if v.eog:
        doc["eos_token_id"] = v.eog[0] if len(v.eog) == 1 else list(v.eog)
    if v.pad is not None:
        doc["pad_token_id"] = v.pad
    return doc


# -- writing ------------------------------------------------------------------------------------


def write_tokenizer_files(tok: Any, folder: str | Path, config: Any,
                          chat_template: str | None = None) -> list[str]:  # fmt: skip
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``generation_config.json`` for
    ``tok`` into ``folder`` (each atomically; ``config``: the model's, for its vocabulary
    size, context length and BOS / EOS ids); returns the names written, none for a tokenizer
    these files cannot describe (the model is written anyway), after removing those an earlier
    export left."""
    from attnlm.base.fileio import atomic_write_text

    folder = Path(folder)
    v = vocabulary(tok, config.vocab_size, getattr(config, "bos_id", None),
                   getattr(config, "eos_id", None))  # fmt: skip
    if v is None:
        for name in FILES:
            (folder / name).unlink(missing_ok=True)
        return []
    folder.mkdir(parents=True, exist_ok=True)
    context = getattr(config, "block_size", None)
    docs = {
        "tokenizer.json": tokenizer_json(v),
        "tokenizer_config.json": tokenizer_config(v, context, chat_template),
        "generation_config.json": generation_config(v),
    }
    for name, doc in docs.items():
        if name == "tokenizer.json":  # megabytes: one line, as tokenizers writes it
            text = json.dumps(doc, ensure_ascii=False)
        else:
            text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        atomic_write_text(folder / name, text)
    return list(docs)
