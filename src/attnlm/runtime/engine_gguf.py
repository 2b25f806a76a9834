"""A Llama GGUF file as an :class:`~attnlm.runtime.engine.Engine` (the ``c-engine`` backend: the
C decode step without PyTorch), its Q8_0 / Q4_0 / Q4_1 blocks moved into the step's layouts
with numpy: the same bytes the PyTorch loader (:mod:`attnlm.models.gguf.quantized`,
:mod:`attnlm.nn.quant`) gives its q8 / q4 layers (tested), without a float32 copy of any
matrix. The file is read by :mod:`attnlm.ggufio` (the one GGUF parser) and its tensors are
placed by the Llama module's own table (:func:`attnlm.models.gguf.llama.parts`).

:func:`engine_format` says whether the engine holds a file's model (None sends the resolver
down the PyTorch path, which handles, or refuses in one line, everything else: other
architectures, matrices of other ggml types, a format other than the file's own);
:func:`open_engine` builds it; :func:`engine_for` is the resolver's way in
(:func:`attnlm.sources.resolve` with ``engine_ok``), the planner deciding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnlm.foreign import check_finite
from attnlm.ggufio import GGUFFile
from attnlm.models.gguf import llama
from attnlm.models.gguf.parts import Part
from attnlm.native import structs
from attnlm.runtime.engine import BlockWeights, Engine, EngineConfig, LinearWeights

GROUP, BLOCK_N = 32, 64  # elements per scale; rows per block of the q4 layout
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}  # bytes per 32 elements
NATIVE = {"q8": {"Q8_0"}, "q4": {"Q4_0", "Q4_1"}}
PRECISION = {"Q8_0": "q8", "Q4_0": "q4", "Q4_1": "q4"}


def engine_for(path: Path, device: Any, weights: str | None, threads: int | None) -> Any:
    """``(engine, tokenizer, chat template, stop ids)`` where the GGUF file ``path`` runs on
    the C engine for a decode on ``device`` (a ``--device`` string) in ``weights``, as the
    planner says (:func:`attnlm.runtime.planner.engine_reason`), else None; ``engine.reason``
    says why it was chosen. :func:`attnlm.sources.resolve` calls it; no PyTorch is imported."""
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
    classes = {PRECISION.get(t) for t in body}
    if len(classes) != 1 or None in classes:
        return None
    fmt = classes.pop()
    head = matrices.get("output.weight")  # as the PyTorch loader: a q4 model's head may be q8
    if weights not in (None, fmt) or matrices.get("token_embd.weight") != "Q8_0":
        return None
    if head is not None and head not in (NATIVE[fmt] | {"Q8_0"}):
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
    by_ours: dict[str, list[Part]] = {}
    for part in llama.parts(config, header):
        by_ours.setdefault(part.ours, []).append(part)
    if any(p.gguf not in header.tensors for ps in by_ours.values() for p in ps):
        return None
    weights = _Weights(header, by_ours)
    blocks = [weights.block(i) for i in range(config.n_layer)]
    q, s = _codes(header, by_ours["tok_emb.weight"][0])[:2]
    head = _linear((q, s)) if config.tie_embeddings else weights.matrix("lm_head.weight")
    return Engine(config, blocks, weights.norm("ln_f.weight"), q, s, head, threads, reason)


class _Weights:
    """Reads our parameters' values out of ``header`` by the Llama table ``by_ours``."""

    def __init__(self, header: GGUFFile, by_ours: dict[str, list[Part]]) -> None:
        self.header, self.by_ours = header, by_ours

    def matrix(self, name: str) -> LinearWeights:
        parts = sorted(self.by_ours[name], key=lambda p: p.rows or (0,))
        pieces = [_codes(self.header, p) for p in parts]
        codes = tuple(np.concatenate(c) for c in zip(*pieces)) if len(pieces) > 1 else pieces[0]
        return _linear(codes)

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


def _codes(header: GGUFFile, part: Part) -> tuple[np.ndarray, ...]:
    """A Q8_0 matrix ``(N, K)`` as ``(q int8 (N, K), d float16 (N, G))``; a Q4_0 / Q4_1 one as
    ``(u uint8 0..15 (N, K), d, m float16 (N, G))`` with ``w = d u + m`` (Q4_0: ``m = -8 d``);
    llama.cpp's rotary row order undone for ``part.heads`` heads."""
    info = header.tensors[part.gguf]
    n, k = info.shape
    b = header.raw(info).reshape(n * k // GROUP, BLOCK_BYTES[info.type_name])
    d = b[:, :2].copy().view(np.float16).reshape(n, k // GROUP)
    if info.type_name == "Q8_0":
        codes: tuple[np.ndarray, ...] = (b[:, 2:].copy().view(np.int8).reshape(n, k), d)
    else:
        qs = b[:, 4:] if info.type_name == "Q4_1" else b[:, 2:]  # byte j: j (low), j + 16 (high)
        u = np.concatenate([qs & 0x0F, qs >> 4], axis=1).reshape(n, k)
        if info.type_name == "Q4_1":
            m = b[:, 2:4].copy().view(np.float16).reshape(n, k // GROUP)
        else:  # -8 d is exact in float16 (a power-of-two multiple)
            m = (-8 * d.astype(np.float32)).astype(np.float16)
        codes = (u, d, m)
    for scales in codes[1:]:  # as the PyTorch loader: a damaged file is refused, not decoded
        check_finite({info.name: scales}, header.path, "scales of")
    if part.heads:
        codes = tuple(_unpermute(c, part.heads) for c in codes)
    return codes


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order -> rotate-half (see :func:`.loader.unpermute_rows`)."""
    n, width = rows.shape
    d = n // heads
    return np.ascontiguousarray(rows.reshape(heads, d // 2, 2, width).transpose(0, 2, 1, 3)
                                ).reshape(n, width)  # fmt: skip


def _linear(codes: tuple[np.ndarray, ...]) -> LinearWeights:
    """q8 ``(q, d)`` or q4 ``(u, d, m)`` in the step's layout (:class:`attnlm.nn.quant.
    QuantLinear`'s buffers)."""
    if len(codes) == 2:
        q, d = codes
        n, k = q.shape
        return LinearWeights(structs.Q8, n, k, np.ascontiguousarray(q), np.ascontiguousarray(d), n)
    u, d, m = codes
    n, k = u.shape
    pad = -n % BLOCK_N
    u = np.pad(u, ((0, pad), (0, 0)))
    dm = np.pad(np.stack([d, m], axis=-1), ((0, pad), (0, 0), (0, 0)))  # (N', G, 2)
    blocks = u.reshape(-1, 2, 32, k).transpose(0, 3, 1, 2)  # (N'/64, K, 2, 32)
    packed = np.ascontiguousarray(blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n + pad, k // 2)
    scales = np.ascontiguousarray(dm.reshape(-1, BLOCK_N, k // GROUP, 2).transpose(0, 2, 1, 3))
    return LinearWeights(structs.Q4, n, k, packed, scales, n + pad)
