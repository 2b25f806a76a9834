"""`attnlm demo` end to end on a tiny preset and text (the real demo trains for minutes); the
real-LLM coda (SmolLM2: a chat turn, the logit lens, activation patching, 40 scored examples)
on its own, marked slow (each of its parts has its own quick tests: generate/test_chat,
inspect/test_lens, inspect/test_experiments, tasks/)."""

import pytest
import torch

from attnlm.cli import main


def test_demo_writes_everything(romeo_file, tmp_path, capsys):
    corpus = romeo_file
    out = tmp_path / "demo"
    threads = torch.get_num_threads()
    try:
        argv = ["demo", "--preset", "tiny-test", "--text", str(corpus), "--out", str(out)]
        budgets = ["--time-budget", "2s", "--translate-budget", "3s", "--compare-budget", "1s"]
        assert main([*argv, *budgets, "--threads", "1", "--no-llm"]) == 0
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
    assert "skipped the LLM coda" not in printed and "a real LLM" not in printed  # --no-llm
    # the static side: ROMEO has no "bank"
    assert "(no static vector: 'bank' is rare in this text)" in printed


def test_demo_static_bank_is_one_word2vec_vector(tmp_path):
    from attnlm.apps.demo import BANK_SENTENCES, static_bank

    words = "bank river money water cash shore the of".split()
    lines = [" ".join(words[(k + j) % len(words)] for j in range(12)) for k in range(400)]
    text = tmp_path / "t.txt"
    text.write_text("\n\n".join(lines), encoding="utf-8")
    printed = []
    saved = tmp_path / "vectors.txt"
    static = static_bank(printed.append, str(text), threads=1, save=saved)
    from attnlm.word2vec.vectors import WordVectors

    # the file the demo's hint names holds the same vector for "bank"
    loaded = WordVectors.load(saved)
    bank = torch.as_tensor(loaded.vector("bank")).float()
    assert torch.cosine_similarity(bank, static.vectors[0].float(), dim=0) > 1 - 1e-5
    assert len(BANK_SENTENCES) == 3 and torch.allclose(static.cosine(), torch.ones(3, 3))
    assert all((row == static.vectors[0]).all() for row in static.vectors)
    assert "one vector for 'bank' in every sentence" in "\n".join(printed)
    assert {w for w, _ in static.neighbours} <= set(words) - {"bank"}


@pytest.mark.slow
def test_the_llm_coda(tmp_path):
    """One chat turn, the lens table and its PNG, or a one-line note when SmolLM2 is missing."""
    from attnlm.apps.demo import llm_demo

    lines: list[str] = []
    png = llm_demo(tmp_path, log=lines.append)
    printed = "\n".join(lines)
    if png is None:
        assert "skipped the LLM coda" in printed and len(lines) == 1
        return
    assert "assistant: The capital of France is Paris." in printed
    lens = printed[printed.index("== the logit lens") :].splitlines()
    assert lens[2].startswith("layer 30") and "Paris" in lens[2]
    assert png == tmp_path / "lens.png" and png.read_bytes()[:4] == b"\x89PNG"
