"""The built-in translation task: English dates, times and numbers into German.

Works offline on a fresh machine: every pair is generated with ``babel`` (CLDR month and
weekday names, date and time patterns) and ``num2words`` (numbers in words). German rather
than French because its forms reorder the English far more, so attention alignments are not
a diagonal:

* number words put units before tens and join everything into one word:
  ``twenty-one`` -> ``einundzwanzig``, ``three hundred and forty-two`` ->
  ``dreihundertzweiundvierzig`` (French keeps English order: ``vingt et un``);
* dates put the day before the month: ``March 3, 2021`` -> ``3. März 2021``,
  ``Wednesday, March 3, 2021`` -> ``Mittwoch, 3. März 2021``, and numeric dates swap day and
  month: ``3/7/2021`` -> ``07.03.2021``;
* ``twenty-one days ago`` -> ``vor einundzwanzig Tagen`` moves the last word to the front;
* the 12-hour clock becomes the 24-hour one: ``3:05 PM`` -> ``15:05 Uhr``;
* years are read in hundreds: ``nineteen eighty-four`` -> ``neunzehnhundertvierundachtzig``.

Generation is seeded and deterministic: random draws come only from ``random.Random(seed)
.random()``, whose sequence Python guarantees across versions, and explicit CLDR patterns
(not the locale's "long"/"full" names, which change between CLDR releases) are used; any
Unicode space babel emits is written as a plain space. A pair's English side is distinct
from every other's. The output can still change with a new ``babel`` or ``num2words``
release; the cache file name records both versions.

Each row is ``(english, german, template)``; files get the template as a third column, which
the pairs reader ignores.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from attnlm.base.errors import ConfigError, InputError

if TYPE_CHECKING:
    import os

    from attnlm.data.pairs import HeaderMode, Pair, PairsReport

TASK_NAME = "dates-numbers-en-de"
DEFAULT_N = 5000
DEFAULT_SEED = 0
MAX_N = 200_000
FIRST_DAY = dt.date(1900, 1, 1)
LAST_DAY = dt.date(2099, 12, 31)

# English singular unit, German plural (nominative), German plural (dative)
UNITS = (
    ("minute", "Minuten", "Minuten"),
    ("hour", "Stunden", "Stunden"),
    ("day", "Tage", "Tagen"),
    ("week", "Wochen", "Wochen"),
    ("month", "Monate", "Monaten"),
    ("year", "Jahre", "Jahren"),
)


class _Draw:
    """Random choices built on ``random.Random(seed).random()`` alone (stable sequence)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def below(self, n: int) -> int:
        return min(int(self._rng.random() * n), n - 1)

    def between(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``."""
        return lo + self.below(hi - lo + 1)

    def weighted(self, weights: list[float]) -> int:
        x = self._rng.random() * sum(weights)
        for i, w in enumerate(weights):
            x -= w
            if x < 0:
                return i
        return len(weights) - 1


def _libs() -> tuple[Callable[..., str], Callable[..., str], Callable[..., str]]:
    try:
        from babel.dates import format_date, format_time
        from num2words import num2words
    except ImportError as e:
        raise InputError(
            f"the built-in task needs babel and num2words ({e}); "
            "install them with: pip install babel num2words"
        ) from None
    return format_date, format_time, num2words


def _space(text: str) -> str:
    return " ".join(text.split())


class _Templates:
    """The pair templates; each method draws its values and returns ``(english, german)``."""

    def __init__(self, draw: _Draw) -> None:
        self.d = draw
        self.fdate, self.ftime, self.words = _libs()

    # ------------------------------------------------------------ helpers
    def date(self) -> dt.date:
        span = LAST_DAY.toordinal() - FIRST_DAY.toordinal() + 1
        return dt.date.fromordinal(FIRST_DAY.toordinal() + self.d.below(span))

    def both(self, day: dt.date, en: str, de: str) -> tuple[str, str]:
        return _space(self.fdate(day, en, locale="en")), _space(self.fdate(day, de, locale="de"))

    def number(self) -> int:
        lo, hi = ((0, 99), (100, 999), (1000, 9999))[self.d.weighted([0.35, 0.35, 0.3])]
        return self.d.between(lo, hi)

    def time(self) -> tuple[str, str]:
        minute = self.d.below(24 * 60)
        t = dt.time(minute // 60, minute % 60)
        en = _space(self.ftime(t, "h:mm a", locale="en"))
        return en, _space(self.ftime(t, "HH:mm", locale="de")) + " Uhr"

    # ------------------------------------------------------------ templates
    def cardinal(self) -> tuple[str, str]:
        n = self.number()
        return self.words(n, lang="en"), self.words(n, lang="de")

    def digits(self) -> tuple[str, str]:
        n = self.number()
        return str(n), self.words(n, lang="de")

    def year(self) -> tuple[str, str]:
        y = self.d.between(1100, 2099)
        return self.words(y, lang="en", to="year"), self.words(y, lang="de", to="year")

    def date_long(self) -> tuple[str, str]:
        return self.both(self.date(), "MMMM d, y", "d. MMMM y")

    def date_full(self) -> tuple[str, str]:
        return self.both(self.date(), "EEEE, MMMM d, y", "EEEE, d. MMMM y")

    def day_month(self) -> tuple[str, str]:
        return self.both(self.date(), "MMMM d", "d. MMMM")

    def numeric_date(self) -> tuple[str, str]:
        return self.both(self.date(), "M/d/y", "dd.MM.y")

    def month_year(self) -> tuple[str, str]:
        en, de = self.both(self.date(), "MMMM y", "MMMM y")
        return f"in {en}", f"im {de}"

    def ordinal_date(self) -> tuple[str, str]:
        day = self.date()
        en_month, de_month = self.both(day, "MMMM", "MMMM")
        en = f"the {self.words(day.day, lang='en', to='ordinal')} of {en_month}"
        return en, f"der {self.words(day.day, lang='de', to='ordinal')} {de_month}"

    def on_ordinal_date(self) -> tuple[str, str]:
        day = self.date()
        en_month, de_month = self.both(day, "MMMM", "MMMM")
        en = f"on the {self.words(day.day, lang='en', to='ordinal')} of {en_month}"
        # dative after "am": dritte -> dritten
        return en, f"am {self.words(day.day, lang='de', to='ordinal')}n {de_month}"

    def on_weekday_date(self) -> tuple[str, str]:
        day = self.date()
        en, weekday = self.both(day, "EEEE, MMMM d", "EEEE")
        return f"on {en}", f"am {weekday}, dem {_space(self.fdate(day, 'd. MMMM', locale='de'))}"

    def time_of_day(self) -> tuple[str, str]:
        return self.time()

    def weekday_time(self) -> tuple[str, str]:
        en_day, de_day = self.both(self.date(), "EEEE", "EEEE")
        en_t, de_t = self.time()
        return f"on {en_day} at {en_t}", f"am {de_day} um {de_t}"

    def ago(self) -> tuple[str, str]:
        n = self.d.between(2, 99)
        en_unit, _, de_dat = UNITS[self.d.below(len(UNITS))]
        en, de = self.words(n, lang="en"), self.words(n, lang="de")
        return f"{en} {en_unit}s ago", f"vor {de} {de_dat}"

    def in_time(self) -> tuple[str, str]:
        n = self.d.between(2, 99)
        en_unit, _, de_dat = UNITS[self.d.below(len(UNITS))]
        en, de = self.words(n, lang="en"), self.words(n, lang="de")
        return f"in {en} {en_unit}s", f"in {de} {de_dat}"

    def duration(self) -> tuple[str, str]:
        n = self.d.between(2, 99)
        en_unit, de_nom, _ = UNITS[self.d.below(len(UNITS))]
        return f"{self.words(n, lang='en')} {en_unit}s", f"{self.words(n, lang='de')} {de_nom}"


# template name -> relative weight
TEMPLATES: dict[str, float] = {
    "cardinal": 0.13,
    "digits": 0.05,
    "year": 0.07,
    "date_long": 0.10,
    "date_full": 0.08,
    "day_month": 0.06,
    "numeric_date": 0.05,
    "month_year": 0.04,
    "ordinal_date": 0.06,
    "on_ordinal_date": 0.05,
    "on_weekday_date": 0.06,
    "time_of_day": 0.05,
    "weekday_time": 0.05,
    "ago": 0.05,
    "in_time": 0.05,
    "duration": 0.05,
}


def task_rows(n: int = DEFAULT_N, seed: int = DEFAULT_SEED) -> list[tuple[str, str, str]]:
    """``n`` distinct ``(english, german, template)`` rows of the built-in task (see the
    module docstring), the same for the same ``n``, ``seed`` and library versions; the first
    ``k`` rows of a larger ``n`` are the rows for ``n = k``."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ConfigError(f"number of task pairs must be in 1..{MAX_N}, got {n!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    draw = _Draw(seed)
    templates = _Templates(draw)
    names = list(TEMPLATES)
    weights = [TEMPLATES[k] for k in names]
    seen: set[str] = set()
    rows: list[tuple[str, str, str]] = []
    for _ in range(20 * n + 1000):
        if len(rows) == n:
            break
        name = names[draw.weighted(weights)]
        en, de = getattr(templates, name)()
        if en not in seen:
            seen.add(en)
            rows.append((en, de, name))
    else:  # pragma: no cover - the templates have far more than MAX_N distinct sources
        raise ConfigError(f"could not generate {n} distinct pairs")
    return rows


def task_versions() -> dict[str, str]:
    """The installed versions of the libraries the task is generated with."""
    import importlib.metadata  # lazy: every command imports attnlm.data; only this reads it

    out = {}
    for lib in ("babel", "num2words"):
        try:
            out[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            out[lib] = "missing"
    return out


def write_task(path: str | Path, n: int = DEFAULT_N, seed: int = DEFAULT_SEED) -> int:
    """Write the task as a pairs file (``english<TAB>german<TAB>template``); returns ``n``."""
    from attnlm.data.pairs import write_pairs

    return write_pairs(path, task_rows(n, seed))


def builtin_pairs_path(n: int = DEFAULT_N, seed: int = DEFAULT_SEED) -> Path:
    """Path of the cached task file in the attnlm cache directory, written on first use
    (generation takes about a second; the name records ``n``, ``seed`` and the versions)."""
    from attnlm.data.corpus import cache_dir

    v = task_versions()
    if "missing" in v.values():
        _libs()  # raises the one-line install hint
    name = f"{TASK_NAME}-n{n}-seed{seed}-babel{v['babel']}-num2words{v['num2words']}.tsv"
    path = cache_dir() / "tasks" / name
    if not path.is_file():
        write_task(path, n, seed)
    return path


def builtin_pairs(n: int = DEFAULT_N, seed: int = DEFAULT_SEED) -> list[Pair]:
    """The built-in task as a list of :class:`attnlm.data.pairs.Pair` (read from the cache)."""
    from attnlm.data.pairs import read_pairs

    return read_pairs(builtin_pairs_path(n, seed))[0]


def load_pairs(
    path: str | os.PathLike[str] | None = None,
    *,
    strict: bool = False,
    header: HeaderMode = "auto",
    reverse: bool = False,
) -> tuple[list[Pair], PairsReport]:
    """The pairs at ``path`` (what ``--pairs`` names), or the built-in task when ``None``
    (:func:`builtin_pairs_path`, generated and cached on first use)."""
    from attnlm.data.pairs import read_pairs

    if path is None:
        path = builtin_pairs_path()
    return read_pairs(path, strict=strict, header=header, reverse=reverse)
