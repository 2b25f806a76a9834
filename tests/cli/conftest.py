"""Fixtures of the command-line tests: the files and checkpoints the bad-input table and the
input fuzz test run commands on (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import tiny_translation_run

CORPUS = "the cat sat on the mat\nthe dog sat on the log\n" * 30
PAIRS_TEXT = [("one two", "eins zwei"), ("three", "drei"), ("two one", "zwei eins")]


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> dict[str, str]:
    """The fixtures the placeholders name (built once per module)."""
    from attnlm.ngram import train
    from attnlm.tokenizers import BPETokenizer, CharTokenizer

    d = tmp_path_factory.mktemp("bad_input")
    text = d / "corpus.txt"
    text.write_text(CORPUS, encoding="utf-8")
    (d / "binary.txt").write_bytes(b"caf\xe9 au lait\n")
    (d / "empty.txt").write_text("")
    (d / "emptydir").mkdir()
    (d / "folder").mkdir()
    (d / "corrupt.json").write_text("{not json")
    (d / "corrupt.arpa").write_text("\\data\\\nngram 1=x\n")
    (d / "binary.toml").write_bytes(b'[train]\ntext = "caf\xe9"\n')
    tok = d / "tok.json"
    CharTokenizer.train(CORPUS).save(tok)
    BPETokenizer.train(CORPUS, 260).save_tiktoken(d / "r.tiktoken")
    import json

    doc = json.loads(tok.read_text())
    bpe = BPETokenizer.train(CORPUS, 260).to_dict()
    bpe["special_tokens"] = {"<|endoftext|>": 10**12}
    doc = {**{k: doc[k] for k in ("format", "version")}, "kind": "bpe", **bpe}
    (d / "absurd.json").write_text(json.dumps(doc))
    absurd_doc = doc
    sents = [line.split() for line in CORPUS.splitlines()]
    model = train(sents, 2)
    model.save(d / "model.npz")
    import numpy as np

    with np.load(d / "model.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "logp2"}
    np.savez(d / "bad.npz", **arrays)
    from attnlm.ngram.arpa import write_arpa

    write_arpa(model, d / "good.arpa")
    arpa = (d / "good.arpa").read_text().splitlines()
    first = next(i for i, s in enumerate(arpa) if s.startswith("\\2-grams:")) + 1
    arpa[first] = "nan" + arpa[first][arpa[first].index("\t") :]
    (d / "nan.arpa").write_text("\n".join(arpa) + "\n")
    _checkpoints(d, text, absurd_doc)
    tiny_translation_run(d / "mt", PAIRS_TEXT)
    (d / "vec.txt").write_text("3 2\ncat 0.1 0.2\ndog 0.3 0.1\nmat 0.2 0.2\n", encoding="utf-8")
    (d / "wordsim.tsv").write_text("cat\tdog\t5.0\ncat\tmat\t3.0\ndog\tmat\t1.0\n")
    (d / "analogies.txt").write_text(": animals\ncat dog mat cat\n")
    (d / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS_TEXT), encoding="utf-8")
    (d / "greek.txt").write_text("\u03a9\u03a9\u03a9 \u03b1\u03b2\n" * 5, encoding="utf-8")
    (d / "bad_type.toml").write_text("[model]\ntype = 3\n[train]\nmax_iters = 1\n")
    (d / "unknown_family.toml").write_text('[model]\ntype = "bogus"\n[train]\nmax_iters = 1\n')
    other = d / "otherrun"
    (other / "checkpoint").mkdir(parents=True)
    (other / "data.json").write_text("{}")
    return {
        "text": str(text),
        "binary": str(d / "binary.txt"),
        "empty": str(d / "empty.txt"),
        "emptydir": str(d / "emptydir"),
        "dir": str(d / "folder"),
        "missing": str(d / "no-such-file"),
        "corrupt": str(d / "corrupt.json"),
        "corrupt_arpa": str(d / "corrupt.arpa"),
        "tok": str(tok),
        "tiktoken": str(d / "r.tiktoken"),
        "absurd": str(d / "absurd.json"),
        "model": str(d / "model.npz"),
        "bad_npz": str(d / "bad.npz"),
        "nan_arpa": str(d / "nan.arpa"),
        "binary_toml": str(d / "binary.toml"),
        "otherrun": str(other),
        "out": str(d / "out" / "result.json"),
        "outdir": str(d / "demo-out"),
        "trainout": str(d / "demo-out"),  # no row may create it either
        "ckpt": str(d / "run"),
        "crafted_run": str(d / "crafted"),
        "garbage_run": str(d / "garbage"),
        "absurd_ckpt": str(d / "absurd_ckpt"),
        "mismatch_ckpt": str(d / "mismatch_ckpt"),
        "greek": str(d / "greek.txt"),
        "bad_type_toml": str(d / "bad_type.toml"),
        "unknown_family_toml": str(d / "unknown_family.toml"),
        "png": str(d / "attn" / "a.png"),
        "mt": str(d / "mt"),
        "pairs": str(d / "pairs.tsv"),
        "vectors": str(d / "vec.txt"),
        "wordsim": str(d / "wordsim.tsv"),
        "analogies": str(d / "analogies.txt"),
    }


def _checkpoints(d: Path, text: Path, absurd_doc: dict) -> None:
    """A tiny GPT checkpoint (``run``) and broken copies of it: a crafted pickle and garbage
    as ``state.pt``, a tokenizer declaring absurd ids, a tokenizer bigger than the model."""
    import dataclasses
    import json
    import shutil
    from fractions import Fraction

    import torch

    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models import registry
    from attnlm.tokenizers import CharTokenizer
    from attnlm.train.config import TrainConfig

    tok = CharTokenizer.train(CORPUS)
    table = {"type": "gpt", "vocab_size": tok.vocab_size, "block_size": 16, "n_layer": 1}
    table.update(n_head=1, n_embd=8)
    torch.manual_seed(0)
    model, cfg, family = registry.build(table)
    train = dataclasses.asdict(TrainConfig(text=str(text), max_iters=1, threads=1))
    config = {"step": 1, "preset": "tiny-test", "model": registry.config_table(family, cfg)}
    config["train"] = train
    state = {"step": torch.tensor(1)}
    save_checkpoint(d / "run" / "checkpoint", model, config, tok, state)
    for name in ("crafted", "garbage", "absurd_ckpt", "mismatch_ckpt"):
        shutil.copytree(d / "run", d / name)
    torch.save({"step": Fraction(1, 3)}, d / "crafted" / "checkpoint" / "state.pt")
    (d / "garbage" / "checkpoint" / "state.pt").write_bytes(b"PK\x03\x04 not a zip\n" * 50)
    (d / "absurd_ckpt" / "checkpoint" / "tokenizer.json").write_text(json.dumps(absurd_doc))
    big = CharTokenizer.train(CORPUS + "QXZJKV0123456789")
    big.save(d / "mismatch_ckpt" / "checkpoint" / "tokenizer.json")
