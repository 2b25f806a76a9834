"""``attnlm eval --task``: the three kinds on a tiny run, several models and shots, the JSON
and the curve, the generation kind against the library's greedy decode, and bad input in one
line with exit 2."""

from __future__ import annotations

import json

import pytest

from attnlm.generate.sampling import SamplingConfig
from attnlm.generate.text import generate_text
from attnlm.loading.sources import resolve
from attnlm.tasks.builtin import tatoeba_mc
from gguf_export_support import tiny_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return str(tiny_run(base / "llama", "llama")), str(tiny_run(base / "gpt", "gpt"))


def _lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


MC_ROWS = [{"context": f"the quick brown fox {i}", "choices": [" jumps", " dog", " one"],
            "gold": i % 3} for i in range(8)]  # fmt: skip


def test_multiple_choice_json_has_every_score(runs, cli, tmp_path):
    task = _lines(tmp_path / "mc.jsonl", MC_ROWS)
    r = cli("eval", "--model", runs[0], "--task", task, "--num-fewshot", "0", "2", "--json",
            "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert (doc["kind"], doc["examples"], len(doc["results"])) == ("multiple_choice", 8, 2)
    for res, shots in zip(doc["results"], (0, 2), strict=True):
        assert res["num_fewshot"] == shots and res["model"] == runs[0]
        m = res["metrics"]
        assert set(m) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
        samples = res["samples"]
        assert [s["line"] for s in samples] == list(range(1, 9))
        assert m["acc"] == pytest.approx(sum(s["acc"] for s in samples) / 8)
        for s in samples:
            lls = s["loglikelihoods"]
            assert s["pred"] == max(range(3), key=lambda i: (lls[i], -i))
            assert s["acc"] == float(s["pred"] == s["gold"])


def test_two_models_and_a_curve(runs, cli, tmp_path):
    out = tmp_path / "curve.png"
    r = cli("eval", "--model", runs[0], "--model", runs[1], "--task", "tatoeba-mc", "--limit",
            "6", "--num-fewshot", "0", "1", "--out", str(out), "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].startswith("task: tatoeba-mc (multiple_choice, 6 examples")
    assert sum(1 for line in lines if "-shot  acc " in line) == 4
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cloze_text_output(runs, cli, tmp_path):
    rows = [
        {"context": "the quick brown", "target": "fox"},
        {"context": "the lazy", "target": "dog"},
    ]
    r = cli("eval", "--model", runs[0], "--task", _lines(tmp_path / "c.jsonl", rows),
            "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert "kind inferred from the keys" in r.out
    assert "acc " in r.out and "perplexity " in r.out


def test_generation_equals_the_greedy_decode(runs, cli, tmp_path):
    prompts = ["the quick", "hello", "one, two,"]
    model, tok, _ = resolve(runs[0], "cpu")
    texts = generate_text(model, tok, prompts, SamplingConfig(temperature=0.0,
                          max_new_tokens=6, stop=("\n\n",)))  # fmt: skip
    # the first answer is what the model writes, the others are not
    rows = [{"task": {"max_gen_toks": 6}},
            {"prompt": prompts[0], "answer": texts[0].strip()},
            {"prompt": prompts[1], "answer": "nothing like it"},
            {"prompt": prompts[2], "answer": texts[2].strip() + "x"}]  # fmt: skip
    r = cli(
        "eval",
        "--model",
        runs[0],
        "--task",
        _lines(tmp_path / "g.jsonl", rows),
        "--json",
        "--no-progress",
    )
    assert r.code == 0, r.err
    res = json.loads(r.out)["results"][0]
    assert [s["generated"] for s in res["samples"]] == texts
    assert [s["exact_match"] for s in res["samples"]] == [1.0, 0.0, 0.0]
    assert res["metrics"]["exact_match"] == pytest.approx(1 / 3)


def test_builtin_task_matches_library(runs, cli):
    from attnlm.tasks.run import evaluate_task

    r = cli("eval", "--model", runs[1], "--task", "tatoeba-mc", "--limit", "5", "--json",
            "--num-fewshot", "1", "--seed", "7", "--no-progress")  # fmt: skip
    model, tok, _ = resolve(runs[1], "cpu")
    lib = evaluate_task(model, tok, tatoeba_mc().limited(5), 1, seed=7)
    got = json.loads(r.out)["results"][0]
    assert [s["loglikelihoods"] for s in got["samples"]] == [
        s["loglikelihoods"] for s in lib["samples"]]  # fmt: skip


BAD = [
    (["--task", "no-such-task"], "not a built-in task"),
    (["--task", "tatoeba-mc", "--text", "x.txt"], "--text does not apply to --task"),
    (["--num-fewshot", "2"], "--num-fewshot applies to eval --task"),
    (["--task", "tatoeba-mc", "--chat"], "--chat needs a chat template"),
    (["--task", "tatoeba-mc", "--limit", "3", "--num-fewshot", "1000"],
     "--num-fewshot 1000: the task's train split has"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), BAD)
def test_bad_input_is_one_line(runs, cli, tmp_path, extra, message):
    (tmp_path / "x.txt").write_text("some text\n")
    extra = [str(tmp_path / a) if a == "x.txt" else a for a in extra]
    r = cli("eval", "--model", runs[0], *extra, "--no-progress")
    assert r.code == 2
    assert message in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_bad_task_file_names_the_line_on_the_cli(runs, cli, tmp_path):
    bad = _lines(
        tmp_path / "bad.jsonl", [MC_ROWS[0], {"context": "x", "choices": ["a"], "gold": 3}]
    )
    r = cli("eval", "--model", runs[0], "--task", bad, "--no-progress")
    assert r.code == 2 and f"{bad}:2: gold 3 is out of range" in r.err


def test_generate_text_ends_a_row_at_a_stop_id(runs):
    """``generate_text(stop_ids=...)`` (a generation task's end-of-text ids): the row ends at
    that token, which is not part of the text."""
    from attnlm.generate.loop import decode

    model, tok, _ = resolve(runs[0], "cpu")
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=6)
    ids = decode(model, [tok.encode("the quick")], sampling)[0]
    stop = ids[2]
    cut = generate_text(model, tok, ["the quick"], sampling, stop_ids=(stop,))[0]
    assert cut == tok.decode(ids[: ids.index(stop)])
    assert generate_text(model, tok, ["the quick"], sampling)[0] == tok.decode(ids)
