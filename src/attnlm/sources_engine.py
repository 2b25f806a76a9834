"""The resolver's way to the ``c-engine`` backend: a local GGUF file that the C engine runs
(:func:`attnlm.runtime.planner.engine_reason`) opens as an
:class:`~attnlm.runtime.engine.Engine` and its tokenizer, without importing PyTorch.
:func:`attnlm.sources.resolve` calls it when its caller decodes (``engine_ok``); anything
else, or a file the engine does not hold, goes down the PyTorch path."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def engine_for(path: Path, device: Any, weights: str | None, threads: int | None) -> Any:
    """``(engine, tokenizer, chat template, stop ids)`` where the GGUF file ``path`` runs on
    the C engine for a decode on ``device`` (a ``--device`` string) in ``weights``, else None;
    ``engine.reason`` says why it was chosen."""
    if not isinstance(device, (str, type(None))):
        return None
    from attnlm.ggufio import GGUFFile
    from attnlm.native import default_threads
    from attnlm.runtime.engine_gguf import engine_format, open_engine
    from attnlm.runtime.planner import engine_reason
    from attnlm.tokenizers.gguf import GGUFTokenizer, gguf_chat_setup

    header = GGUFFile(path)
    ok, reason = engine_reason(engine_format(header, weights), device)
    if not ok:
        return None
    engine = open_engine(header, weights, threads or default_threads(), reason)
    if engine is None:
        return None
    tok = GGUFTokenizer.from_gguf(header)
    template, stops = gguf_chat_setup(tok, f"{path}: tokenizer.chat_template")
    return engine, tok, template, stops
