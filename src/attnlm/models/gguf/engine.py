"""A Llama GGUF file as an :class:`~attnlm.native.engine.Engine` (the C decode step without
PyTorch), its Q8_0 / Q4_0 / Q4_1 blocks moved into the step's layouts with numpy: the same
bytes the PyTorch loader (:mod:`.quantized`, :mod:`attnlm.nn.quant`) gives its q8 / q4
layers (tested), without a float32 copy of any matrix.

:func:`open_engine` returns None where the engine does not apply, and the caller takes the
PyTorch path, which handles (or refuses in one line) everything else: other architectures,
matrices of other ggml types (re-quantized there), a format other than the file's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from attnlm import native
from attnlm.foreign import check_finite
from attnlm.ggufio import GGUFFile
from attnlm.models.gguf import llama
from attnlm.models.gguf.parts import Part
from attnlm.native import structs
from attnlm.native.engine import (
    BlockWeights,
    Engine,
    EngineConfig,
    LinearWeights,
    default_threads,
)
from attnlm.tokenizers.gguf import GGUFTokenizer

GROUP, BLOCK_N = 32, 64  # elements per scale; rows per block of the q4 layout
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}  # bytes per 32 elements
NATIVE = {"q8": {"Q8_0"}, "q4": {"Q4_0", "Q4_1"}}
PRECISION = {"Q8_0": "q8", "Q4_0": "q4", "Q4_1": "q4"}


def engine_for(spec: str, weights: str | None, device: str | None, threads: int | None
               ) -> tuple[Engine, GGUFTokenizer, Path] | None:  # fmt: skip
    """``(engine, tokenizer, the file)`` where a command can decode ``spec`` without PyTorch:
    a local Llama GGUF file (:func:`gguf_file`) in its own 8- or 4-bit format
    (:func:`engine_format`), on the CPU (``device`` ``cpu``, or ``auto`` where no GPU is
    visible), the C step available, ``ATTNLM_ENGINE`` not ``0``; None sends the command down
    the PyTorch path.
    ``threads``: None for every physical core."""
    if os.environ.get("ATTNLM_ENGINE", "1") == "0":
        return None
    if device not in (None, "cpu", "auto") or (device != "cpu" and _gpu_visible()):
        return None
    path = gguf_file(spec)
    if path is None or native.library() is None:
        return None  # (the PyTorch path says once why there is no C step)
    header = GGUFFile(path)
    engine = open_engine(header, weights, threads or default_threads())
    if engine is None:
        return None
    return engine, GGUFTokenizer.from_gguf(header), path


def _gpu_visible() -> bool:
    """Whether ``--device auto`` could pick a GPU (an NVIDIA driver, or macOS's MPS), told
    without importing PyTorch."""
    return sys.platform == "darwin" or os.path.exists("/dev/nvidiactl")


def gguf_file(spec: str) -> Path | None:
    """The local ``.gguf`` file ``spec`` names: the file, a folder holding one (not a run or
    Hugging Face folder), or a registered name's folder; None for anything else (Hub ids,
    runs: the PyTorch path resolves them)."""
    from attnlm.data.pretrained import pretrained_names, pretrained_path

    path = Path(str(spec)).expanduser()
    if not path.exists() and str(spec) in pretrained_names():
        path = pretrained_path(str(spec))
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    # a run has config.json or checkpoint/ (attnlm.checkpoint.CHECKPOINT_DIR), as a HF folder
    if not path.is_dir() or (path / "config.json").exists() or (path / "checkpoint").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    return found[0] if len(found) == 1 else None


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


def open_engine(header: GGUFFile, weights: str | None, threads: int) -> Engine | None:
    """The engine of ``header`` (see :func:`engine_format`), or None."""
    fmt = engine_format(header, weights)
    if fmt is None:
        return None
    table = llama.config_table(header)  # checks the keys as the PyTorch loader does
    config = EngineConfig(
        table["n_layer"], table["n_embd"], table["n_head"], table["n_kv_head"], table["d_ff"],
        table["vocab_size"], table["rope_theta"], table["rms_norm_eps"], table["block_size"],
    )  # fmt: skip
    if config.head_dim % 2 or config.n_embd % GROUP or config.n_head % config.n_kv_head:
        return None
    shape = SimpleNamespace(**table, head_dim=config.head_dim, ffn_width=config.d_ff)
    by_ours: dict[str, list[Part]] = {}
    for part in llama.parts(shape, header):
        by_ours.setdefault(part.ours, []).append(part)
    if any(p.gguf not in header.tensors for ps in by_ours.values() for p in ps):
        return None

    def matrix(name: str) -> LinearWeights:
        pieces = [_codes(header, p) for p in sorted(by_ours[name], key=lambda p: p.rows or (0,))]
        codes = tuple(np.concatenate(c) for c in zip(*pieces)) if len(pieces) > 1 else pieces[0]
        return _linear(codes)

    def norm(name: str) -> np.ndarray:
        info = header.tensors[by_ours[name][0].gguf]
        raw = header.raw(info)  # F32 or F16 (engine_format)
        out = raw.view(np.float32 if info.type_name == "F32" else np.float16).astype(np.float32)
        check_finite({info.name: out}, header.path)
        return out

    blocks = []
    for i in range(config.n_layer):
        ours = f"blocks.{i}."
        blocks.append(BlockWeights(
            norm(ours + "ln_1.weight"), norm(ours + "ln_2.weight"),
            matrix(ours + "attn.qkv_proj.weight"), matrix(ours + "attn.out_proj.weight"),
            matrix(ours + "mlp.fc.weight"), matrix(ours + "mlp.proj.weight"),
        ))  # fmt: skip
    q, s = _codes(header, by_ours["tok_emb.weight"][0])[:2]
    head = _linear((q, s)) if table["tie_embeddings"] else matrix("lm_head.weight")
    return Engine(config, blocks, norm("ln_f.weight"), q, s, head, threads)


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
