"""`attnlm demo` end to end on a tiny preset and text (the real demo trains for minutes)."""

import torch

from attnlm.cli import main
from support import ROMEO


def test_demo_writes_everything(tmp_path, capsys):
    corpus = tmp_path / "plays.txt"
    corpus.write_text(ROMEO, encoding="utf-8")
    out = tmp_path / "demo"
    threads = torch.get_num_threads()
    try:
        argv = ["demo", "--preset", "tiny-test", "--text", str(corpus), "--out", str(out)]
        budgets = ["--time-budget", "2s", "--translate-budget", "3s", "--compare-budget", "1s"]
        assert main([*argv, *budgets, "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "tokenizer: CharTokenizer" in printed
    assert "bits/char" in printed and printed.count("--- sample") == 3
    for name in (
        "checkpoint/model.safetensors",
        "metrics.jsonl",
        "loss_curve.png",
        "attention.png",
    ):
        assert (out / name).is_file(), name
        assert str(out / name.split("/")[0]) in printed
    assert (out / "attention.png").read_bytes()[:4] == b"\x89PNG"
    # the translation part: examples, BLEU, an alignment plot
    assert printed.count("(reference: ") == 3 and "BLEU " in printed
    assert (out / "translate" / "alignment.png").read_bytes()[:4] == b"\x89PNG"
    # the compare part: one row per family, scored in bits per character
    table = printed[printed.index("val bits/char") :].splitlines()
    assert [row.split()[0] for row in table[2:7]] == ["ngram", "hmm", "ffnn", "lstm", "gpt"]
    assert (out / "compare" / "compare.json").is_file()
    # the MiniLM coda: the bank table when the wheel is available, else a one-line note
    assert "cos(S1,S2)" in printed or "skipped the BERT coda" in printed
