"""Standalone attention views: one self-contained, offline HTML file per attention record.

The file holds the explorer's head view and model view (the same ``views.js`` and
``style.css`` as the served page, inlined), the record as JSON, and a Content-Security-Policy
that forbids every network request, so it opens from disk, in a mail attachment or on a
machine without network (the bertviz use without a notebook or CDN).

A record is ``{"tokens": [T], "attention": [L][H][T][T]}`` (rows are queries, columns keys),
optionally with ``"source_tokens": [S]`` and ``"cross_attention": [L][H][T][S]`` (query =
target token, key = source token) for translation models: the JSON answered by
``POST /api/attention``.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.fileio import atomic_write_text

STATIC_DIR = Path(__file__).parent / "static"
VIEW_STATE_KEYS = ("view", "kind", "layer", "heads", "layers_filter", "heads_filter")
_PLACEHOLDER = re.compile(r"\{\{(TITLE|STYLE|SCRIPT|RECORD|STATE)\}\}")


def _as_list(v: Any) -> Any:
    return v.tolist() if hasattr(v, "tolist") else v


def _check_maps(maps: Any, name: str, q: int, k: int, empty: bool = False) -> list:
    """``maps`` as plain lists, checked; ``empty``: no layers at all is allowed."""
    maps = _as_list(maps)
    if empty and maps == []:
        return []
    if not isinstance(maps, list) or not maps:
        raise InputError(f"record[{name!r}] must be a non-empty list [layer][head][query][key]")
    heads = None
    for li, layer in enumerate(maps):
        layer = _as_list(layer)
        if not isinstance(layer, list) or not layer:
            raise InputError(f"record[{name!r}][{li}] must be a non-empty list of heads")
        if heads is None:
            heads = len(layer)
        if len(layer) != heads:
            raise InputError(f"record[{name!r}]: layer {li} has {len(layer)} heads, not {heads}")
        for hi, m in enumerate(layer):
            m = _as_list(m)
            ok = isinstance(m, list) and len(m) == q
            ok = ok and all(isinstance(r, list | tuple) and len(r) == k for r in m)
            if not ok:
                raise InputError(f"record[{name!r}][{li}][{hi}] must be a {q} x {k} matrix")
            for row in m:
                for w in row:
                    if (
                        isinstance(w, bool)
                        or not isinstance(w, int | float)
                        or not math.isfinite(w)
                    ):
                        raise InputError(f"record[{name!r}] holds a non-finite or non-number value")
    return [[[list(map(float, r)) for r in _as_list(m)] for m in _as_list(lay)] for lay in maps]


def check_record(record: dict[str, Any]) -> dict[str, Any]:
    """A clean copy of an attention record (plain lists); a malformed one raises InputError."""
    if not isinstance(record, dict):
        raise InputError("an attention record must be a dict with 'tokens' and 'attention'")
    # "family" and "encoder_attention" come with attnlm.inspect's records; the views ignore them
    known = {
        "tokens",
        "attention",
        "source_tokens",
        "cross_attention",
        "family",
        "encoder_attention",
    }
    unknown = set(record) - known
    if unknown:
        raise InputError(f"unknown field(s) in the attention record: {', '.join(sorted(unknown))}")
    tokens = _as_list(record.get("tokens"))
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise InputError("record['tokens'] must be a non-empty list of strings")
    has_src, has_cross = "source_tokens" in record, "cross_attention" in record
    # an RNN encoder-decoder's record has cross-attention only (no self-attention layers)
    self_maps = _check_maps(
        record.get("attention"), "attention", len(tokens), len(tokens), empty=has_cross
    )
    out: dict[str, Any] = {"tokens": list(tokens), "attention": self_maps}
    if has_src != has_cross:
        raise InputError("record needs both 'source_tokens' and 'cross_attention', or neither")
    if has_cross:
        src = _as_list(record["source_tokens"])
        if not isinstance(src, list) or not src or not all(isinstance(t, str) for t in src):
            raise InputError("record['source_tokens'] must be a non-empty list of strings")
        out["source_tokens"] = list(src)
        out["cross_attention"] = _check_maps(
            record["cross_attention"], "cross_attention", len(tokens), len(src)
        )
    return out


def _json_for_script(value: Any) -> str:
    """JSON safe inside ``<script>``: ``<`` escaped so no ``</script>`` can end the block."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")


def render_standalone(
    record: dict[str, Any], title: str = "Attention", state: dict[str, Any] | None = None
) -> str:
    """The standalone HTML document for ``record`` (see the module docstring).

    ``state`` picks the initial view: ``{"view": "head"|"model", "kind": "self"|"cross",
    "layer": int, "heads": [int], "layers_filter": "0,2-3", "heads_filter": ""}``.
    """
    rec = check_record(record)
    st = {k: v for k, v in (state or {}).items() if k in VIEW_STATE_KEYS}
    if set(state or {}) - set(VIEW_STATE_KEYS):
        bad = ", ".join(sorted(set(state or {}) - set(VIEW_STATE_KEYS)))
        raise InputError(f"unknown view state field(s): {bad}")
    read = lambda name: (STATIC_DIR / name).read_text(encoding="utf-8")  # noqa: E731
    values = {
        "TITLE": html.escape(title),
        "STYLE": read("style.css"),
        "SCRIPT": read("views.js") + "\n" + read("standalone.js"),
        "RECORD": _json_for_script(rec),
        "STATE": _json_for_script(st),
    }
    # one pass: substituted text (a token could contain "{{RECORD}}") is never rescanned
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], read("standalone.html"))


def write_standalone(
    record: dict[str, Any],
    path: str | os.PathLike[str],
    title: str = "Attention",
    state: dict[str, Any] | None = None,
) -> Path:
    """Write :func:`render_standalone` to ``path`` (UTF-8, folders created); return the path."""
    doc = render_standalone(record, title, state)
    p = Path(path)
    atomic_write_text(p, doc)  # OSError: a one-line InputError naming the file
    return p
