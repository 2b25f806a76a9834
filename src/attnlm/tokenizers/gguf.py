"""Tokenizers stored in a GGUF file's metadata, encoding as llama.cpp does (``llama-vocab.cpp``).

The ``tokenizer.*`` keys define the tokenizer completely:

* ``tokenizer.ggml.model``: ``"gpt2"`` (byte-level BPE: ``tokens`` in GPT-2's byte alphabet,
  ``merges`` as ``"a b"`` in priority order, and a pre-tokenizer named by
  ``tokenizer.ggml.pre``, a list of regexes each splitting the pieces of the one before, see
  :data:`PRE_TOKENIZERS`) or ``"llama"`` (SentencePiece-style BPE: spaces become ``▁``, a
  leading ``▁`` is added (``add_space_prefix``), adjacent symbols merge while their
  concatenation is a token, the highest ``scores`` first, and a character left without a
  token becomes its UTF-8 bytes ``<0xNN>``).
* ``tokenizer.ggml.token_type``: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
  6 byte. Control, user-defined and unknown tokens written in the text are cut out first
  (longest first) and become their ids: user-defined ones always, control and unknown ones
  only with ``parse_special`` (llama.cpp's ``tokenizer_st_partition``). llama.cpp also treats
  the end-of-turn names it knows (``<|im_end|>``, ``<|eot_id|>`` ...) as control tokens.
* ``tokenizer.ggml.bos_token_id`` / ``eos_token_id`` / ``unknown_token_id`` ...,
  ``add_bos_token`` / ``add_eos_token`` (defaults as llama.cpp's: BOS for ``llama`` and for
  Llama 3's pre-tokenizer), ``add_space_prefix``; ``tokenizer.chat_template`` is kept as
  :attr:`GGUFTokenizer.chat_template`.

``encode(text)`` equals llama.cpp's ``llama_tokenize(text, add_special=False,
parse_special=True)``; ``encode(text, add_special_tokens=True)`` adds BOS / EOS as the file
asks. The byte-level BPE itself is :class:`~attnlm.tokenizers.hf_bpe.HFByteBPETokenizer` (the
merge-rank algorithm is the same in both libraries), built from the GGUF vocabulary.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable
from typing import Any

from attnlm.tokenizers.base import (
    InvalidTokenIdError,
    Tokenizer,
    TokenizerFileError,
    check_text,
    register_kind,
)
from attnlm.tokenizers.hf_bpe import CHAR_TO_BYTE, HFByteBPETokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # ▁, SentencePiece's visible space

# -- pre-tokenizers (regexes from llama.cpp's llm_tokenizer_bpe, by pre-tokenizer type) -------

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
#: GPT-4o's (Phi-4 mini's and Llama 4's): words split at case changes with their contractions,
#: digits in threes; llama.cpp's rewrite of ``o200k_base``'s regex (its letters without a
#: lowercase or uppercase Latin one in place of the case classes), which leaves combining marks
#: (``\p{M}``: Indic vowel signs) apart from their letters, where ``transformers`` and tiktoken
#: keep them with the word
_CASE = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CASE
    + r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CASE
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)  # fmt: skip
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (GPT2,),
    "llama3": (LLAMA3,),
    "smollm": (r"\p{N}", GPT2),  # also StarCoder's, Refact's, Command-R's ...
    "qwen2": (QWEN2,),
    "gpt-4o": (GPT4O,),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚ"
        "Ḁ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳ"
        "Ꙁ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
        "\\s+$",
        _CJK,
        "\\p{N}+",
    ),
    "deepseek-coder": ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"),
    "falcon": (
        r"[\p{P}\$\+<=>\^~\|`]+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        r"[0-9][0-9][0-9]",
    ),
    "bloom": (" ?[^(\\s|.,!?…。，、।۔،)]+",),
}
#: ``tokenizer.ggml.pre`` names -> (pre-tokenizer type, llama.cpp's flags for it)
PRE_NAMES: dict[str, tuple[str, dict[str, bool]]] = {
    "default": ("default", {}),
    **{n: ("gpt2", {}) for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                                 "jina-v2-de", "mpt", "olmo", "jais", "exaone4", "trillion",
                                 "granite-docling", "a.x-4.0", "mellum", "modern-bert")},
    **{n: ("llama3", {"ignore_merges": True, "add_bos": True})
       for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                 "midm-2.0", "lfm2")},
    **{n: ("llama3", {}) for n in ("dbrx", "smaug-bpe", "glm4", "chatglm-bpe")},
    **{n: ("smollm", {}) for n in ("smollm", "starcoder", "refact", "command-r", "codeshell",
                                   "exaone", "minerva-7b")},
    **{n: ("qwen2", {}) for n in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez",
                                  "hunyuan")},
    **{n: ("gpt-4o", {}) for n in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")},
    "deepseek-llm": ("deepseek-llm", {}),
    "deepseek-coder": ("deepseek-coder", {}),
    "falcon": ("falcon", {}),
    **{n: ("bloom", {}) for n in ("bloom", "poro-chat", "gpt3-finnish")},
}  # fmt: skip

# names llama.cpp marks as control tokens and end-of-generation when present
EOG_NAMES = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})  # fmt: skip
# end-of-turn names, in the order the first one present is taken as the end-of-turn token
EOT_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
             "<end_of_utterance>")  # fmt: skip
# fill-in-the-middle names (treated as control tokens); the last three groups also end generation
FIM_NAMES = frozenset({
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>",
})  # fmt: skip
FIM_EOG_NAMES = frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
                           "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
                           "<|file_sep|>"})  # fmt: skip
ALWAYS_USER_DEFINED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})


def hf_pre_tokenizer(kind: str) -> dict[str, Any]:
    """The pre-tokenizer of type ``kind`` (a key of :data:`PRE_TOKENIZERS`) as a Hugging Face
    ``tokenizer.json`` ``pre_tokenizer``: a ``Sequence`` of one ``Split`` (``Isolated``) per
    regex, then ``ByteLevel`` without its own regex (the form of Llama 3's and Qwen2's files)."""
    steps = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
             for r in PRE_TOKENIZERS[kind]]  # fmt: skip
    steps.append(
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    )
    return {"type": "Sequence", "pretokenizers": steps}


ID_KEYS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask")


def _fail(message: str) -> TokenizerFileError:
    return TokenizerFileError(message)


def _ints(value: Any, n: int, key: str) -> list[int]:
    if value is None:
        return []
    values = [int(v) for v in value]
    if len(values) < n:
        raise _fail(f"{key} has {len(values)} entries for {n} tokens")
    return values[:n]


def _llama_cpp_split(merge: str) -> list[str]:
    """A GGUF merge string cut as llama.cpp cuts it: at the first space after the first
    character (no such space: an empty pair, refused as making no token)."""
    cut = merge.find(" ", 1)
    return [merge[:cut], merge[cut + 1 :]] if cut > 0 else ["", ""]


@register_kind
class GGUFTokenizer(Tokenizer):
    """The tokenizer of a GGUF file (see the module docstring), from its ``tokenizer.*``
    metadata. JSON fields: ``metadata``, those keys and values (so a checkpoint's tokenizer
    file reproduces it exactly).

    Attributes beyond the protocol: ``model`` (``gpt2`` / ``llama``), ``pre``,
    ``ignore_merges`` (Llama 3's pre-tokenizers), ``tokens``, ``scores``, ``bos_id``,
    ``eos_id``, ``eot_id``, ``unk_id``, ``pad_id``, ``eog_ids`` (ids that end generation),
    ``add_bos``, ``add_eos``, ``add_space_prefix``, ``chat_template`` (or None)."""

    kind = "gguf"

    def __init__(self, metadata: dict[str, Any]) -> None:
        self.metadata = {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}
        meta = self.metadata
        self.model = meta.get("tokenizer.ggml.model")
        if self.model is None:
            raise _fail("the GGUF file has no tokenizer (no tokenizer.ggml.model)")
        if self.model not in ("gpt2", "llama"):
            raise _fail(f"tokenizer.ggml.model {self.model!r} is not supported (gpt2, llama)")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise _fail("tokenizer.ggml.tokens is missing or not a list of strings")
        n = len(tokens)
        self.tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        if len(self.ids) != n:
            seen: set[str] = set()
            dup = next(t for t in self.tokens if t in seen or seen.add(t))  # type: ignore[func-returns-value]
            raise _fail(f"duplicate token {dup!r} in tokenizer.ggml.tokens")
        types = _ints(meta.get("tokenizer.ggml.token_type"), n, "tokenizer.ggml.token_type")
        self.types = types or [NORMAL] * n
        self.scores = [float(s) for s in meta.get("tokenizer.ggml.scores", [0.0] * n)][:n]
        if len(self.scores) < n:
            raise _fail(f"tokenizer.ggml.scores has {len(self.scores)} entries for {n} tokens")
        self.chat_template = meta.get("tokenizer.chat_template")
        self._special_ids(meta, n)
        self._mark_special()
        if self.model == "gpt2":
            self._init_bpe(meta)
        else:
            self.pre, self.ignore_merges = "default", False
            self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
            self.add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
            byte_ids = (self.ids.get(f"<0x{b:02X}>", self.ids.get(chr(b))) for b in range(256))
            self._bytes = dict(enumerate(byte_ids))  # byte -> its token (fallback spelling)
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        for flag, token in (("add_bos", self.bos_id), ("add_eos", self.eos_id)):
            if getattr(self, flag) and token is None:
                raise _fail(f"tokenizer.ggml.{flag}_token is true, but the token id is not set")

    # -- construction ----------------------------------------------------------------------------

    def _special_ids(self, meta: dict[str, Any], n: int) -> None:
        """Special token ids: the file's, else llama.cpp's defaults for the model type (an id
        outside the vocabulary disables the default, and a bad id from the file is ignored)."""
        spm = self.model == "llama"
        defaults = {"bos": 1 if spm else 11, "eos": 2 if spm else 11, "unknown": 0 if spm else None}
        found: dict[str, int | None] = {}
        for key in ID_KEYS:
            value = defaults.get(key)
            if value is not None and value >= n:
                value = None
            given = meta.get(f"tokenizer.ggml.{key}_token_id")
            if isinstance(given, int) and not isinstance(given, bool) and 0 <= given < n:
                value = given
            found[key] = value
        self.bos_id, self.eos_id, self.unk_id = found["bos"], found["eos"], found["unknown"]
        self.pad_id = found["padding"]
        self.eot_id = found["eot"]
        if self.eot_id is None:  # llama.cpp finds an end-of-turn token by its name (which one
            # when several are present is unspecified there: here the first in EOT_NAMES)
            self.eot_id = next((self.ids[t] for t in EOT_NAMES if t in self.ids), None)
        eog = {i for i, t in enumerate(self.tokens) if t in EOG_NAMES or t in FIM_EOG_NAMES}
        eog |= {i for i in (self.eos_id, self.eot_id, found["eom"]) if i is not None}
        self.eog_ids = frozenset(eog)

    def _mark_special(self) -> None:
        """The ids cut out of text before encoding, longest first: ``(text, id, is control or
        unknown)`` (llama.cpp's special-token cache), with its name-based corrections."""
        types = list(self.types)
        for i, t in enumerate(self.tokens):
            if t in ALWAYS_USER_DEFINED:
                types[i] = USER_DEFINED
            elif t in EOG_NAMES or t in FIM_NAMES or t in FIM_EOG_NAMES:
                # llama.cpp adds its control flag to these names, a user-defined one too (Gemma
                # 3's "</s>"): then it is cut out of text only with parse_special
                if types[i] not in (CONTROL, UNKNOWN):
                    types[i] = CONTROL
            elif i in self.eog_ids:
                if types[i] not in (CONTROL, USER_DEFINED, UNKNOWN):
                    types[i] = CONTROL
        self._types = types
        special = [(t, i, types[i] != USER_DEFINED) for i, t in enumerate(self.tokens)
                   if types[i] in (CONTROL, USER_DEFINED, UNKNOWN)]  # fmt: skip
        self._partition = sorted(special, key=lambda s: -len(s[0].encode("utf-8")))

    def _init_bpe(self, meta: dict[str, Any]) -> None:
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_NAMES:
            raise _fail(
                f"tokenizer.ggml.pre {pre!r} is not supported (supported: "
                f"{', '.join(sorted(PRE_NAMES))})"
            )
        self.pre = pre
        kind, flags = PRE_NAMES[pre]
        self.ignore_merges = flags.get("ignore_merges", False)
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", flags.get("add_bos", False)))
        self.add_space_prefix = False
        merges = meta.get("tokenizer.ggml.merges")
        if not isinstance(merges, list):
            raise _fail("tokenizer.ggml.merges is missing (a gpt2 tokenizer needs its merges)")
        doc = {
            "model": {"type": "BPE", "vocab": self.ids, "merges": merges,
                      "ignore_merges": self.ignore_merges},
            "pre_tokenizer": hf_pre_tokenizer(kind),
        }  # fmt: skip
        self._bpe = HFByteBPETokenizer(doc, merge_split=_llama_cpp_split)
        doc["model"]["merges"] = []  # held as ranks by the BPE now; the file's are in metadata

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str] | Any) -> GGUFTokenizer:
        """The tokenizer of a GGUF file (a path or an opened
        :class:`attnlm.base.ggufio.GGUFFile`)."""
        from attnlm.base.ggufio import GGUFFile

        header = path if isinstance(path, GGUFFile) else GGUFFile(path)
        try:
            return cls(header.metadata)
        except TokenizerFileError as e:
            raise TokenizerFileError(f"{header.path}: {e}") from None

    # -- encoding --------------------------------------------------------------------------------

    def encode(
        self, text: str, add_special_tokens: bool = False, parse_special: bool = True
    ) -> list[int]:
        """Token ids of ``text``. ``add_special_tokens``: BOS / EOS as the file's
        ``add_bos_token`` / ``add_eos_token`` say; ``parse_special``: control tokens written
        in the text become their ids (user-defined tokens always do)."""
        check_text(text)
        out: list[int] = []
        if add_special_tokens and self.add_bos:
            out.append(self.bos_id)  # type: ignore[arg-type]
        prev_special = True  # SentencePiece: a space prefix at the start and after a special
        for piece, token in self._cut(text, parse_special):
            if token is not None:
                out.append(token)
                prev_special = True
            elif self.model == "gpt2":
                out += self._bpe.encode(piece)
            else:
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                out += self._spm(piece.replace(" ", SPACE))
                prev_special = False
        if add_special_tokens and self.add_eos:
            out.append(self.eos_id)  # type: ignore[arg-type]
        return out

    def _cut(self, text: str, parse_special: bool) -> list[tuple[str, int | None]]:
        """``text`` cut into ``(text, None)`` pieces and ``("", id)`` special tokens: each
        special token in turn, longest first, splits every piece of text still unsplit."""
        parts: list[tuple[str, int | None]] = [(text, None)] if text else []
        for token, i, control in self._partition:
            if control and not parse_special:
                continue
            nxt: list[tuple[str, int | None]] = []
            for piece, tid in parts:
                if tid is not None or token not in piece:
                    nxt.append((piece, tid))
                    continue
                for k, chunk in enumerate(piece.split(token)):
                    if k:
                        nxt.append(("", i))
                    if chunk:
                        nxt.append((chunk, None))
            parts = nxt
        return parts

    def _spm(self, text: str) -> list[int]:
        """llama.cpp's SentencePiece BPE on one piece: start from characters, repeatedly merge
        the adjacent pair whose concatenation is the token with the highest score (leftmost
        among equals), then spell what is not a token in byte tokens."""
        symbols: list[str] = list(text)
        n = len(symbols)
        nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
        ids, scores = self.ids, self.scores
        heap: list[tuple[float, int, int, str]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right >= n:
                return
            merged = symbols[left] + symbols[right]
            i = ids.get(merged)
            if i is not None:
                heapq.heappush(heap, (-scores[i], left, right, merged))

        for k in range(n - 1):
            push(k, k + 1)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != merged:
                continue  # stale: one side has merged since
            symbols[left], symbols[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[left] < n:
                prv[nxt[left]] = left
            push(prv[left], left)
            push(left, nxt[left])
        out: list[int] = []
        for s in symbols:
            if not s:
                continue
            i = ids.get(s)
            if i is not None:
                out.append(i)
                continue
            for b in s.encode("utf-8"):
                tok = self._bytes[b]
                if tok is None:
                    tok = self.unk_id
                if tok is not None:
                    out.append(tok)
        return out

    # -- decoding and the protocol ----------------------------------------------------------------

    def token_bytes(self, i: int) -> bytes:
        """The bytes token ``i`` stands for (a special token: its text)."""
        if not isinstance(i, int) or not 0 <= i < len(self.tokens):
            raise InvalidTokenIdError(
                f"token id {i!r} is not in the vocabulary (size {self.vocab_size})"
            )
        text, kind = self.tokens[i], self._types[i]
        if kind in (CONTROL, USER_DEFINED, UNKNOWN):
            return text.encode("utf-8")
        if kind == BYTE and len(text) == 6 and text.startswith("<0x"):
            return bytes([int(text[3:5], 16)])
        if self.model == "llama":
            return text.replace(SPACE, " ").encode("utf-8")
        if all(c in CHAR_TO_BYTE for c in text):
            return bytes(CHAR_TO_BYTE[c] for c in text)
        return text.encode("utf-8")

    def _pieces(self, ids: Iterable[int], skip_special_tokens: bool) -> list[bytes]:
        return [
            self.token_bytes(i)
            for i in ids
            if not (skip_special_tokens and self._types[i] in (CONTROL, UNKNOWN))
        ]

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        """The bytes of ``ids``; ``skip_special_tokens`` leaves control and unknown tokens out
        (llama.cpp's ``token_to_piece`` without ``special``)."""
        return b"".join(self._pieces(ids, skip_special_tokens))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; SentencePiece-style: without the space the encoder put in front
        (one space off the first piece, as SentencePiece and llama.cpp decode)."""
        pieces = self._pieces(ids, skip_special_tokens)
        if self.add_space_prefix and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_text(self, i: int) -> str:
        return self.token_bytes(i).decode("utf-8", errors="backslashreplace")

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def token_types(self) -> list[int]:
        """Each token's type as encoding uses it: the file's ``token_type`` with llama.cpp's
        corrections by name (end-of-generation and fill-in-the-middle names are control tokens,
        a few chat markers user-defined)."""
        return list(self._types)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Control, user-defined and unknown tokens (those cut out of text before encoding)."""
        return {t: i for t, i, _ in self._partition}

    def to_dict(self) -> dict[str, Any]:
        return {"metadata": {k: _plain(v) for k, v in self.metadata.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GGUFTokenizer:
        return cls(data["metadata"])

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size})"


def _plain(value: Any) -> Any:
    """A metadata value as JSON data (numpy arrays and scalars as lists and numbers)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def gguf_chat_setup(tok: GGUFTokenizer, origin: str) -> tuple[Any, tuple[int, ...]]:
    """The chat template of a GGUF tokenizer (its ``tokenizer.chat_template`` with the file's
    special tokens; None without one; ``origin`` names it in errors) and the ids that end a
    reply (EOS, the end-of-turn token, :data:`~attnlm.tokenizers.chat_template.END_OF_TURN`)."""
    from attnlm.tokenizers.chat_template import from_string, stop_ids

    ids = {"bos_token": tok.bos_id, "eos_token": tok.eos_id, "unk_token": tok.unk_id,
           "pad_token": tok.pad_id}  # fmt: skip
    special = {key: tok.tokens[i] for key, i in ids.items() if i is not None}
    template = None
    if isinstance(tok.chat_template, str) and tok.chat_template.strip():
        template = from_string(tok.chat_template, **special)
        template.origin = origin
    from attnlm.tokenizers.harmony import harmony_stops

    named = tuple(i for i in (tok.eos_id, tok.eot_id) if i is not None)
    stops = tuple(dict.fromkeys(named + stop_ids(tok, special, None)))
    return template, harmony_stops(dict(tok.special_tokens), stops)
