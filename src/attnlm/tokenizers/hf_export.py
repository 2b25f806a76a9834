"""attnlm's tokenizers as Hugging Face ``tokenizers`` documents (``tokenizer.json``), with the
special tokens ``transformers`` names in ``tokenizer_config.json`` and the ids its
``generate`` starts, stops and pads with: :func:`hf_tokenizer`.

What each kind becomes (the text it encodes to the same ids, and the ids it decodes to the
same text):

===================================  ===========================================================
attnlm tokenizer                     ``tokenizer.json``
===================================  ===========================================================
GGUF ``gpt2`` / ``llama``            see :mod:`attnlm.tokenizers.hf_export_gguf`
byte-level BPE (``bpe``: trained,    ``BPE`` model (tokens in GPT-2's byte alphabet, the merges,
GPT-2's, a tiktoken rank file)       ``ignore_merges``: a chunk that is a token is that token, as
                                     tiktoken encodes); pre-tokenizer: GPT-2's pattern as one
                                     ``ByteLevel`` step, any other (``cl100k``, a custom regex)
                                     as ``Split`` (``Isolated``) then ``ByteLevel`` without its
                                     regex; special tokens as added tokens
Hugging Face byte-level BPE          its own document (a round trip), a ``ByteLevel`` decoder
(``tokenizer.json``, ``vocab.json``  added where it has none
+ ``merges.txt``)
WordPiece (``vocab.txt``,            ``BertNormalizer`` (its options), ``BertPreTokenizer``,
``tokenizer.json``, trained)         ``WordPiece`` model, the five special tokens, ``[CLS] A
                                     [SEP]`` template, ``WordPiece`` decoder
char                                 ``WordLevel`` over single characters (``Split`` on every
                                     character), ``<unk>`` when the tokenizer has it, ``Fuse``
                                     decoder
===================================  ===========================================================

Word-level and classic (``</w>``) BPE tokenizers have none: their decoding rebuilds spacing
by rules no ``tokenizers`` decoder has. :func:`hf_tokenizer` refuses them, and the SentencePiece
files of an OPUS-MT folder, in one line naming the kind.

Special ids: a byte-level BPE (attnlm's or Hugging Face's) takes BOS / EOS from the model's
config (``bos_id`` / ``eos_id``), else from the names ``<|endoftext|>``, ``</s>`` ... among
its special tokens; a token is named in ``tokenizer_config.json`` only when it is an added
token (so that naming it does not make ``transformers`` cut a plain token out of text).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from attnlm.base.errors import InputError

#: special-token names taken as BOS / EOS when the model config does not say
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")
BOS_NAMES = ("<|startoftext|>", "<s>", "<|begin_of_text|>", "<bos>")
#: roles ``transformers`` reads from ``tokenizer_config.json`` as ``<role>_token``
ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


@dataclass
class HFTokenizer:
    """A tokenizer as Hugging Face files describe it: ``doc``, the ``tokenizer.json``
    document; ``names``, ``{role: token text}`` for ``tokenizer_config.json`` /
    ``special_tokens_map.json`` (roles of :data:`ROLES`); ``add_bos`` / ``add_eos``, whether
    encoding with special tokens adds them; ``bos_id``, ``eos_ids`` (those that end
    generation, EOS first) and ``pad_id`` for ``generation_config.json``; ``config``, more
    ``tokenizer_config.json`` keys (``do_lower_case`` ...); ``kind``, attnlm's kind."""

    doc: dict[str, Any]
    names: dict[str, str] = field(default_factory=dict)
    add_bos: bool = False
    add_eos: bool = False
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    kind: str = ""


def hf_tokenizer(tok: Any, bos_id: int | None = None, eos_id: int | None = None) -> HFTokenizer:
    """``tok`` as Hugging Face files describe it (see the module docstring). ``bos_id`` /
    ``eos_id``: the model config's, for tokenizers that do not say. InputError, one line
    naming the kind, for a tokenizer with no ``tokenizer.json`` form."""
    kind = getattr(tok, "kind", "") or type(tok).__name__
    build = _KINDS.get(kind)
    if build is None:
        raise InputError(
            f"a {kind} tokenizer has no tokenizer.json form (written: {', '.join(sorted(_KINDS))})"
        )
    out = build(tok, bos_id, eos_id)
    out.kind = kind
    return out


# -- shared pieces --------------------------------------------------------------------------------


def added_token(i: int, content: str, special: bool = True) -> dict[str, Any]:
    """One entry of ``added_tokens``: matched exactly in the raw text (not normalized)."""
    return {"id": i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": special}  # fmt: skip


def document(model: dict[str, Any], added: list[dict[str, Any]], *, normalizer: Any = None,
             pre_tokenizer: Any = None, post_processor: Any = None,
             decoder: Any = None) -> dict[str, Any]:  # fmt: skip
    """A complete ``tokenizer.json`` document."""
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor, "decoder": decoder, "model": model}  # fmt: skip


def template(before: list[tuple[str, int]], after: list[tuple[str, int]],
             between: list[tuple[str, int]] | None = None) -> dict[str, Any] | None:  # fmt: skip
    """A ``TemplateProcessing`` post-processor: ``before`` tokens, the sequence, ``after``
    tokens (a pair: ``before A after [between] B after``, B's part type 1); None when it adds
    nothing."""
    if not before and not after:
        return None

    def special(t: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": t, "type_id": type_id}}

    def seq(part: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": part, "type_id": type_id}}

    single = [*(special(t, 0) for t, _ in before), seq("A", 0), *(special(t, 0) for t, _ in after)]
    second = before if between is None else between
    pair = single + [*(special(t, 1) for t, _ in second), seq("B", 1),
                     *(special(t, 1) for t, _ in after)]  # fmt: skip
    tokens = {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in [*before, *after, *second]}
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": tokens}  # fmt: skip


def _by_name(specials: dict[str, int], given: int | None, names: tuple[str, ...]) -> int | None:
    if given is not None:
        return given
    return next((specials[t] for t in names if t in specials), None)


def _byte_level_roles(
    specials: dict[str, int], bos_id: int | None, eos_id: int | None
) -> tuple[int | None, int | None, dict[str, str]]:
    """BOS / EOS of a byte-level BPE and the names worth writing (added tokens only)."""
    bos = _by_name(specials, bos_id, BOS_NAMES)
    eos = _by_name(specials, eos_id, EOS_NAMES)
    text = {i: t for t, i in specials.items()}
    names = {role: text[i] for role, i in (("bos", bos), ("eos", eos)) if i in text}
    return bos, eos, names


def onig_regex(pattern: str) -> str:
    r"""``pattern`` (Python's ``regex`` syntax) as ``tokenizers``' Oniguruma reads it alike:
    a possessive counted repeat (cl100k's ``\p{N}{1,3}+``) means "one or more of the repeat"
    there, so it is written greedy (the same chunks where nothing after it in its alternative
    could take back what it matched, as in cl100k's)."""
    return re.sub(r"(?<!\\)(\{\d+(?:,\d*)?\})\+", r"\1", pattern)


BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                      "use_regex": True}  # fmt: skip


# -- the kinds ------------------------------------------------------------------------------------


def _gguf(tok: Any, bos_id: int | None, eos_id: int | None) -> HFTokenizer:
    from attnlm.tokenizers.hf_export_gguf import gguf_document, gguf_roles, gguf_stop_ids

    doc = gguf_document(tok)
    bos = [(tok.tokens[tok.bos_id], tok.bos_id)] if tok.add_bos else []
    eos = [(tok.tokens[tok.eos_id], tok.eos_id)] if tok.add_eos else []
    doc["post_processor"] = template(bos, eos)
    names = {role: tok.tokens[i] for role, i in gguf_roles(tok).items()}
    return HFTokenizer(doc, names, add_bos=tok.add_bos, add_eos=tok.add_eos, bos_id=tok.bos_id,
                       eos_ids=gguf_stop_ids(tok), pad_id=tok.pad_id)  # fmt: skip


def _bpe(tok: Any, bos_id: int | None, eos_id: int | None) -> HFTokenizer:
    """attnlm's byte-level BPE (trained, GPT-2's, a tiktoken rank file)."""
    from attnlm.tokenizers.bpe.patterns import GPT2_PUBLISHED, PATTERNS, split_pattern
    from attnlm.tokenizers.hf_bpe import BYTE_TO_CHAR

    def chars(data: bytes) -> str:
        return "".join(BYTE_TO_CHAR[b] for b in data)

    specials = tok.special_tokens
    vocab = {chars(data): i for data, i in tok.ranks.items()}
    vocab.update(specials)
    merges = [[chars(a), chars(b)] for a, b in tok.merges]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": True, "vocab": vocab, "merges": merges}  # fmt: skip
    if tok.pattern in (PATTERNS["gpt2"], GPT2_PUBLISHED):  # ByteLevel's own regex is GPT-2's
        pre: dict[str, Any] = {"type": "ByteLevel", "add_prefix_space": False,
                               "trim_offsets": True, "use_regex": True}  # fmt: skip
    else:
        split = {"type": "Split", "pattern": {"Regex": onig_regex(split_pattern(tok.pattern))},
                 "behavior": "Isolated", "invert": False}  # fmt: skip
        pre = {"type": "Sequence", "pretokenizers": [split, {
            "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": False}]}  # fmt: skip
    added = [added_token(i, t) for t, i in sorted(specials.items(), key=lambda kv: kv[1])]
    doc = document(model, added, pre_tokenizer=pre, decoder=BYTE_LEVEL_DECODER)
    bos, eos, names = _byte_level_roles(specials, bos_id, eos_id)
    return HFTokenizer(doc, names, bos_id=bos, eos_ids=(eos,) if eos is not None else ())


def _hf_bpe(tok: Any, bos_id: int | None, eos_id: int | None) -> HFTokenizer:
    """A Hugging Face byte-level BPE: its own document, completed."""
    return _own_document(tok, bos_id, eos_id, byte_level=True)


def _hf_spm(tok: Any, bos_id: int | None, eos_id: int | None) -> HFTokenizer:
    """A Hugging Face SentencePiece-style BPE (byte fallback, ``▁`` for spaces): its own
    document, as read."""
    return _own_document(tok, bos_id, eos_id, byte_level=False)


def _own_document(tok: Any, bos_id: int | None, eos_id: int | None, byte_level: bool
                  ) -> HFTokenizer:  # fmt: skip
    """A tokenizer read from a ``tokenizer.json``, written back as it was: its own document
    with the fields ``tokenizers`` requires (a byte-level one completed with its decoder)."""
    doc = copy.deepcopy(tok.doc)
    for key, value in document({}, []).items():
        doc.setdefault(key, value)
    model = doc["model"]
    if isinstance(model.get("merges"), list):  # "a b" strings (older files) as pairs
        model["merges"] = [m.split(" ", 1) if isinstance(m, str) else list(m)
                           for m in model["merges"]]  # fmt: skip
    if byte_level:
        if doc.get("decoder") is None:
            doc["decoder"] = BYTE_LEVEL_DECODER
        _complete_byte_level(doc.get("pre_tokenizer"))
    doc["added_tokens"] = [{**added_token(t["id"], t["content"], bool(t.get("special"))), **t}
                           for t in doc.get("added_tokens") or []]  # fmt: skip
    specials = {t["content"]: t["id"] for t in doc.get("added_tokens") or [] if t.get("special")}
    bos, eos, names = _byte_level_roles(specials, bos_id, eos_id)
    unk = model.get("unk_token")
    if isinstance(unk, str) and unk in specials:
        names["unk"] = unk
    plain = tok.encode("a")
    full = tok.encode("a", add_special_tokens=True)
    cut = next((k for k in range(len(full)) if full[k : k + len(plain)] == plain), 0)
    add_bos = bos is not None and full[:cut] == [bos]
    add_eos = eos is not None and full[cut + len(plain) :] == [eos]
    return HFTokenizer(doc, names, add_bos=add_bos, add_eos=add_eos, bos_id=bos,
                       eos_ids=(eos,) if eos is not None else ())  # fmt: skip


def _complete_byte_level(spec: Any) -> None:
    """Give every ``ByteLevel`` step the fields ``tokenizers`` requires, with the values attnlm
    reads a missing one as (a document built from ``vocab.json`` + ``merges.txt`` has none)."""
    if not isinstance(spec, dict):
        return
    for sub in spec.get("pretokenizers") or []:
        _complete_byte_level(sub)
    if spec.get("type") == "ByteLevel":
        for key, value in (("add_prefix_space", False), ("trim_offsets", True),
                           ("use_regex", True)):  # fmt: skip
            spec.setdefault(key, value)


def _wordpiece(tok: Any, bos_id: int | None, eos_id: int | None) -> HFTokenizer:
    """BERT's WordPiece, as ``BertTokenizerFast``'s file has it."""
    from attnlm.tokenizers.wordpiece.basic import CLS, MASK, PAD, SEP, UNK

    vocab = {t: i for i, t in enumerate(tok.vocab)}
    model = {"type": "WordPiece", "unk_token": UNK,
             "continuing_subword_prefix": tok.continuing_prefix,
             "max_input_chars_per_word": tok.max_input_chars_per_word, "vocab": vocab}  # fmt: skip
    normalizer = {"type": "BertNormalizer", "clean_text": tok.clean_text,
                  "handle_chinese_chars": tok.handle_chinese_chars,
                  "strip_accents": tok.strip_accents, "lowercase": tok.lowercase}  # fmt: skip
    specials = [(t, vocab[t]) for t in (PAD, UNK, CLS, SEP, MASK)]
    added = [added_token(i, t) for t, i in sorted(specials, key=lambda s: s[1])]
    post = template([(CLS, vocab[CLS])], [(SEP, vocab[SEP])], between=[])
    decoder = {"type": "WordPiece", "prefix": tok.continuing_prefix, "cleanup": True}
    doc = document(model, added, normalizer=normalizer,
                   pre_tokenizer={"type": "BertPreTokenizer"}, post_processor=post,
                   decoder=decoder)  # fmt: skip
    names = {"unk": UNK, "sep": SEP, "pad": PAD, "cls": CLS, "mask": MASK}
    config: dict[str, Any] = {"model_input_names": ["input_ids", "token_type_ids",
                                                    "attention_mask"],
                              "do_lower_case": tok.lowercase,
                              "tokenize_chinese_chars": tok.handle_chinese_chars,
                              "strip_accents": tok.strip_accents}  # fmt: skip
    if tok.model_max_length:
        config["model_max_length"] = int(tok.model_max_length)
    return HFTokenizer(doc, names, pad_id=vocab[PAD], config=config)


def _char(tok: Any, bos_id: int | None, eos_id: int | None) -> HFTokenizer:
    """One token per character: ``WordLevel`` after a split at every character."""
    from attnlm.tokenizers.base import UNK

    vocab = {c: i for i, c in enumerate(tok.chars)}
    if tok.unk:
        vocab[UNK] = len(tok.chars)
    # WordLevel wants an unknown token; one the vocabulary lacks makes unknown text an error,
    # as attnlm's tokenizer without <unk> refuses it
    model = {"type": "WordLevel", "vocab": vocab, "unk_token": UNK}
    split = {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated",
             "invert": False}  # fmt: skip
    doc = document(model, [], pre_tokenizer=split, decoder={"type": "Fuse"})
    return HFTokenizer(doc)


_KINDS = {"gguf": _gguf, "bpe": _bpe, "hf-bpe": _hf_bpe, "hf-spm": _hf_spm,
          "wordpiece": _wordpiece, "char": _char}  # fmt: skip
