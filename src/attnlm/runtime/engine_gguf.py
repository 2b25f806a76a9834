"""A Llama GGUF file as an :class:`~attnlm.runtime.engine.Engine` (the ``c-engine`` backend: the
C decode step without PyTorch), its Q8_0 / Q4_0 / Q4_1 blocks moved into the step's layouts
by :mod:`attnlm.quant.blocks` (numpy; the functions the PyTorch loader,
:mod:`attnlm.models.gguf.loader`, uses for its q8 / q4 layers, so both hold the same bytes:
tested), without a float32 copy of any matrix. The file is read by :mod:`attnlm.base.ggufio` (the
one GGUF parser) and its tensors are placed by the Llama module's own table
(:func:`attnlm.models.gguf.llama.parts`), q and k rows back from llama.cpp's rotary order by
:func:`attnlm.models.gguf.parts.unpermute_rows`.

:func:`engine_format` says whether the engine holds a file's model (None sends the resolver
down the PyTorch path, which handles, or refuses in one line, everything else: other
architectures, matrices of other ggml types, a format other than the file's own);
:func:`open_engine` builds it; :func:`engine_for` is the resolver's way in
(:func:`attnlm.loading.sources.resolve` with ``engine_ok``), the planner deciding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnlm.base.foreign import check_finite
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf import llama
from attnlm.models.gguf.parts import Part, check_parts, unpermute_rows
from attnlm.native import structs
from attnlm.quant.blocks import GROUP, NATIVE_FORMAT, codes, pack_q4
from attnlm.runtime.engine import BlockWeights, Engine, EngineConfig, LinearWeights


def engine_for(path: Path, device: Any, weights: str | None, threads: int | None) -> Any:
    """``(engine, tokenizer, chat template, stop ids)`` where the GGUF file ``path`` runs on
    the C engine for a decode on ``device`` (a ``--device`` string) in ``weights``, as the
    planner says (:func:`attnlm.runtime.planner.engine_reason`), else None; ``engine.reason``
    says why it was chosen. :func:`attnlm.loading.sources.resolve` calls it; no PyTorch is imported.
    """
    if not isinstance(device, (str, type(None))):
        return None
    from attnlm.native import default_threads
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


def engine_format(header: GGUFFile, weights: str | None) -> str | None:
    """The format the engine would hold ``header``'s model in (``weights`` or the file's own
    precision class), or None where it does not apply (the PyTorch path decides)."""
    if header.get("general.architecture") != "llama":
        return None
    matrices = {n: i.type_name for n, i in header.tensors.items() if len(i.shape) == 2}
    vectors = {i.type_name for i in header.tensors.values() if len(i.shape) == 1}
    if not vectors <= {"F32", "F16"}:
        return None
    body = {t for n, t in matrices.items() if n not in ("token_embd.weight", "output.weight")}
    classes = {NATIVE_FORMAT.get(t) for t in body}
    if len(classes) != 1 or None in classes:
        return None
    fmt = classes.pop()
    head = matrices.get("output.weight")  # as the PyTorch loader: a q4 model's head may be q8
    if weights not in (None, fmt) or matrices.get("token_embd.weight") != "Q8_0":
        return None
    if head is not None and NATIVE_FORMAT.get(head) not in (fmt, "q8"):
        return None
    return fmt


def open_engine(header: GGUFFile, weights: str | None, threads: int, reason: str = ""
                ) -> Engine | None:  # fmt: skip
    """The engine of ``header`` (see :func:`engine_format`), or None where it does not hold
    the file's model; ``reason``: why the planner chose it."""
    if engine_format(header, weights) is None:
        return None
    table = llama.config_table(header)  # checks the keys as the PyTorch loader does
    config = EngineConfig(
        table["n_layer"], table["n_embd"], table["n_head"], table["n_kv_head"], table["d_ff"],
        table["vocab_size"], table["rope_theta"], table["rms_norm_eps"], table["block_size"],
        table["tie_embeddings"],
    )  # fmt: skip
    if config.head_dim % 2 or config.n_embd % GROUP or config.n_head % config.n_kv_head:
        return None
    parts = llama.parts(config, header)
    check_parts(header, parts)  # every tensor there, in the shape the C step will be told
    by_ours: dict[str, list[Part]] = {}
    for part in parts:
        by_ours.setdefault(part.ours, []).append(part)
    weights = _Weights(header, by_ours)
    blocks = [weights.block(i) for i in range(config.n_layer)]
    emb = _codes(header, by_ours["tok_emb.weight"][0])  # Q8_0 (engine_format)
    head = _linear(emb) if config.tie_embeddings else weights.matrix("lm_head.weight")
    norm = weights.norm("ln_f.weight")
    return Engine(config, blocks, norm, emb["q"], emb["s"], head, threads, reason)


class _Weights:
    """Reads our parameters' values out of ``header`` by the Llama table ``by_ours``."""

    def __init__(self, header: GGUFFile, by_ours: dict[str, list[Part]]) -> None:
        self.header, self.by_ours = header, by_ours

    def matrix(self, name: str) -> LinearWeights:
        parts = sorted(self.by_ours[name], key=lambda p: p.rows or (0,))
        pieces = [_codes(self.header, p) for p in parts]
        return _linear({key: np.concatenate([p[key] for p in pieces]) for key in pieces[0]})

    def norm(self, name: str) -> np.ndarray:
        info = self.header.tensors[self.by_ours[name][0].gguf]
        raw = self.header.raw(info)  # F32 or F16 (engine_format)
        out = raw.view(np.float32 if info.type_name == "F32" else np.float16).astype(np.float32)
        check_finite({info.name: out}, self.header.path)
        return out

    def block(self, i: int) -> BlockWeights:
        ours = f"blocks.{i}."
        return BlockWeights(
            self.norm(ours + "ln_1.weight"), self.norm(ours + "ln_2.weight"),
            self.matrix(ours + "attn.qkv_proj.weight"), self.matrix(ours + "attn.out_proj.weight"),
            self.matrix(ours + "mlp.fc.weight"), self.matrix(ours + "mlp.proj.weight"),
        )  # fmt: skip


# -- the blocks ------------------------------------------------------------------------------


def _codes(header: GGUFFile, part: Part) -> dict[str, np.ndarray]:
    """A Q8_0 / Q4_0 / Q4_1 matrix as its codes and float16 scales
    (:func:`attnlm.quant.blocks.codes`), llama.cpp's rotary row order undone for ``part.heads``
    heads; a scale that is NaN or infinite is refused, as the PyTorch loader refuses it."""
    info = header.tensors[part.gguf]
    found = codes(header.raw(info), info.type_name, tuple(info.shape))
    for key in ("s", "d", "m"):  # a damaged file is refused, not decoded
        if key in found:
            check_finite({info.name: found[key]}, header.path, "scales of")
    if part.heads:
        found = {key: unpermute_rows(value, part.heads) for key, value in found.items()}
    return found


def _linear(found: dict[str, np.ndarray]) -> LinearWeights:
    """q8 ``{q, s}`` or q4 ``{u, d, m}`` codes in the step's layout (what
    :class:`attnlm.quant.layers.QuantLinear` stores: :func:`attnlm.quant.blocks.pack_q4`)."""
    if "q" in found:
        q, s = (np.ascontiguousarray(found[key]) for key in ("q", "s"))
        return LinearWeights(structs.Q8, q.shape[0], q.shape[1], q, s, q.shape[0])
    n, k = found["u"].shape
    packed, scales = pack_q4(found["u"], found["d"], found["m"])
    return LinearWeights(structs.Q4, n, k, packed, scales, packed.shape[0])
