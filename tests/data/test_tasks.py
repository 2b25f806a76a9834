"""The built-in English-to-German task: deterministic, distinct, correct against hand-written
German (month and weekday names, number words, 24-hour times), usable as the default pairs."""

import datetime as dt
import re
from collections import Counter

import pytest

pytest.importorskip("babel")
pytest.importorskip("num2words")

from attnlm.base.errors import ConfigError  # noqa: E402
from attnlm.cli import main  # noqa: E402
from attnlm.data.pairs import read_pairs  # noqa: E402
from attnlm.data.tasks import (  # noqa: E402
    TEMPLATES,
    builtin_pairs,
    builtin_pairs_path,
    load_pairs,  # noqa: E402
    task_rows,
)

MONTHS = "Januar Februar März April Mai Juni Juli August September Oktober November Dezember"
MONTHS_DE = MONTHS.split()
WEEKDAYS_DE = "Montag Dienstag Mittwoch Donnerstag Freitag Samstag Sonntag".split()
ONES = (
    "null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn "
    "fünfzehn sechzehn siebzehn achtzehn neunzehn"
).split()
TENS = dict(
    zip(range(2, 10), "zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split())
)
EN_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
EN_TENS = dict(zip(range(2, 10), "twenty thirty forty fifty sixty seventy eighty ninety".split()))
DATIVE = {"minute": "Minuten", "hour": "Stunden", "day": "Tagen", "week": "Wochen"}
DATIVE |= {"month": "Monaten", "year": "Jahren"}


def german(n: int) -> str:
    """German number words for 0..9999, written independently of num2words."""
    if n < 20:
        return ONES[n]
    if n < 100:
        t, u = divmod(n, 10)
        return (("ein" if u == 1 else ONES[u]) + "und" if u else "") + TENS[t]
    big, word = (1000, "tausend") if n >= 1000 else (100, "hundert")
    head, rest = divmod(n, big)
    return ("ein" if head == 1 else ONES[head]) + word + (german(rest) if rest else "")


def english(n: int) -> str:
    """English words for 0..99."""
    if n < 20:
        return EN_ONES[n]
    t, u = divmod(n, 10)
    return EN_TENS[t] + (f"-{EN_ONES[u]}" if u else "")


@pytest.fixture(scope="module")
def rows():
    return task_rows(5000, seed=0)


def test_deterministic_distinct_and_prefix_stable(rows):
    assert len(rows) == 5000
    assert task_rows(1000, seed=0) == rows[:1000]
    assert task_rows(200, seed=0) == rows[:200]
    assert task_rows(200, seed=1) != rows[:200]
    assert len({r[0] for r in rows}) == len(rows)  # distinct English sides
    kinds = Counter(r[2] for r in rows)
    assert set(kinds) == set(TEMPLATES)
    for en, de, _ in rows:
        assert en == " ".join(en.split()) and de == " ".join(de.split())  # plain spaces only
        assert "\t" not in en + de


def test_numbers_against_hand_written_german(rows):
    words = {german(n) for n in range(10000)}
    seen = Counter()
    for en, de, kind in rows:
        if kind == "digits":
            assert de == german(int(en)), en
        elif kind == "cardinal":
            assert de in words, (en, de)
            n = next((k for k in range(100) if english(k) == en), None)
            if n is not None:
                assert de == german(n)
        elif kind in ("ago", "in_time", "duration"):
            m = re.fullmatch(r"(?:in )?(\S+) (minute|hour|day|week|month|year)s(?: ago)?", en)
            assert m, en
            n = next(k for k in range(2, 100) if english(k) == m.group(1))
            unit = DATIVE[m.group(2)]
            if kind == "ago":
                assert de == f"vor {german(n)} {unit}"  # "ago" moves to the front as "vor"
            elif kind == "in_time":
                assert de == f"in {german(n)} {unit}"
            else:
                assert de.startswith(german(n) + " ")
        else:
            continue
        seen[kind] += 1
    assert min(seen.values()) > 20


def test_dates_and_times_against_hand_written_german(rows):
    checked = Counter()
    for en, de, kind in rows:
        if kind == "date_long":
            d = dt.datetime.strptime(en, "%B %d, %Y")
            assert de == f"{d.day}. {MONTHS_DE[d.month - 1]} {d.year}"
        elif kind == "date_full":
            d = dt.datetime.strptime(en, "%A, %B %d, %Y")
            assert en.startswith(d.strftime("%A"))  # the weekday matches the date
            assert de == f"{WEEKDAYS_DE[d.weekday()]}, {d.day}. {MONTHS_DE[d.month - 1]} {d.year}"
        elif kind == "numeric_date":
            d = dt.datetime.strptime(en, "%m/%d/%Y")
            assert de == f"{d:%d.%m.%Y}"
        elif kind == "day_month":
            d = dt.datetime.strptime(en + " 2000", "%B %d %Y")
            assert de == f"{d.day}. {MONTHS_DE[d.month - 1]}"
        elif kind == "time_of_day":
            t = dt.datetime.strptime(en, "%I:%M %p")
            assert de == f"{t:%H:%M} Uhr"
        elif kind == "month_year":
            d = dt.datetime.strptime(en, "in %B %Y")
            assert de == f"im {MONTHS_DE[d.month - 1]} {d.year}"
        else:
            continue
        checked[kind] += 1
    assert len(checked) == 6 and min(checked.values()) > 20


def test_examples_from_the_docs(rows):
    """The reorderings the task is for (docs/seq2seq.md shows these rows)."""
    rows = {en: de for en, de, _ in rows}
    assert rows["April 4, 2002"] == "4. April 2002"
    assert rows["Wednesday, October 4, 2056"] == "Mittwoch, 4. Oktober 2056"
    assert rows["5/14/1956"] == "14.05.1956"
    assert rows["2:50 PM"] == "14:50 Uhr"
    assert rows["sixty-nine days ago"] == "vor neunundsechzig Tagen"
    assert rows["six hundred and forty-nine"] == "sechshundertneunundvierzig"
    assert rows["on the twenty-third of April"] == "am dreiundzwanzigsten April"


def test_bad_arguments():
    with pytest.raises(ConfigError, match="number of task pairs"):
        task_rows(0)
    with pytest.raises(ConfigError, match="seed"):
        task_rows(10, seed="x")


def test_cli_task_writes_a_pairs_file(tmp_path, capsys):
    out = tmp_path / "task.tsv"
    assert main(["data", "task", "--out", str(out), "-n", "300", "--seed", "4"]) == 0
    assert "wrote 300 pairs" in capsys.readouterr().out
    pairs, report = read_pairs(out)
    assert report.kept == 300 and report.extra_columns == 300  # the template column
    assert [(p.source, p.target) for p in pairs] == [r[:2] for r in task_rows(300, seed=4)]
    assert main(["data", "task", "--out", "-", "--num-pairs", "2"]) == 0
    assert capsys.readouterr().out.count("\n") == 2
    assert main(["data", "task", "--out", str(out), "-n", "-1"]) == 2


def test_default_pairs_are_the_cached_task(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNLM_CACHE", str(tmp_path))
    path = builtin_pairs_path()
    assert path.parent.parent == tmp_path and path.is_file()
    assert "babel" in path.name and "num2words" in path.name
    pairs, report = load_pairs(None)
    assert report.kept == 5000 and report.source == str(path)
    assert pairs == builtin_pairs()
    assert [tuple(p) for p in pairs[:50]] == [r[:2] for r in task_rows(50)]
    mtime = path.stat().st_mtime_ns
    builtin_pairs_path()
    assert path.stat().st_mtime_ns == mtime  # read from the cache, not rewritten
    assert main(["data", "pairs", "--examples", "1"]) == 0
    assert "built-in task" in capsys.readouterr().out
