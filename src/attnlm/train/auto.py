"""A language-model setup sized for the user's own corpus: what ``attnlm train --text FILE``
uses when no ``--preset`` is given.

The recipe is ``shakespeare-char``'s (a rotary GPT, short warmup, cosine to the end of the
run, :file:`configs/shakespeare-char.toml`), with the tokenizer and the model size chosen from
the corpus:

* **tokenizer**: characters for a corpus under :data:`CHAR_LIMIT` characters (a small corpus
  has too few repetitions to learn subwords from, and characters leave no word unknown);
  above it a byte-level BPE whose vocabulary is sized from the corpus
  (``bpe_vocab_size = 0``, :func:`attnlm.tokenizers.sizing.vocab_size_for`): each token then
  stands for several characters, so a window sees more text;
* **model**: by the number of training tokens (characters, or characters / 4 for BPE), from a
  2-layer, width-64 model with dropout for a small text (which a larger one would memorise in
  a few minutes) to 6 layers of width 192 for tens of millions of tokens (:data:`SIZES`).

Settings given explicitly (``--tokenizer``, ``--set model.n_layer=...``, other flags) are
applied on top and win. :func:`describe` is the line ``attnlm train`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAR_LIMIT = 2_000_000  # characters: below, a character tokenizer; above, BPE
BPE_CHARS_PER_TOKEN = 4.0  # about what a byte-level BPE gives on English prose
BASE_PRESET = "shakespeare-char"

# (fewer training tokens than, name, [model] fields)
SIZES: tuple[tuple[float, str, dict[str, Any]], ...] = (
    (2e5, "small", {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64, "dropout": 0.1}),
    (2e7, "medium", {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "dropout": 0.0}),
    (float("inf"), "large",
     {"n_layer": 6, "n_head": 6, "n_embd": 192, "block_size": 128, "dropout": 0.0}),
)  # fmt: skip


@dataclass(frozen=True)
class AutoSetup:
    """What :func:`choose` picked for a corpus."""

    chars: int
    distinct: int
    tokenizer: str
    size: str
    model: dict[str, Any]

    def tables(self) -> dict[str, dict[str, Any]]:
        """The preset tables: the base recipe with this tokenizer and model size."""
        from attnlm.base.config import load_preset

        base = load_preset(BASE_PRESET)
        model = {**base.get("model", {}), **self.model}
        train = {**base.get("train", {}), "tokenizer": self.tokenizer, "bpe_vocab_size": 0}
        return {"model": model, "train": train}

    def describe(self, what: str) -> str:
        m = self.model
        tok = ("characters" if self.tokenizer == "char"
               else "byte-level BPE, vocabulary sized from the corpus")  # fmt: skip
        return (
            f"auto setup for {what} ({self.chars:,} characters, {self.distinct:,} distinct): "
            f"tokenizer {self.tokenizer} ({tok}); {self.size} GPT, {m['n_layer']} layers x "
            f"{m['n_head']} heads, width {m['n_embd']}, window {m['block_size']}, dropout "
            f"{m['dropout']} (the {BASE_PRESET} recipe; --preset, --tokenizer or --set "
            "override it)"
        )


def choose(chars: int, distinct: int, tokenizer: str | None = None) -> AutoSetup:
    """The setup for a corpus of ``chars`` characters with ``distinct`` distinct ones;
    ``tokenizer``: one the user gave (the size then follows its tokens)."""
    kind = tokenizer or ("char" if chars < CHAR_LIMIT else "bpe")
    tokens = chars if kind == "char" else chars / BPE_CHARS_PER_TOKEN
    size, model = next((name, dict(m)) for limit, name, m in SIZES if tokens < limit)
    return AutoSetup(chars=chars, distinct=distinct, tokenizer=kind, size=size, model=model)


def auto_setup(text_path: str, tokenizer: str | None = None) -> AutoSetup:
    """Read the corpus at ``text_path`` (a file or a folder of ``.txt`` files) and
    :func:`choose` its setup."""
    from attnlm.data.corpus import load_text

    text = load_text(text_path)
    return choose(len(text), len(set(text)), tokenizer)
