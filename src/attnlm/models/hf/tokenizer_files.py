"""The tokenizer files of a Hugging Face model folder (``attnlm export --out``), written so
that ``transformers.AutoTokenizer`` (and lm-evaluation-harness, TransformerLens) load a
tokenizer that encodes as attnlm's does, and ``generate`` starts and stops where attnlm's
does.

* ``tokenizer.json`` (the ``tokenizers`` library's format): the tokenizer as
  :func:`attnlm.tokenizers.hf_export.hf_tokenizer` describes it, for GGUF vocabularies
  (byte-level BPE with any llama.cpp pre-tokenizer attnlm reads, SentencePiece-style), attnlm's
  byte-level BPE (any pattern: GPT-2's, ``cl100k``, a custom regex; trained, GPT-2's, a
  tiktoken rank file), Hugging Face byte-level BPE (a round trip), WordPiece and char
  tokenizers.
* ``tokenizer_config.json``: ``tokenizer_class`` ``PreTrainedTokenizerFast``, the special
  tokens by role (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``, ``cls_token``,
  ``sep_token``, ``mask_token`` where known; a token is named only when it is an added token,
  so that naming it does not make ``transformers`` cut a plain token out of text),
  ``add_bos_token``, ``add_eos_token``, ``model_max_length`` (the model's context length),
  ``clean_up_tokenization_spaces: false``, the ``chat_template``, and a WordPiece tokenizer's
  ``do_lower_case`` / ``strip_accents`` / ``tokenize_chinese_chars``.
* ``special_tokens_map.json``: the same roles and tokens (what ``transformers`` 4 reads
  beside the config).
* ``generation_config.json``: ``bos_token_id``, ``eos_token_id`` (a list when several ids end
  generation: a GGUF vocabulary's end-of-generation ids, EOS first) and ``pad_token_id``, and
  the sampling settings the source recommends (a GGUF file's ``general.sampling.*``, a Hugging
  Face folder's own ``generation_config.json``).

BOS: ``AutoTokenizer.from_pretrained(folder)(text)["input_ids"]`` (``add_special_tokens=True``,
its default) equals ``tok.encode(text, add_special_tokens=True)``, and with
``add_special_tokens=False`` it equals attnlm's default ``tok.encode(text)`` (no BOS / EOS). For
SmolLM2 and the other files that do not ask for BOS the two are the same; a Llama 3-style or
SentencePiece-style GGUF vocabulary asks for BOS, which ``transformers`` then adds by default
as llama.cpp does, while attnlm's ``generate`` and ``eval`` encode without it.

Regular expressions run on Oniguruma in ``tokenizers`` and on Python's ``regex`` in attnlm:
their Unicode tables may differ on characters newer than either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.tokenizers.hf_export import ROLES, HFTokenizer, hf_tokenizer

#: the files :func:`write_tokenizer_files` writes (and removes when it cannot write them)
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
         "generation_config.json")  # fmt: skip
#: ``generation_config.json`` sampling keys taken from a Hugging Face source folder
HF_SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p",
               "repetition_penalty", "max_new_tokens", "max_length")  # fmt: skip
#: a GGUF file's ``general.sampling.*`` keys -> ``generation_config.json`` keys
GGUF_SAMPLING = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "penalty_repeat": "repetition_penalty"}  # fmt: skip


def tokenizer_config(h: HFTokenizer, context_length: int | None,
                     chat_template: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The ``tokenizer_config.json`` document of ``h`` (see the module docstring)."""
    doc: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    doc.update({f"{role}_token": h.names[role] for role in ROLES if role in h.names})
    doc.update(add_bos_token=h.add_bos, add_eos_token=h.add_eos)
    length = context_length or h.config.get("model_max_length")
    if length:
        doc["model_max_length"] = int(length)
    doc["clean_up_tokenization_spaces"] = False
    doc.update({k: v for k, v in h.config.items() if k != "model_max_length"})
    if chat_template:
        doc["chat_template"] = chat_template
    return doc


def special_tokens_map(h: HFTokenizer) -> dict[str, str]:
    """The ``special_tokens_map.json`` document of ``h``: ``{"<role>_token": text}``."""
    return {f"{role}_token": h.names[role] for role in ROLES if role in h.names}


def generation_config(h: HFTokenizer, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``generation_config.json`` document of ``h``: the ids ``transformers``' ``generate``
    starts, stops and pads with, then ``sampling`` (recommended settings)."""
    doc: dict[str, Any] = {}
    if h.bos_id is not None:
        doc["bos_token_id"] = h.bos_id
    if h.eos_ids:
        doc["eos_token_id"] = h.eos_ids[0] if len(h.eos_ids) == 1 else list(h.eos_ids)
    if h.pad_id is not None:
        doc["pad_token_id"] = h.pad_id
    doc.update(sampling or {})
    return doc


def source_sampling(path: str | Path | None) -> dict[str, Any]:
    """The sampling settings a model's source (``path``) recommends: a GGUF file's
    ``general.sampling.*`` keys, a Hugging Face folder's ``generation_config.json``; ``{}``
    for other sources or when there are none (a damaged file is not read: the settings are
    advice)."""
    out: dict[str, Any] = {}
    path = Path(path) if path is not None else None
    gguf = path is not None and path.is_file() and path.suffix.lower() == ".gguf"
    try:
        if gguf:
            from attnlm.base.ggufio import GGUFFile

            meta = GGUFFile(path).metadata
            for key, name in GGUF_SAMPLING.items():
                value = meta.get(f"general.sampling.{key}")
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[name] = value
        elif path is not None and (Path(path) / "generation_config.json").is_file():
            from attnlm.base.foreign import load_json

            doc = load_json(Path(path) / "generation_config.json", "generation_config.json")
            if isinstance(doc, dict):
                out = {k: doc[k] for k in HF_SAMPLING if isinstance(doc.get(k), int | float)}
    except (InputError, OSError):
        return {}
    if out and "do_sample" not in out and gguf:
        out["do_sample"] = True
    return out


def marian_files(tok: Any, context_length: int | None = None) -> dict[str, Any]:
    """An OPUS-MT (Marian) tokenizer as its folder has it, for ``transformers``'
    ``MarianTokenizer`` (which needs ``sentencepiece``): ``source.spm`` / ``target.spm`` (the
    SentencePiece models' bytes), ``vocab.json``, ``tokenizer_config.json`` (special tokens,
    added tokens, one shared vocabulary) and ``special_tokens_map.json``."""
    import base64

    data = tok.to_dict()
    names = {"unk_token": data["unk"], "eos_token": data["eos"], "pad_token": data["pad"]}
    config: dict[str, Any] = {"tokenizer_class": "MarianTokenizer", **names,
                              "separate_vocabs": False}  # fmt: skip
    if context_length:
        config["model_max_length"] = int(context_length)
    config["clean_up_tokenization_spaces"] = bool(data["clean_up_tokenization_spaces"])
    config["added_tokens_decoder"] = {
        str(t["id"]): {"content": t["content"], "lstrip": bool(t["lstrip"]),
                       "rstrip": bool(t["rstrip"]), "normalized": False, "single_word": False,
                       "special": bool(t["special"])}
        for t in sorted(data["added"], key=lambda t: t["id"])
    }  # fmt: skip
    return {
        "source.spm": base64.b64decode(data["source_spm"]),
        "target.spm": base64.b64decode(data["target_spm"]),
        "vocab.json": data["vocab"],
        "tokenizer_config.json": config,
        "special_tokens_map.json": names,
    }


def _write_docs(folder: Path, docs: dict[str, Any]) -> list[str]:
    from attnlm.base.fileio import atomic_write_bytes, atomic_write_text

    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        if isinstance(doc, bytes):
            atomic_write_bytes(folder / name, doc)
        elif name in ("tokenizer.json", "vocab.json"):  # megabytes: one line
            atomic_write_text(folder / name, json.dumps(doc, ensure_ascii=False))
        else:
            atomic_write_text(folder / name, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return list(docs)


def write_tokenizer_files(tok: Any, folder: str | Path, config: Any,
                          chat_template: str | None = None,
                          sampling: dict[str, Any] | None = None,
                          notes: list[str] | None = None) -> list[str]:  # fmt: skip
    """Write :data:`FILES` for ``tok`` into ``folder`` (each atomically; ``config``: the
    model's, for its vocabulary size, context length and BOS / EOS ids; ``sampling``: more
    ``generation_config.json`` keys); returns the names written. None are written for a
    tokenizer these files cannot describe, or one with more tokens than the model has
    embedding rows (the model is written anyway; ``notes`` gets the one-line reason), after
    removing those an earlier export left."""
    folder = Path(folder)
    if getattr(tok, "kind", "") == "marian-spm":  # its own files (the model writes the
        # generation config of a translation model)
        return _write_docs(folder, marian_files(tok, getattr(config, "block_size", None)))
    try:
        h = hf_tokenizer(tok, getattr(config, "bos_id", None), getattr(config, "eos_id", None))
        n_vocab = getattr(config, "vocab_size", None)
        if n_vocab is not None and tok.vocab_size > n_vocab:
            raise InputError(f"the tokenizer has {tok.vocab_size} tokens for {n_vocab} "
                             "embedding rows")  # fmt: skip
    except InputError as e:
        if notes is not None:
            notes.append(str(e))
        for name in FILES:
            (folder / name).unlink(missing_ok=True)
        return []
    docs = {
        "tokenizer.json": h.doc,
        "tokenizer_config.json": tokenizer_config(
            h, getattr(config, "block_size", None), chat_template
        ),  # fmt: skip
        "special_tokens_map.json": special_tokens_map(h),
        "generation_config.json": generation_config(h, sampling),
    }
    return _write_docs(folder, docs)
