"""Progress bars for the long n-gram phases (counting, estimating, writing, reading): tqdm on
stderr with n-grams per second, or a no-op object when switched off."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


@contextlib.contextmanager
def progress_bar(
    total: int | None, desc: str, enabled: bool, unit: str = "n-gram"
) -> Iterator[Any]:
    """``with progress_bar(n, "count", True) as bar: bar.update(k)``; silent unless ``enabled``."""
    if not enabled:
        yield _Silent()
        return
    from tqdm import tqdm  # lazy: only when a bar is shown

    with tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=True) as bar:
        yield bar
