"""Outputs are what they claim (docs/reliability.md): ``compare`` reuses a family's result only
for the same corpus content, treats a damaged ``result.json`` as missing and refuses ``--out
FILE``; ``attention --kind self`` on a model without self-attention, ``serve --host ''`` and an
error message that UTF-8 cannot encode each get one line (or an answer), not a traceback."""

from __future__ import annotations

import json

import pytest

import attnlm.apps.compare as compare
from support import CITIZENS, ROMEO, attnlm_process, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run_compare(capsys, tmp_path, text, out=None):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    out = tmp_path / "cmp" if out is None else out
    argv = ["compare", "--text", corpus, "--budget", "1s", "--models", "ngram", "--out", out]
    return run_cli(capsys, *argv, "--no-progress", "--val-chars", "200")


def bpc(tmp_path):
    return json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"][0]["val_bpc"]


def test_compare_reruns_a_family_when_the_corpus_content_changes(tmp_path, capsys):
    assert run_compare(capsys, tmp_path, CITIZENS).code == 0
    first = bpc(tmp_path)
    r = run_compare(capsys, tmp_path, CITIZENS)  # same content: reused
    assert r.code == 0 and "already done" in r.out and bpc(tmp_path) == first
    r = run_compare(capsys, tmp_path, ROMEO)  # same path, other content: run again
    assert r.code == 0 and "already done" not in r.out
    alone = tmp_path / "alone"
    alone.mkdir()
    assert run_compare(capsys, alone, ROMEO).code == 0
    assert bpc(tmp_path) == bpc(alone) != first  # the fresh result, as a clean folder gives


@pytest.mark.parametrize(
    "doc", ["[1]", "null", "NaN", '{"signature": 1}', "{", '{"result": {"val_bpc": NaN}}']
)
def test_a_damaged_result_json_is_run_again(tmp_path, capsys, doc):
    assert run_compare(capsys, tmp_path, CITIZENS).code == 0
    first = bpc(tmp_path)
    result = tmp_path / "cmp" / "ngram" / compare.RESULT_FILE
    if doc.startswith('{"result"'):  # the right signature with a NaN inside
        good = json.loads(result.read_text())
        doc = json.dumps({"signature": good["signature"], "result": {**good["result"]}})
        doc = doc.replace(str(good["result"]["val_bpc"]), "NaN", 1)
    result.write_text(doc, encoding="utf-8")
    r = run_compare(capsys, tmp_path, CITIZENS)
    assert r.code == 0 and "already done" not in r.out, r.err
    assert bpc(tmp_path) == first
    if doc not in ('{"signature": 1}',):  # another signature is silently "not done"
        assert "not a valid result" in r.out + r.err


def test_compare_out_a_file_or_empty_is_one_line(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for out in (f, ""):
        r = run_compare(capsys, tmp_path, CITIZENS, out=out)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
        assert "Traceback" not in r.err
    assert f.read_text() == "x"


def test_attention_self_on_an_rnn_translation_model_is_one_line(tmp_path, capsys):
    from support import tiny_translation_run

    run = tiny_translation_run(tmp_path / "mt", [("ab", "ba"), ("abc", "cba")], rnn=True)
    png = tmp_path / "a.png"
    argv = ["attention", "--checkpoint", run, "ab", "--out", png]
    r = run_cli(capsys, *argv, "--kind", "self")
    assert r.code == 2 and "no self attention" in r.err and len(r.err.strip().splitlines()) == 1
    assert not png.exists()
    assert run_cli(capsys, *argv, "--kind", "cross").code == 0 and png.stat().st_size > 0


def test_export_into_an_attnlm_run_is_refused(tmp_path, capsys):
    """``export --out RUN``: the Hugging Face ``config.json`` written beside ``checkpoint/``
    made the folder load as the exported model, hiding the run (with or without
    ``--overwrite``); refused in one line, the run untouched."""
    from attnlm.loading.sources import resolve
    from gguf_export_support import tiny_run

    source = tiny_run(tmp_path / "llama", "llama")
    corpus = tmp_path / "c.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny-test", "--text", corpus, "--out", run, "--max-iters", 1]
    assert run_cli(capsys, *argv, "--no-progress").code == 0
    before = sorted(p.name for p in run.iterdir())
    for extra in ([], ["--overwrite"]):
        r = run_cli(capsys, "export", "--model", source, "--out", run, *extra)
        assert r.code == 2 and "holds an attnlm run" in r.err, r.err
        assert len(r.err.strip().splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == before
    assert resolve(run).info.family.type == "gpt"  # still the run, not the llama


def test_attention_layer_and_head_are_checked_with_html_too(files, tmp_path, capsys):
    """``--layer 99 --html`` wrote the page (the page shows every layer, and --layer was
    ignored unchecked); out of range is one line, and --layer without --out says what it is
    for."""
    page = tmp_path / "a.html"
    base = ["attention", "--checkpoint", files["ckpt"], "the cat", "--html", page]
    r = run_cli(capsys, *base, "--layer", 99)
    assert r.code == 2 and "--layer 99 is out of range" in r.err, r.err
    r = run_cli(capsys, *base, "--layer", 0)
    assert r.code == 2 and "--layer/--head choose the panels of --out" in r.err, r.err
    assert not page.exists()
    assert run_cli(capsys, *base).code == 0 and page.stat().st_size > 0


def test_an_allocation_beyond_the_machine_is_one_line(tmp_path):
    """``train --batch-size 1000000000`` under a 6 GB address-space limit: the allocator's
    RuntimeError (a 20-line traceback) becomes one line, exit 2."""
    import resource

    corpus = tmp_path / "c.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    r = attnlm_process("train", "--preset", "tiny-test", "--text", corpus, "--out",
                       tmp_path / "run", "--batch-size", 10**9, "--max-iters", 1,
                       "--no-progress", preexec_fn=limit)  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("attnlm: error: out of memory (tried")
    assert "Traceback" not in r.stderr


def test_only_allocation_failures_are_turned_into_one_line():
    from attnlm.cli import out_of_memory

    cuda = type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate")
    assert out_of_memory(cuda).startswith("out of memory")
    assert out_of_memory(MemoryError()) == "out of memory; ask for less"
    assert out_of_memory(RuntimeError("shape mismatch")) is None  # a bug stays a traceback
