"""Preparing a run's data: train (or load) the tokenizer, tokenize the corpus once into memmaps.

The run folder keeps ``tokenizer.json`` and, next to it, ``train.bin`` / ``val.bin`` (flat id
arrays, see :mod:`attnlm.data.windows`) with their JSON metadata. A resumed run reuses them.

The character tokenizer's alphabet is taken from the whole text (so validation characters are
encodable); a BPE tokenizer is trained on the training split only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlm.data.corpus import load_text, split_text
from attnlm.data.windows import TokenFile, read_token_file, write_token_file
from attnlm.errors import InputError
from attnlm.tokenizers import encode_text, make_tokenizer
from attnlm.train.config import TrainConfig


@dataclass
class RunData:
    """Tokenizer and tokenized splits of a run."""

    tokenizer: Any
    train: TokenFile
    val: TokenFile
    seconds: float = 0.0  # time spent training the tokenizer and encoding (0 when reused)

    def stats_line(self) -> str:
        """One line of tokenizer statistics (kind, vocabulary, tokens, characters per token)."""
        kind = type(self.tokenizer).__name__
        n_tok = self.train.n_tokens + self.val.n_tokens
        n_chr = self.train.n_chars + self.val.n_chars
        took = f" in {self.seconds:.1f}s" if self.seconds else ""
        return (
            f"tokenizer: {kind}, vocab {self.tokenizer.vocab_size:,}; corpus {n_chr:,} chars -> "
            f"{n_tok:,} tokens ({n_chr / max(n_tok, 1):.2f} chars/token; train "
            f"{self.train.n_tokens:,}, val {self.val.n_tokens:,}){took}"
        )


def prepare(run_dir: Path, cfg: TrainConfig) -> RunData:
    """Tokenize the corpus into ``run_dir`` (or reuse what is there) and return it."""
    import time

    from attnlm import tokenizers

    tok_path = run_dir / "tokenizer.json"
    train_path, val_path = run_dir / "train.bin", run_dir / "val.bin"
    sig_path = run_dir / "data.json"
    signature = {
        "text": cfg.text,
        "tokenizer": cfg.tokenizer,
        "bpe_vocab_size": cfg.bpe_vocab_size,
        "val_fraction": cfg.val_fraction,
    }
    if all(p.is_file() for p in (tok_path, train_path, val_path, sig_path)):
        try:
            same = json.loads(sig_path.read_text(encoding="utf-8")) == signature
        except ValueError:
            same = False
        if same:
            tok = tokenizers.load(tok_path)
            return RunData(tok, read_token_file(train_path), read_token_file(val_path))
    t0 = time.perf_counter()
    text = load_text(cfg.text)
    train_text, val_text = split_text(text, cfg.val_fraction)
    if not val_text:
        raise InputError("the text is too short to hold out a validation split")
    tok = make_tokenizer(cfg.tokenizer, text, train_text, cfg.bpe_vocab_size)
    v = tok.vocab_size
    train_ids = encode_text(tok, train_text, "training text")
    val_ids = encode_text(tok, val_text, "validation text")
    if len(train_ids) < 2 or len(val_ids) < 2:
        raise InputError("the text is too short: need at least 2 tokens in each split")
    run_dir.mkdir(parents=True, exist_ok=True)
    sig_path.unlink(missing_ok=True)
    train = write_token_file(train_ids, train_path, v, len(train_text))
    val = write_token_file(val_ids, val_path, v, len(val_text))
    tmp = run_dir / "tokenizer.json.tmp"
    tok.save(tmp)
    os.replace(tmp, tok_path)
    sig_path.write_text(json.dumps(signature), encoding="utf-8")  # last: the data is complete
    return RunData(tok, train, val, seconds=time.perf_counter() - t0)
