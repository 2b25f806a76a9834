"""Streaming text decode (issue 15): time to turn 16k generated ids into streamed text.

Compares the incremental decoder (:class:`attnlm.generate.text._RowText`, each token decoded
once) with re-decoding every id so far for each new token (what streaming did before), on a
byte-level BPE tokenizer trained on the default corpus. Only the text layer is timed (no model).

    PYTHONPATH=src python benchmarks/bench_stream_decode.py [--tokens 16384]
"""

from __future__ import annotations

import argparse

import harness  # benchmarks/harness.py: runs, medians, ratios, --quick
from attnlm.data.corpus import default_corpus
from attnlm.generate.text import _RowText
from attnlm.tokenizers import BPETokenizer


def redecode_every_token(tok: BPETokenizer, ids: list[int]) -> str:
    """The old way: decode ids[:k] for every k and print what is new."""
    out, emitted = [], 0
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k])
        safe = len(text)
        while safe > emitted and text[safe - 1] == "\ufffd":
            safe -= 1
        out.append(text[emitted:safe])
        emitted = max(safe, emitted)
    out.append(tok.decode(ids)[emitted:])
    return "".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    args = harness.parse(ap, quick={"tokens": 256})
    harness.set_threads(1)
    text = default_corpus()[:2_000_000]
    tok = BPETokenizer.train(text[:300_000], 1024)
    ids = tok.encode(text)[: args.tokens]
    box = {}

    def incremental() -> None:
        row = _RowText(tok, ("\n\n\n",))
        box["new"] = "".join([row.push(t)[0] for t in ids] + [row.flush()])

    runs = harness.alternate(
        {
            "incremental": lambda: harness.time_call(incremental),
            "redecode": lambda: harness.time_call(
                lambda: box.__setitem__("old", redecode_every_token(tok, ids))
            ),
        },
        1,
    )
    assert box["new"] == box["old"] == tok.decode(ids)
    harness.report("stream-decode", runs, "incremental", "redecode", tokens=len(ids))


if __name__ == "__main__":
    main()
