"""The ``c-engine`` backend: a causal decoder run by the C decode step alone, without PyTorch:
its weights are numpy arrays in the step's formats (q8 / q4 codes, or ggml's blocks as a GGUF
file stores them, read from a memory map of the file; float32 norms), its keys and values
numpy buffers, one :meth:`Engine.feed` one C call.

Why a backend without PyTorch: the step does all of a decoding step's arithmetic, so what
PyTorch adds to a local decode of a quantized GGUF model is its import (about 200 MB of
resident memory, most of a small model's process, and a second of start-up).
:mod:`attnlm.runtime.engine_gguf` builds an engine from a GGUF file,
:func:`attnlm.loading.sources.resolve` returns it where :func:`attnlm.runtime.planner.engine_reason`
says so, and :mod:`attnlm.generate.engine_decode` decodes with it (tested: the same logits as
the PyTorch path within 1e-4, the same greedy tokens).

Shape legend
    B rows    T new tokens per row    C width    V vocabulary    D head width
    Hkv key/value heads    G = C / 32 groups of an embedding row
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import numpy as np

from attnlm import native
from attnlm.native import structs
from attnlm.quant.blocks import dequantize

GROW = 256  # cache buffers grow by at least this many positions
MAX_TOKENS = 64  # new tokens per row and call (a longer prompt is fed in pieces)


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


@dataclass
class LinearWeights:
    """One product's weights in the step's format: ``fmt`` (:data:`structs.Q8` /
    :data:`structs.Q4`: the codes ``w`` and float16 ``scales``, q4's with the minimums, rows
    padded to ``n_pad``; or a ggml type's :data:`structs.GGML_FORMATS` code: ``w`` the rows'
    blocks as stored ``(N, row bytes)``, no ``scales``), ``n`` x ``k``; ``act``: a ggml
    product's activations (:data:`structs.ACT_AUTO` / ``ACT_FLOAT`` / ``ACT_INT``);
    ``bias``: ``(n,)`` float32 added to each output row (Qwen2's q/k/v), or None."""

    fmt: int
    n: int
    k: int
    w: np.ndarray
    scales: np.ndarray | None
    n_pad: int
    act: int = structs.ACT_AUTO
    bias: np.ndarray | None = None

    def describe(self) -> structs.Linear:
        return structs.Linear(self.fmt, self.n, self.k, self.n_pad, _ptr(self.w),
                              _ptr(self.scales), _ptr(self.bias), self.act)  # fmt: skip


@dataclass
class BlockWeights:
    ln_1: np.ndarray  # (C,) float32 RMSNorm gains
    ln_2: np.ndarray
    qkv: LinearWeights  # (H + 2 Hkv) D rows: q, then k, then v; or q alone, with k and v
    out: LinearWeights
    fc: LinearWeights  # 2 F rows: the SwiGLU gate, then up; or the gate alone, with up
    proj: LinearWeights
    k: LinearWeights | None = None
    v: LinearWeights | None = None
    up: LinearWeights | None = None
    q_norm: np.ndarray | None = None  # (D,) RMSNorm gains of each q / k head (Qwen3), or None
    k_norm: np.ndarray | None = None


@dataclass
class EngineConfig:
    """A Llama-family decoder: RMSNorm, rotary positions, SwiGLU; ``qkv_bias``: q/k/v have
    biases (Qwen2: :attr:`LinearWeights.bias`); ``qk_norm``: each q and k head is
    RMS-normalized before the rotation (Qwen3: :attr:`BlockWeights.q_norm`); ``d_head``: the
    head width where it is not ``n_embd / n_head``."""

    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    d_ff: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    block_size: int
    tie_embeddings: bool = False
    rotary: int = 1  # pairs rotated: 1 (i, i + D/2); 2 (2i, 2i + 1), llama.cpp's q/k row order
    qkv_bias: bool = False
    qk_norm: bool = False
    d_head: int | None = None
    # a part of the Llama family the step does not run yet (always off here)
    post_norms: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_head or self.n_embd // self.n_head

    @property
    def ffn_width(self) -> int:
        return self.d_ff


@dataclass
class Engine:
    """See the module docstring. ``embedding``: q8 codes ``(V, C)`` int8 and ``emb_scales``
    ``(V, G)`` float16; or, with ``emb_type`` (a ggml type id), the rows' blocks as stored
    ``(V, row bytes)`` and no scales; ``head``: the LM head (a tied one is the embedding's
    codes); ``reason``: why the planner chose this backend."""

    config: EngineConfig
    blocks: list[BlockWeights]
    ln_f: np.ndarray
    embedding: np.ndarray
    emb_scales: np.ndarray | None
    head: LinearWeights
    threads: int = 1
    reason: str = ""
    emb_type: int = -1
    name = "c-engine"  # the backend's name (a class attribute, not a field)

    def __post_init__(self) -> None:
        lib = native.library()
        if lib is None:
            raise RuntimeError(f"no C decode step: {native.why_not}")
        self.lib = lib
        c = self.config
        self.inv_freq = _inv_freq(c.head_dim, c.rope_theta)
        self.array = (structs.Block * c.n_layer)()
        for i, b in enumerate(self.blocks):
            apart = [x.describe() if x else structs.Linear() for x in (b.k, b.v, b.up)]
            self.array[i] = structs.Block(
                structs.Norm(_ptr(b.ln_1), None), structs.Norm(_ptr(b.ln_2), None),
                b.qkv.describe(), b.out.describe(), b.fc.describe(), b.proj.describe(),
                None, None, *apart, structs.Norm(_ptr(b.q_norm), None),
                structs.Norm(_ptr(b.k_norm), None),
            )  # fmt: skip
        self.struct = structs.Model(
            c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.d_ff, c.vocab_size, 0,
            structs.RMS, structs.SWIGLU, c.rotary, c.rms_norm_eps, 1 / math.sqrt(c.head_dim),
            ctypes.addressof(self.array), structs.Norm(_ptr(self.ln_f), None),
            self.head.describe(),
        )  # fmt: skip
        self.reset(1)

    # -- the decoding state ------------------------------------------------------------------

    def reset(self, rows: int, room: int = 0) -> None:
        """Forget every position; ``rows`` sequences from now on, buffers for ``room``
        positions (they grow when needed)."""
        self.rows, self.length = rows, 0
        self._k: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        self._cap = 0
        self._scratch: tuple = ()
        if room:
            self._grow(room)

    def _grow(self, need: int) -> None:
        c = self.config
        cap = max(need, self._cap + GROW)
        shape = (self.rows, c.n_kv_head, cap, c.head_dim)
        k = [np.empty(shape, np.float32) for _ in range(c.n_layer)]
        v = [np.empty(shape, np.float32) for _ in range(c.n_layer)]
        for new, old in ((k, self._k), (v, self._v)):
            for dest, src in zip(new, old):
                dest[:, :, : self.length] = src[:, :, : self.length]
        self._k, self._v, self._cap = k, v, cap
        for i in range(c.n_layer):
            self.array[i].k_cache, self.array[i].v_cache = _ptr(k[i]), _ptr(v[i])
        self.struct.cap = cap
        self._scratch = ()

    def drop_newest(self, n: int) -> None:
        """Forget the ``n`` most recent positions (rejected draft tokens)."""
        self.length -= n

    # -- one step ------------------------------------------------------------------------------

    def feed(self, tokens: np.ndarray, last_only: bool = False) -> np.ndarray:
        """Logits ``(B, T, V)`` float32 of ``tokens`` ``(B, T)`` after the positions held, or
        ``(B, 1, V)`` of each row's last with ``last_only``; at most :data:`MAX_TOKENS` per
        row and call."""
        c = self.config
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)
        b, t = tokens.shape
        if b != self.rows or not 0 < t <= MAX_TOKENS:
            raise ValueError(f"feed takes ({self.rows}, 1..{MAX_TOKENS}) tokens, got {b, t}")
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError(f"token ids must be in [0, {c.vocab_size})")
        if self.length + t > self._cap:
            self._grow(max(2 * (self.length + t), self.length + t + GROW))
        x = self._embed(tokens)  # (B T, C), overwritten by the step
        angles = np.arange(self.length, self.length + t, dtype=np.float32)[:, None] * self.inv_freq
        cos, sin = np.cos(angles), np.sin(angles)  # (T, D/2)
        logits = np.empty((b if last_only else b * t, c.vocab_size), np.float32)
        scratch = self._scratch_for(b * t)
        self.lib.attnlm_decode_step(
            ctypes.byref(self.struct), ctypes.byref(scratch), _ptr(x), b, t, self.length,
            _ptr(cos), _ptr(sin), _ptr(logits), int(last_only), self.threads,
        )  # fmt: skip
        self.length += t
        return logits.reshape(b, 1 if last_only else t, c.vocab_size)

    def _embed(self, tokens: np.ndarray) -> np.ndarray:
        """Embedding rows of ``tokens``, each row dequantized: ``(B T, C)`` float32 (only the
        rows asked for are read)."""
        ids = tokens.reshape(-1)
        if self.emb_type >= 0:
            rows = self.embedding[ids]  # (M, row bytes), copied from the map
            return dequantize(rows.reshape(-1), self.emb_type, (len(ids), self.config.n_embd))
        q = self.embedding[ids].astype(np.float32).reshape(len(ids), -1, 32)  # (M, G, 32)
        s = self.emb_scales[ids].astype(np.float32)[:, :, None]  # (M, G, 1)
        return np.ascontiguousarray((q * s).reshape(len(ids), -1))

    def _scratch_for(self, m: int) -> structs.Scratch:
        key = (m, self._cap, self.threads)
        if not self._scratch or self._scratch[0] != key:
            c = self.config
            q, hd = (c.n_head + 2 * c.n_kv_head) * c.head_dim, c.n_head * c.head_dim
            sizes = structs.scratch_sizes(m, self._cap, self.threads, c.n_embd, q, hd,
                                          2 * c.d_ff, c.vocab_size)  # fmt: skip
            arrays = [np.empty(n, np.float32) for n in sizes]
            self._scratch = (key, structs.Scratch(*[_ptr(a) for a in arrays]), arrays)
        return self._scratch[1]


def _inv_freq(d: int, theta: float) -> np.ndarray:
    """Rotary frequencies ``theta ** (-2i / D)`` (float32, as the PyTorch model's)."""
    exps = np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / np.float32(d)
    return (np.float32(1.0) / np.power(np.float32(theta), exps)).astype(np.float32)
