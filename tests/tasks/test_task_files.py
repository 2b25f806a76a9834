"""Task files: the three kinds, the header, folders with a train split, and every bad file
refused in one line naming its line (``attnlm.tasks.files``)."""

from __future__ import annotations

import json

import pytest

from attnlm.base.errors import InputError
from attnlm.tasks.builtin import BUILTIN, load_task, shakespeare_cloze, tatoeba_mc
from attnlm.tasks.files import Example, read_task, write_task


def _write(path, *rows, raw: bytes | None = None):
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


MC = {"context": "2 + 2 =", "choices": ["3", "4", "5"], "gold": 1}


def test_kinds_are_inferred_and_stated(tmp_path):
    mc = read_task(_write(tmp_path / "mc.jsonl", MC, MC))
    assert (mc.kind, mc.kind_inferred, len(mc.test)) == ("multiple_choice", True, 2)
    assert mc.test[0] == Example("2 + 2 =", ("3", "4", "5"), 1)
    assert mc.test[0].line == 1 and mc.test[1].line == 2
    cloze = read_task(_write(tmp_path / "c.jsonl", {"context": "The sky is", "target": "blue"}))
    assert cloze.kind == "cloze" and cloze.test[0].answer == "blue"
    gen = read_task(_write(tmp_path / "g.jsonl", {"prompt": "Q: 1+1?\nA:", "answer": "2"}))
    assert gen.kind == "generation" and gen.stops == ("\n\n",)


def test_header_line_sets_the_kind_and_settings(tmp_path):
    header = {"task": {"kind": "generation", "name": "sums", "until": ["\n"],
                       "target_delimiter": "", "ignore_case": True}}  # fmt: skip
    t = read_task(_write(tmp_path / "t.jsonl", header, {"prompt": "1+1=", "answer": "2"}))
    assert (t.name, t.kind, t.kind_inferred, t.stops, t.target_delimiter, t.ignore_case) == (
        "sums", "generation", False, ("\n",), "", True)  # fmt: skip
    assert t.test[0].line == 2


def test_folder_with_train_split_round_trips(tmp_path):
    task = tatoeba_mc().limited(5)
    again = read_task(write_task(task, tmp_path / "folder"))
    assert (again.kind, again.test, again.train) == (task.kind, task.test, task.train)
    assert again.name == "tatoeba-mc"


BAD = [
    ({"context": "x", "choices": ["a"]}, "line 1", "an example needs the keys"),
    ({"context": "x", "choices": ["a", "b"], "gold": 2}, ":1:", "gold 2 is out of range"),
    ({"context": "x", "choices": ["a", ""], "gold": 0}, ":1:", "choice 1 is empty"),
    ({"context": "x", "choices": [], "gold": 0}, ":1:", "'choices' must be a non-empty list"),
    ({"context": "x", "choices": ["a"], "gold": True}, ":1:", "'gold' must be an integer"),
    ({"context": 3, "target": "a"}, ":1:", "'context' must be a string"),
    ({"prompt": "p", "answer": ""}, ":1:", "'answer' is empty"),
]


@pytest.mark.parametrize(("row", "where", "message"), BAD)
def test_bad_examples_name_the_line(tmp_path, row, where, message):
    path = _write(tmp_path / "bad.jsonl", row)
    with pytest.raises(InputError) as e:
        read_task(path)
    text = str(e.value)
    assert message in text and "\n" not in text
    assert f"{path}:1" in text or where == "line 1" and f"{path}:1" in text


def test_later_line_problems_name_that_line(tmp_path):
    path = _write(tmp_path / "t.jsonl", MC, MC, {"context": "x", "choices": ["a"], "gold": 5})
    with pytest.raises(InputError, match=r"t\.jsonl:3: gold 5 is out of range"):
        read_task(path)
    path = _write(tmp_path / "u.jsonl", MC, {"context": "x", "target": "y"})
    with pytest.raises(InputError, match=r"u\.jsonl:2: missing key 'choices'"):
        read_task(path)


def test_non_utf8_invalid_json_and_header_problems(tmp_path):
    raw = json.dumps(MC).encode() + b"\n" + b'{"context": "caf\xe9", "target": "x"}\n'
    with pytest.raises(InputError, match=r"bad\.jsonl:2: not valid UTF-8"):
        read_task(_write(tmp_path / "bad.jsonl", raw=raw))
    with pytest.raises(InputError, match=r"j\.jsonl:2: not a valid JSON"):
        read_task(_write(tmp_path / "j.jsonl", raw=json.dumps(MC).encode() + b"\n{oops\n"))
    with pytest.raises(InputError, match=r"h\.jsonl:1: unknown task header key 'kinds'"):
        read_task(_write(tmp_path / "h.jsonl", {"task": {"kinds": "cloze"}}, MC))
    with pytest.raises(InputError, match=r"k\.jsonl:1: kind 'mc' is not one of"):
        read_task(_write(tmp_path / "k.jsonl", {"task": {"kind": "mc"}}, MC))
    with pytest.raises(InputError, match=r"l\.jsonl:2: a task header belongs on the first line"):
        read_task(_write(tmp_path / "l.jsonl", MC, {"task": {"kind": "cloze"}}))
    with pytest.raises(InputError, match="no examples"):
        read_task(_write(tmp_path / "e.jsonl", raw=b"\n\n"))
    with pytest.raises(InputError, match="a task folder holds test.jsonl"):
        read_task(tmp_path)


def test_builtin_tasks_are_deterministic_and_well_formed():
    a, b = tatoeba_mc(), tatoeba_mc()
    assert a == b and len(a.test) == 1000 and len(a.train) >= 200
    for e in a.test:
        assert len(e.choices) == 4 and len(set(e.choices)) == 4
        gold_len = len(e.answer)
        assert all(abs(len(c) - gold_len) <= gold_len / 4 for c in e.choices)
        assert e.context.startswith("English: ") and e.context.endswith("\nFrench:")
    golds = [e.gold for e in a.test]
    assert all(150 < golds.count(i) < 350 for i in range(4))  # the right answer moves
    assert not set(a.test) & set(a.train)
    assert set(BUILTIN) == {"tatoeba-mc", "shakespeare-cloze"}
    with pytest.raises(InputError, match="not a built-in task"):
        load_task("no-such-task")


def test_shakespeare_cloze_targets_are_last_words():
    from attnlm.data.corpus import default_corpus

    task = shakespeare_cloze()
    corpus = default_corpus()
    assert len(task.test) == 500 and len(task.train) == 500
    for e in task.test[:50]:
        assert e.answer.isalpha() or "'" in e.answer
        assert (e.context + " " + e.answer) in corpus  # the passage as written
