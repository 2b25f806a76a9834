"""The ``c-engine`` backend: a causal decoder run by the C decode step alone, without PyTorch:
its weights are numpy arrays in the step's formats (q8 / q4 codes, or ggml's blocks as a GGUF
file stores them, read from a memory map of the file; float32 norms), its keys and values
numpy buffers, one :meth:`Engine.feed` one C call.

Why: the step does all of a decoding step's arithmetic, so PyTorch adds only its import to a
local decode of a quantized GGUF model (about 200 MB of resident memory and a second of
start-up). :mod:`attnlm.runtime.engine_gguf` builds one from a GGUF file,
:func:`attnlm.loading.sources.resolve` returns it where the planner says so, and
:mod:`attnlm.generate.engine_decode` decodes with it (the PyTorch path's logits within 1e-4).

Shape legend: B rows, T new tokens per row, C width, V vocabulary, D head width, Hkv
key/value heads, G = C / 32 groups of an embedding row.
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
    ln_1: np.ndarray | None  # (C,) float32 RMSNorm gains (None: no pre-norms, OLMo 2)
    ln_2: np.ndarray | None
    qkv: LinearWeights  # (H + 2 Hkv) D rows: q, then k, then v; or q alone, with k and v
    out: LinearWeights
    fc: LinearWeights  # 2 F rows: the gate, then up; or the gate alone, with up
    proj: LinearWeights
    k: LinearWeights | None = None
    v: LinearWeights | None = None
    up: LinearWeights | None = None
    q_norm: np.ndarray | None = None  # (D,) RMSNorm gains of each q / k head (Qwen3), or None
    k_norm: np.ndarray | None = None
    post_attn: np.ndarray | None = None  # (C,) gains of the sublayers' outputs (Gemma), or None
    post_mlp: np.ndarray | None = None
    # a mixture of experts: the router (E, C); fc, up and proj then stack the E experts'
    # gate (E F rows), up (E F) and down (E C) matrices
    router: LinearWeights | None = None
    sinks: np.ndarray | None = None  # (H,) float32 each head's sink logit (gpt-oss), or None


@dataclass
class EngineConfig:
    """A Llama-family decoder: RMSNorm, rotary positions, SwiGLU; ``qkv_bias``: q/k/v have
    biases (Qwen2: :attr:`LinearWeights.bias`); ``qk_norm``: each q and k head is
    RMS-normalized before the rotation (Qwen3: :attr:`BlockWeights.q_norm`); ``d_head``: the
    head width where it is not ``n_embd / n_head``. Gemma's parts, as the ``[model]`` table
    of :class:`attnlm.models.llama.LlamaConfig` names them: ``embed_scale``, ``post_norms``
    (:attr:`BlockWeights.post_attn`), ``mlp_act`` ``"gelu_tanh"`` (GeGLU), ``attn_scale``
    (None: ``1/sqrt(D)``), ``attn_softcap``, ``final_softcap``, ``sliding_window`` with
    ``layer_types``, ``rope_local_theta`` (the sliding layers' rotary base) and
    ``rope_linear`` (a linear rotary scaling's factor: the global layers' positions divided
    by it); ``gelu_table``: GeGLU's GELU as llama.cpp's CPU backend takes it, its input and
    value rounded to float16 (with the products' activations quantized as llama.cpp's);
    ``n_expert`` (0: dense), ``n_expert_used``, ``moe_norm_topk``: a mixture of experts in
    every block (:attr:`BlockWeights.router`; the step's ``experts``: llama.cpp's routing);
    ``nope_layers``: the layers whose q and k are not rotated (NoPE: SmolLM3);
    ``rope_factors``: Llama 3.1's rotary scaling, pair ``i``'s angle divided by factor ``i`` in
    the global layers' table (a GGUF file's ``rope_freqs``, as llama.cpp applies it; YaRN's
    ramp as such factors, with ``rope_mscale`` its scale of cos and sin; LongRoPE's short set,
    with ``rope_long_factors`` the long set, taken by the rows of a sequence that reaches past
    ``rope_long_from``, the original context, in the call: see :meth:`Engine.feed`);
    ``residual_scale`` (each sublayer's output times it before the residual add) and
    ``logit_scale`` (the logits times its float32 reciprocal, as llama.cpp's granite graph
    divides them): Granite's; ``qk_norm_all`` (q's and k's norms over all heads at once) and
    ``pre_norms`` False (no norms before the sublayers: ``BlockWeights.ln_1`` / ``ln_2``
    None): OLMo 2's; ``rotary_dim``: partial rotary (Phi-4 mini), the first ``R`` features of
    each q and k head rotate and the tables hold ``R/2`` pairs; gpt-oss's ``mlp_act``
    ``"swiglu_oai"``, ``moe_gating`` ``"topk_softmax"``, :attr:`BlockWeights.sinks`."""

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
    post_norms: bool = False
    embed_scale: float | None = None
    mlp_act: str = "silu"
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None
    rope_linear: float | None = None
    gelu_table: bool = False
    n_expert: int = 0  # a mixture of experts: E experts of width d_ff, n_expert_used per token
    n_expert_used: int = 0
    moe_norm_topk: bool = True
    nope_layers: tuple[int, ...] | None = None
    rope_factors: tuple[float, ...] | None = None
    rope_mscale: float | None = None  # YaRN: the global table's cos and sin times it
    rope_long_factors: tuple[float, ...] | None = None  # LongRoPE: the long set of factors
    rope_long_from: int | None = None  # LongRoPE: the original context
    residual_scale: float | None = None
    logit_scale: float | None = None
    qk_norm_all: bool = False
    rotary_dim: int | None = None  # partial rotary: the first R features of each head turn
    pre_norms: bool = True
    moe_gating: str = "softmax"  # or "topk_softmax": gpt-oss's routing

    @property
    def head_dim(self) -> int:
        return self.d_head or self.n_embd // self.n_head

    @property
    def rotary_width(self) -> int:
        """The features of each head that rotate: ``rotary_dim``, or all."""
        return self.rotary_dim or self.head_dim

    @property
    def ffn_width(self) -> int:
        return self.d_ff

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window (0: it sees every earlier position)."""
        kinds = self.layer_types or ("sliding_attention",) * self.n_layer
        return (self.sliding_window or 0) if kinds[layer] == "sliding_attention" else 0


@dataclass
class Engine:
    """See the module docstring. ``embedding``: q8 codes ``(V, C)`` int8 and ``emb_scales``
    ``(V, G)`` float16; or, with ``emb_type`` (a ggml type id), the rows' blocks as stored
    ``(V, row bytes)`` and no scales; ``head``: the LM head (a tied one is the embedding's
    codes); ``reason``: why the planner chose this backend.

    Two ways to decode, on the same key/value buffers: :meth:`reset` and :meth:`feed` (B
    sequences advancing together, buffers that grow), and the rows API for a server's
    continuous batching, :meth:`reset_slots`, :meth:`step_rows` and :meth:`prefill` (each
    row at its own cache slot and position, one pass over the weights for all)."""

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
        self.rope_bases, tables = _rotary_tables(c)
        factors = c.rope_factors
        if factors is not None and len(factors) != c.rotary_width // 2:
            raise ValueError(f"rope_factors: {len(factors)} values for {c.rotary_width // 2} "
                             f"pairs")  # fmt: skip
        self._factors = None if factors is None else np.asarray(factors, np.float32)
        long = c.rope_long_factors
        if long is not None and (factors is None or len(long) != len(factors)
                                 or c.rope_long_from is None):  # fmt: skip
            raise ValueError("rope_long_factors go with rope_factors of as many values and "
                             "rope_long_from")  # fmt: skip
        self._long = None if long is None else np.asarray(long, np.float32)
        self.array = (structs.Block * c.n_layer)()
        for i, b in enumerate(self.blocks):
            apart = [x.describe() if x else structs.Linear() for x in (b.k, b.v, b.up)]
            norms = [structs.Norm(_ptr(w), None) for w in (b.q_norm, b.k_norm, b.post_attn,
                                                           b.post_mlp)]  # fmt: skip
            router = b.router.describe() if b.router else structs.Linear()
            self.array[i] = structs.Block(
                structs.Norm(_ptr(b.ln_1), None), structs.Norm(_ptr(b.ln_2), None),
                b.qkv.describe(), b.out.describe(), b.fc.describe(), b.proj.describe(),
                None, None, *apart, *norms, c.window(i), tables[i], router,
                c.n_expert if b.router else 0, c.n_expert_used, int(c.moe_norm_topk),
                _ptr(b.sinks), int(c.moe_gating == "topk_softmax"),
            )  # fmt: skip
        act = structs.SWIGLU_OAI if c.mlp_act == "swiglu_oai" else structs.SWIGLU
        if c.mlp_act == "gelu_tanh":
            act = structs.GEGLU_F16 if c.gelu_table else structs.GEGLU
        scale = c.attn_scale or 1 / math.sqrt(c.head_dim)
        self.struct = structs.Model(
            c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.d_ff, c.vocab_size, 0,
            structs.RMS, act, c.rotary, c.rms_norm_eps, scale, ctypes.addressof(self.array),
            structs.Norm(_ptr(self.ln_f), None), self.head.describe(), c.attn_softcap or 0.0,
            c.final_softcap or 0.0, c.residual_scale or 0.0,
            float(np.float32(1) / np.float32(c.logit_scale)) if c.logit_scale else 0.0,
            int(c.qk_norm_all), int(not c.pre_norms), c.rotary_dim or 0,
        )  # fmt: skip
        self.reset(1)

    # -- the decoding state ------------------------------------------------------------------

    def reset(self, rows: int, room: int = 0) -> None:
        """Forget every position; ``rows`` sequences from now on (:meth:`feed`), buffers for
        ``room`` positions (they grow when needed)."""
        self._slots(rows, None)
        if room:
            self._grow(room)

    def reset_slots(self, n_slots: int, max_len: int) -> None:
        """Forget every position; ``n_slots`` cache slots of ``max_len`` positions each for
        :meth:`step_rows` and :meth:`prefill` (allocated now, never grown)."""
        if not 0 < n_slots or not 0 < max_len:
            raise ValueError(f"reset_slots takes n_slots >= 1 and max_len >= 1, got "
                             f"{n_slots}, {max_len}")  # fmt: skip
        self._slots(n_slots, max_len)
        self._grow(max_len)

    def _slots(self, n: int, max_len: int | None) -> None:
        self.rows, self.length, self.max_len = n, 0, max_len
        self.held = np.zeros(n, np.int64)  # positions written in each slot
        self._k: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        self._cap = 0
        self._scratch: tuple = ()

    def _grow(self, need: int) -> None:
        c = self.config
        cap = need if self.max_len else max(need, self._cap + GROW)
        shape = (self.rows, c.n_kv_head, cap, c.head_dim)
        k = [np.empty(shape, np.float32) for _ in range(c.n_layer)]
        v = [np.empty(shape, np.float32) for _ in range(c.n_layer)]
        keep = int(self.held.max(initial=0))
        for new, old in ((k, self._k), (v, self._v)):
            for dest, src in zip(new, old):
                dest[:, :, :keep] = src[:, :, :keep]
        self._k, self._v, self._cap = k, v, cap
        for i in range(c.n_layer):
            self.array[i].k_cache, self.array[i].v_cache = _ptr(k[i]), _ptr(v[i])
        self.struct.cap = cap
        self._scratch = ()

    def drop_newest(self, n: int) -> None:
        """Forget the ``n`` most recent positions (rejected draft tokens)."""
        self.length -= n
        self.held[:] = self.length

    # -- one step ------------------------------------------------------------------------------

    def feed(self, tokens: np.ndarray, last_only: bool = False, logits: bool = True,
             reach: int | None = None) -> np.ndarray:  # fmt: skip
        """Logits ``(B, T, V)`` float32 of ``tokens`` ``(B, T)`` after the positions held, or
        ``(B, 1, V)`` of each row's last with ``last_only``; at most :data:`MAX_TOKENS` per
        row and call. ``logits=False``: the caches filled alone, ``(B, 0, V)`` (a long
        prompt's pieces before its last: the LM head, a pass over ``V C`` weights, skipped).
        ``reach``: the number of positions the sequence these tokens belong to reaches
        (default: after them; a prompt fed in pieces gives its whole length), which picks
        LongRoPE's long set past the original context, as ``transformers`` decides per
        forward call."""
        c = self.config
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)
        b, t = tokens.shape
        if b != self.rows or not 0 < t <= MAX_TOKENS:
            raise ValueError(f"feed takes ({self.rows}, 1..{MAX_TOKENS}) tokens, got {b, t}")
        _check_range("token id", tokens, c.vocab_size)
        if self.max_len is not None:
            raise ValueError("feed follows reset(rows); after reset_slots, step_rows and prefill")
        if self.length + t > self._cap:
            self._grow(max(2 * (self.length + t), self.length + t + GROW))
        slots = np.repeat(np.arange(b, dtype=np.int64), t)
        positions = np.tile(np.arange(self.length, self.length + t, dtype=np.int64), b)
        out = np.arange(b, dtype=np.int64) * t + t - 1 if last_only else np.arange(b * t)
        out = out if logits else out[:0]
        ends = np.full(b * t, self.length + t if reach is None else reach, np.int64)
        got = self._run(tokens.reshape(-1), positions, slots, out, ends)
        self.length += t
        self.held[:] = self.length
        return got.reshape(b, len(out) // b, c.vocab_size)

    def step_rows(self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray,
                  want: np.ndarray | None = None, ends: np.ndarray | None = None
                  ) -> np.ndarray:  # fmt: skip
        """Logits ``(n, V)`` float32 of ``n`` rows, row i the token ``tokens[i]`` at position
        ``positions[i]`` of the sequence in cache slot ``slots[i]`` (after
        :meth:`reset_slots`), all in one pass over the weights; with ``want`` (row indices)
        the logits of those rows alone, in that order (the LM head runs on them only: prompt
        rows riding along need none; an empty ``want`` fills the caches alone). A row
        attends over its slot's positions ``[0, position]``: those written before (a row at
        a lower position than the slot holds cuts the slot back to that prefix) and those of
        earlier rows of the same slot in this call, which must be consecutive positions in
        order. ValueError for an id, slot or position out of range, or a gap in a slot's
        positions. ``ends``: where each row's sequence reaches (as :meth:`feed`'s ``reach``;
        default: its slot's last row here)."""
        tokens, positions, slots = self._check_rows(tokens, positions, slots)
        if ends is not None:
            ends = np.ascontiguousarray(ends, dtype=np.int64)
            if ends.shape != tokens.shape or (ends <= positions).any():
                raise ValueError("ends gives each row a reach beyond its position")
        n = len(tokens)
        out = np.arange(n, dtype=np.int64) if want is None else np.asarray(want, np.int64)
        if out.ndim != 1 or len(out) > n or (len(out) and (out.min() < 0 or out.max() >= n)):
            raise ValueError(f"want lists up to {n} row indices in [0, {n}), got {out.tolist()}")
        logits = self._run(tokens, positions, slots, out, ends)
        self._advance(positions, slots)
        return logits

    def prefill(self, slot: int, position: int, tokens: np.ndarray, reach: int | None = None
                ) -> np.ndarray:  # fmt: skip
        """Logits ``(V,)`` float32 of the last of ``tokens`` ``(T,)``, written into cache
        slot ``slot`` from ``position`` on (the slot keeps its positions before it: a cached
        prompt prefix), :data:`MAX_TOKENS` rows per pass; checked as :meth:`step_rows`;
        ``reach`` as :meth:`feed`'s (a prompt prefilled in chunks gives its whole length)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
        if not len(tokens):
            raise ValueError("prefill takes at least one token")
        n = len(tokens)
        positions = np.arange(position, position + n, dtype=np.int64)
        self._check_rows(tokens, positions, np.full(n, slot, dtype=np.int64))
        ends = np.full(n, position + n if reach is None else reach, np.int64)
        for at in range(0, n, MAX_TOKENS):
            chunk, where = tokens[at : at + MAX_TOKENS], positions[at : at + MAX_TOKENS]
            slots = np.full(len(chunk), slot, dtype=np.int64)
            last = np.asarray([len(chunk) - 1] if at + MAX_TOKENS >= n else [], np.int64)
            logits = self._run(chunk, where, slots, last, ends[at : at + MAX_TOKENS])
            self._advance(where, slots)
        return logits[0]

    def _rotations(self, positions: np.ndarray, ends: np.ndarray | None
                   ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """cos and sin ``(tables, M, D/2)`` of the rows' positions (int64), as llama.cpp
        computes its rotary table (``attnlm_rope``): each table's base and linear scaling,
        and the first table's frequency factors where the model has them (LongRoPE's long
        set in the rows whose sequence ``ends`` past the original context)."""
        c, m = self.config, len(positions)
        cos = np.empty((len(self.rope_bases), m, c.rotary_width // 2), np.float32)
        sin = np.empty_like(cos)
        for i, (base, scale) in enumerate(self.rope_bases):
            factors = self._factors if i == 0 else None
            far = None if self._long is None or i or ends is None else ends > c.rope_long_from
            if far is not None and far.all():
                factors = self._long
            self._rope(positions, base, scale, factors, cos[i], sin[i])
            if far is not None and far.any() and not far.all():  # some rows of each set
                long_cos, long_sin = np.empty_like(cos[i]), np.empty_like(sin[i])
                self._rope(positions, base, scale, self._long, long_cos, long_sin)
                cos[i] = np.where(far[:, None], long_cos, cos[i])
                sin[i] = np.where(far[:, None], long_sin, sin[i])
        if c.rope_mscale is not None:  # YaRN's / LongRoPE's scale of the global table
            cos[0] *= np.float32(c.rope_mscale)
            sin[0] *= np.float32(c.rope_mscale)
        return cos, sin

    def _rope(self, positions: np.ndarray, base: float, scale: float,
              factors: np.ndarray | None, cos: np.ndarray, sin: np.ndarray) -> None:  # fmt: skip
        """One rotary table into ``cos`` and ``sin`` ``(M, D/2)`` (``attnlm_rope``)."""
        self.lib.attnlm_rope(
            ctypes.c_void_p(_ptr(positions)),
            ctypes.c_int64(len(positions)),
            ctypes.c_int64(self.config.rotary_width),
            ctypes.c_float(base),
            ctypes.c_float(scale),
            ctypes.c_void_p(None if factors is None else _ptr(factors)),
            ctypes.c_void_p(_ptr(cos)),
            ctypes.c_void_p(_ptr(sin)),
        )

    def _check_rows(self, tokens, positions, slots) -> tuple[np.ndarray, ...]:
        """The rows' arrays as int64, checked (see :meth:`step_rows`)."""
        arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (tokens, positions, slots)]
        n = len(arrays[0])
        if not n or any(a.shape != (n,) for a in arrays):
            raise ValueError(f"step_rows takes three arrays (n,) of equal length n >= 1, got "
                             f"shapes {[a.shape for a in arrays]}")  # fmt: skip
        if self.max_len is None:
            raise ValueError("reset_slots(n_slots, max_len) comes before rows")
        tokens, positions, slots = arrays
        _check_range("token id", tokens, self.config.vocab_size)
        _check_range("slot", slots, self.rows)
        _check_range("position", positions, self.max_len)
        nxt: dict[int, int] = {}
        for s, p in zip(slots.tolist(), positions.tolist()):
            want = nxt.get(s)
            if want is None and p > self.held[s]:
                raise ValueError(f"position {p} of slot {s} leaves a gap: the slot holds "
                                 f"{self.held[s]} positions")  # fmt: skip
            if want is not None and p != want:
                raise ValueError(f"slot {s}'s rows must be consecutive positions, in order: "
                                 f"{p} follows {want - 1}")  # fmt: skip
            nxt[s] = p + 1
        return tokens, positions, slots

    def _advance(self, positions: np.ndarray, slots: np.ndarray) -> None:
        """Each slot now holds the positions up to its last row's (a lower one cuts it)."""
        for s, p in zip(slots.tolist(), positions.tolist()):
            self.held[s] = p + 1

    def _run(self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray,
             out: np.ndarray, ends: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """Logits ``(R, V)`` of the rows ``out`` of one C call over the rows (checked);
        ``ends``: where each row's sequence reaches (default: its slot's last row here)."""
        c, m = self.config, len(tokens)
        x = self._embed(tokens)  # (M, C), overwritten by the step
        if c.embed_scale is not None:
            x *= np.float32(c.embed_scale)
        if ends is None and self._long is not None:
            last = {s: p + 1 for s, p in zip(slots.tolist(), positions.tolist())}
            ends = np.asarray([last[s] for s in slots.tolist()], np.int64)
        cos, sin = self._rotations(positions, ends)  # (tables, M, D/2)
        out = np.ascontiguousarray(out, dtype=np.int64)
        rows = structs.Rows(_ptr(slots), _ptr(positions), _ptr(cos), _ptr(sin), _ptr(out),
                            len(out))  # fmt: skip
        logits = np.empty((len(out), c.vocab_size), np.float32)
        self.lib.attnlm_step_rows(ctypes.byref(self.struct), ctypes.byref(self._scratch_for(m)),
                                  _ptr(x), m, ctypes.byref(rows), _ptr(logits),
                                  self.threads)  # fmt: skip
        return logits

    def _embed(self, tokens: np.ndarray) -> np.ndarray:
        """Embedding rows of ``tokens``, each row dequantized: ``(M, C)`` float32 (only the
        rows asked for are read)."""
        ids = tokens.reshape(-1)
        if self.emb_type >= 0:
            rows = self.embedding[ids]  # (M, row bytes), copied from the map
            out = dequantize(rows.reshape(-1), self.emb_type, (len(ids), self.config.n_embd))
            return np.ascontiguousarray(out, dtype=np.float32)
        q = self.embedding[ids].astype(np.float32).reshape(len(ids), -1, 32)  # (M, G, 32)
        s = self.emb_scales[ids].astype(np.float32)[:, :, None]  # (M, G, 1)
        return np.ascontiguousarray((q * s).reshape(len(ids), -1))

    def _scratch_for(self, m: int) -> structs.Scratch:
        """Scratch for ``m`` rows or more (kept while the next steps fit: a server's steps
        vary in rows)."""
        key = (m, self._cap, self.threads)
        old = self._scratch[0] if self._scratch else None
        if old is None or old[1:] != key[1:] or old[0] < m:
            c = self.config
            q, hd = (c.n_head + 2 * c.n_kv_head) * c.head_dim, c.n_head * c.head_dim
            sizes = structs.scratch_sizes(m, self._cap, self.threads, c.n_embd, q, hd,
                                          2 * c.d_ff, c.vocab_size)  # fmt: skip
            moe = (m, c.n_expert, c.n_expert_used, c.n_embd, c.d_ff)  # (Scratch.moe's rows)
            sizes += (self.lib.attnlm_moe_floats(*moe),) if c.n_expert else ()
            arrays = [np.empty(n, np.float32) for n in sizes]
            self._scratch = (key, structs.Scratch(*[_ptr(a) for a in arrays]), arrays)
        return self._scratch[1]


def _check_range(what: str, values: np.ndarray, stop: int) -> None:
    """ValueError naming the first of ``values`` outside ``[0, stop)``."""
    bad = values[(values < 0) | (values >= stop)]
    if len(bad):
        raise ValueError(f"{what} {int(bad[0])} is out of range [0, {stop})")


def _rotary_tables(c: EngineConfig) -> tuple[list[tuple[float, float]], list[int]]:
    """Each rotary table's base and position scale (``attnlm_rope``'s) and each layer's
    table: 0 the global base's (positions scaled by 1 / a linear scaling's factor), 1 the
    sliding layers' own base where the model has one (Gemma 3), -1 none (a NoPE layer)."""
    bases = [(c.rope_theta, 1 / (c.rope_linear or 1))]
    tables = [0] * c.n_layer
    if c.rope_local_theta is not None and any(c.window(i) for i in range(c.n_layer)):
        bases.append((c.rope_local_theta, 1.0))
        tables = [1 if c.window(i) else 0 for i in range(c.n_layer)]
    for i in c.nope_layers or ():
        tables[i] = -1
    return bases, tables
