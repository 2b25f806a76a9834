"""The commands that read a damaged file exit 2 with one line naming it (the cases the
reliability probe found: ``eval`` printing ``loss: nan`` for NaN weights, ``ngram score``
giving a wrong perplexity for garbage arrays, a word2vec header asking for 35 PiB, a cut zstd
corpus read as "1 bad record", a ``--pairs`` path to ``/dev/zero``, a config asking for 10**12
layers). The library readers are covered format by format in
``tests/base/test_damaged_files.py``; these check the command-line end of the same path."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from attnlm.cli import main
from support import attnlm_process


def _one_line_error(capsys, argv: list[str], *names: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("attnlm: error: "), err
    assert all(n in lines[0] for n in names), lines[0]
    return lines[0]


def _nan_checkpoint(files, tmp_path):
    run = tmp_path / "nanrun"
    shutil.copytree(files["ckpt"], run)
    weights = run / "checkpoint" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8 : 8 + n])
    first = next(v for k, v in head.items() if k != "__metadata__" and v["dtype"] == "F32")
    at = 8 + n + first["data_offsets"][0]
    data[at : at + 4] = struct.pack("<f", float("nan"))
    weights.write_bytes(bytes(data))
    return run


@pytest.mark.parametrize("command", [["eval"], ["generate", "--max-new-tokens", "1"]])
def test_nan_weights_are_refused_at_load(files, tmp_path, capsys, command):
    run = _nan_checkpoint(files, tmp_path)
    line = _one_line_error(capsys, [*command, "--checkpoint", str(run)], "model.safetensors")
    assert "NaN" in line


def test_garbage_npz_arrays_are_refused(files, tmp_path, capsys):
    with np.load(files["model"]) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["logp2"] = np.abs(arrays["logp2"]) + 3.0  # log-probabilities above 0: not a model
    np.savez(tmp_path / "garbage.npz", **arrays)
    _one_line_error(
        capsys,
        ["ngram", "score", "--model", str(tmp_path / "garbage.npz"), "--text", files["text"]],
        "garbage.npz",
    )


def test_word2vec_header_asking_for_petabytes(tmp_path, capsys):
    vec = tmp_path / "huge.txt"
    vec.write_text("99999999 99999999\ncat 0.1 0.2\n")
    line = _one_line_error(capsys, ["word2vec", "similar", "--vectors", str(vec), "cat"], "huge")
    assert "header" in line


def test_cut_zstd_corpus_is_an_error_even_with_skip_bad(tmp_path, capsys):
    zstandard = pytest.importorskip("zstandard")
    docs = "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(2000))
    data = zstandard.ZstdCompressor().compress(docs.encode())
    corpus = tmp_path / "docs.jsonl.zst"
    corpus.write_bytes(data[: len(data) * 7 // 8])
    out = tmp_path / "prepared"
    argv = ["data", "prepare", "--text", str(corpus), "--out", str(out), "--skip-bad",
            "--tokenizer", "char", "--no-progress"]  # fmt: skip
    line = _one_line_error(capsys, argv, "docs.jsonl.zst")
    assert "truncated" in line


def test_absurd_layer_count_is_refused_before_building(tmp_path, capsys):
    preset = tmp_path / "huge.toml"
    preset.write_text(
        '[model]\ntype = "gpt"\nn_layer = 1000000000000\nn_head = 2\nn_embd = 8\n'
        "block_size = 8\n[train]\nmax_iters = 1\n"
    )
    line = _one_line_error(capsys, ["params", "--preset", str(preset)], "memory")
    assert "parameters" in line


def test_pairs_path_to_dev_zero_is_bounded(tmp_path):
    zero = tmp_path / "zero.tsv"
    zero.symlink_to("/dev/zero")
    # under 3 GB of address space: reading /dev/zero whole would be killed, not refused
    proc = attnlm_process("data", "pairs", "--pairs", zero, timeout=120, preexec_fn=_limit_memory)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "NUL" in lines[0], proc.stderr[-2000:]


def test_files_inside_model_and_run_folders_that_are_dev_zero_cost_one_block(files, tmp_path):
    """A Hugging Face folder whose ``config.json`` is a symlink to ``/dev/zero`` (read whole
    to tell the folder's kind), and a compare family's ``result.json`` that is one (read whole
    to reuse it): one line naming the folder, and a result run again, under 3 GB."""
    from attnlm.cli import main as run_main
    from gguf_export_support import tiny_run

    source = tiny_run(tmp_path / "llama", "llama")
    assert run_main(["export", "--model", str(source), "--out", str(tmp_path / "hf")]) == 0
    (tmp_path / "hf" / "config.json").unlink()
    (tmp_path / "hf" / "config.json").symlink_to("/dev/zero")
    proc = attnlm_process("generate", "--model", tmp_path / "hf", "--prompt", "the",
                          timeout=120, preexec_fn=_limit_memory)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert str(tmp_path / "hf") in lines[0] and "out of memory" not in lines[0]
    out = tmp_path / "cmp"
    (out / "ngram").mkdir(parents=True)
    (out / "ngram" / "result.json").symlink_to("/dev/zero")
    proc = attnlm_process("compare", "--text", files["text"], "--time-budget", "1s", "--models",
                          "ngram", "--out", out, "--no-progress", "--val-chars", "200",
                          timeout=120, preexec_fn=_limit_memory)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "ngram" / "result.json").is_file()  # computed again, written as a file


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


# ---------------------------------------------------------------- inputs longer than a command uses


def test_attention_target_is_bounded(files, capsys):
    from attnlm.inspect.translation import MAX_INSPECT_TOKENS

    target = "a " * (MAX_INSPECT_TOKENS + 10)
    argv = ["attention", "--checkpoint", files["mt"], "hello", target,
            "--out", files["png"]]  # fmt: skip
    line = _one_line_error(capsys, argv, "target", f"{MAX_INSPECT_TOKENS:,}")
    assert "tokens long" in line


def test_hmm_limits(tmp_path, capsys):
    from dataclasses import asdict

    from attnlm.base.errors import ConfigError
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models import registry
    from attnlm.models.hmm import MAX_STATES, MAX_VITERBI_TOKENS, HMMConfig
    from attnlm.tokenizers.char import CharTokenizer

    with pytest.raises(ConfigError, match=f"n_states must be at most {MAX_STATES:,}"):
        HMMConfig(vocab_size=10, n_states=20_000)
    tok = CharTokenizer.train("ab")
    model, cfg, family = registry.build({"type": "hmm", "vocab_size": tok.vocab_size,
                                         "n_states": 3})  # fmt: skip
    config = {"step": 1, "model": registry.config_table(family, cfg), "train": {}}
    save_checkpoint(tmp_path / "run" / "checkpoint", model, config, tok, {"step": 1})
    run = str(tmp_path / "run")
    _one_line_error(
        capsys,
        ["hmm", "viterbi", "--checkpoint", run, "ab" * MAX_VITERBI_TOKENS],
        f"{MAX_VITERBI_TOKENS:,}",
    )
    assert main(["hmm", "viterbi", "--checkpoint", run, "abba"]) == 0
    assert asdict(cfg)["n_states"] == 3


def test_fill_mask_never_drops_a_mask_beyond_the_window():
    from pathlib import Path

    from attnlm.base.errors import InputError
    from attnlm.inspect.fill_mask import fill_mask
    from attnlm.models import registry
    from attnlm.tokenizers.wordpiece import load_bert_files

    vocab = Path(__file__).resolve().parents[1] / "fixtures" / "bert-base-uncased-vocab.txt"
    tok = load_bert_files(vocab)
    model, _, _ = registry.build({"type": "bert", "vocab_size": tok.vocab_size, "block_size": 16,
                                  "n_layer": 1, "n_head": 2, "n_embd": 8})  # fmt: skip
    assert len(fill_mask(model, tok, "the [MASK] sat on the mat")) == 1  # within the window
    long = "the [MASK] sat " + "on the mat " * 10 + "with a [MASK]"
    with pytest.raises(InputError, match=r"1 of the 2 \[MASK\] tokens fall beyond"):
        fill_mask(model, tok, long)
    with pytest.raises(InputError, match="every \\[MASK\\] falls beyond"):
        fill_mask(model, tok, "on the mat " * 10 + "with a [MASK]")
