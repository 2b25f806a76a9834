"""Tasks built from data attnlm ships or fetches itself, so that ``attnlm eval --task NAME``
works without a download from the Hub. Each is made the same way on every machine (seeded
draws from ``random.Random``, whose sequence Python guarantees).

* ``tatoeba-mc`` (multiple choice, 1,000 test and 2,000-odd train examples): which French
  sentence translates an English one? From the Tatoeba sample in ``tasks/data/`` (CC-BY 2.0 FR):
  the first French translation of each English sentence of three or more words; the prompt is
  ``English: ...\\nFrench:`` and the four choices are the translation and three French
  sentences of other pairs, each within a quarter of its length in characters (so length alone
  does not give the answer away), the right one at a random place.
* ``shakespeare-cloze`` (cloze, 500 test and 500 train examples): the last word of a speech
  from the built-in corpus (Shakespeare's plays, the one ``attnlm train`` uses), like LAMBADA:
  the speaker's name and the speech without its last word, whose letters (apostrophes allowed,
  at least three; a word standing alone, not the end of a hyphenated one) are the target.
  Speeches of two to eight lines, at most 400 characters.
"""

from __future__ import annotations

import bisect
import random
import re
from pathlib import Path

from attnlm.tasks.files import Example, Task

DATA = Path(__file__).parent / "data"
TATOEBA = DATA / "tatoeba-eng-fra-5k.tsv"
SEED = 2026


def _tatoeba_pairs() -> list[tuple[str, str]]:
    """(English, French) of the sample, the first French of each English sentence."""
    seen: dict[str, str] = {}
    for line in TATOEBA.read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0] not in seen:
            seen[fields[0]] = fields[1]
    return list(seen.items())


def tatoeba_mc() -> Task:
    """The ``tatoeba-mc`` task (see the module docstring)."""
    pairs = [(en, fr) for en, fr in _tatoeba_pairs() if len(en.split()) >= 3]
    rng = random.Random(SEED)
    rng.shuffle(pairs)
    french = sorted({fr for _, fr in pairs}, key=lambda f: (len(f), f))
    lengths = [len(f) for f in french]
    examples = []
    for en, fr in pairs:
        lo = bisect.bisect_left(lengths, len(fr) - len(fr) / 4)
        hi = bisect.bisect_right(lengths, len(fr) + len(fr) / 4)
        near = [f for f in french[lo:hi] if f != fr]
        if len(near) < 3:
            continue
        choices = rng.sample(near, 3)
        gold = rng.randrange(4)
        choices.insert(gold, fr)
        examples.append(Example(f"English: {en}\nFrench:", tuple(choices), gold))
    source = "built-in (Tatoeba eng-fra, CC-BY 2.0 FR)"
    return Task(name="tatoeba-mc", kind="multiple_choice", test=tuple(examples[:1000]),
                train=tuple(examples[1000:]), source=source)  # fmt: skip


# the speech's last word: after a space or newline, then punctuation only (not "school-master")
_LAST_WORD = re.compile(r"(?<=[ \n])([A-Za-z][A-Za-z']{2,})[^A-Za-z'\s-]*$")


def shakespeare_cloze() -> Task:
    """The ``shakespeare-cloze`` task (see the module docstring)."""
    from attnlm.data.corpus import default_corpus

    examples = []
    for block in default_corpus().split("\n\n"):
        lines = block.strip("\n").split("\n")
        if len(lines) < 3 or len(lines) > 9 or not lines[0].endswith(":") or len(block) > 400:
            continue
        found = _LAST_WORD.search(block.rstrip())
        if found is None:
            continue
        context = block[: found.start(1)].rstrip()
        examples.append(Example(context, (found.group(1),)))
    rng = random.Random(SEED)
    rng.shuffle(examples)
    source = "built-in (Shakespeare's plays)"
    return Task(name="shakespeare-cloze", kind="cloze", test=tuple(examples[:500]),
                train=tuple(examples[500:1000]), source=source)  # fmt: skip


BUILTIN = {"tatoeba-mc": tatoeba_mc, "shakespeare-cloze": shakespeare_cloze}


def load_task(spec: str) -> Task:
    """A task file or folder, or a built-in task's name (:data:`BUILTIN`)."""
    from attnlm.base.errors import InputError
    from attnlm.tasks.files import read_task

    path = Path(spec).expanduser()
    if path.exists():
        return read_task(path)
    if spec in BUILTIN:
        return BUILTIN[spec]()
    raise InputError(f"--task {spec}: no such file or folder, and not a built-in task "
                     f"({', '.join(BUILTIN)})")  # fmt: skip
