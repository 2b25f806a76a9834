"""What a decode cost: prefill and decode time, tokens, tokens per second, peak memory.

The two phases of decoding a language model are timed apart because they are bound by
different things: the prefill reads the prompt in one pass (matrix products, bound by
arithmetic), each decode step makes one token per row (matrix-vector products, bound by how
fast the weights stream from memory). ``generate --json`` and ``chat --json`` print these.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from typing import Any


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB: on Linux its address space's
    high-water mark (``VmHWM`` in ``/proc/self/status``); elsewhere ``getrusage``'s
    ``ru_maxrss`` (bytes on macOS). Not ``ru_maxrss`` on Linux: it keeps the largest of the
    process's address spaces, and a started process's first one is its parent's copy, so a
    command started by a large process (a benchmark, a test runner) would report the parent."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


@dataclass
class DecodeStats:
    """Counters one or more decodes add to. ``prefill_seconds``: from the call to the first
    new token of every row (the prompt's forward pass and the first pick); ``decode_seconds``:
    from there to the last token; ``new_tokens``: all rows' new tokens; ``rows``: how many
    rows (each row's first token comes out of the prefill, so the decode phase made
    ``new_tokens - rows`` of them). ``backend`` / ``backend_reason``: the runtime backend that
    ran the decodes and why it was chosen (:mod:`attnlm.runtime`)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    rows: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    backend: str | None = None
    backend_reason: str | None = None

    @property
    def decode_tokens_per_second(self) -> float | None:
        made = self.new_tokens - self.rows
        return made / self.decode_seconds if made > 0 and self.decode_seconds > 0 else None

    def to_json(self) -> dict[str, Any]:
        rate = self.decode_tokens_per_second
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_seconds": round(self.prefill_seconds, 6),
            "decode_seconds": round(self.decode_seconds, 6),
            "decode_tokens_per_second": None if rate is None else round(rate, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "backend": self.backend,
            "backend_reason": self.backend_reason,
        }


class Timer:
    """Times one decode into a :class:`DecodeStats`: ``start()`` before the decode call,
    ``token()`` on every new token (the first marks the end of the prefill), ``stop(n_new)``
    after it."""

    def __init__(self, stats: DecodeStats | None, prompt_tokens: int, rows: int) -> None:
        self.stats, self.prompt_tokens, self.rows = stats, prompt_tokens, rows
        self.t0 = self.t1 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.t1 = 0.0

    def token(self) -> None:
        if not self.t1:
            self.t1 = time.perf_counter()

    def stop(self, new_tokens: int) -> None:
        s = self.stats
        if s is None:
            return
        t2 = time.perf_counter()
        t1 = self.t1 or t2
        s.prompt_tokens += self.prompt_tokens
        s.new_tokens += new_tokens
        s.rows += self.rows if new_tokens else 0
        s.prefill_seconds += t1 - self.t0
        s.decode_seconds += t2 - t1
