"""The C step inside a PyTorch model: a few new tokens through a causal decoder (gpt, llama) in
one C call (:mod:`attnlm.native`), the weights read in the format they are stored in: float32
(either layout), bfloat16, q8 or q4 (:mod:`attnlm.quant`: the layers and their byte layouts).

:class:`CStepRunner` is the ``c-step`` backend (:mod:`attnlm.runtime`): the planner builds it
once per decode where :func:`why_not_supported` finds nothing against the model. It owns the
model's C description (:class:`CModel`: the pointers and sizes of every weight, built once by
the runner and kept alive with the tensors it points to) and, per decoding state, the key and
value buffers the C step writes (:class:`_Buffers`, room to grow). After each call the
state's ``keys`` / ``values`` are views of those buffers, so every other user of the state
(the forward, lookahead's trimming, beam search's reordering) sees an ordinary
:class:`~attnlm.nn.cache.KVCache`; a state whose tensors were replaced is copied in again.
A call the C step does not cover (more than :data:`MAX_TOKENS` new tokens per row, float
weights over their row limit, a compiled step's fixed buffers) runs on the eager backend.
Both give the same logits up to float rounding of a different summation order (tested:
within 1e-4 for every weight format, the same greedy tokens over 64 steps, one and several
rows, one and several new tokens).

Shape legend
    B rows    T new tokens per row    M = B T    C width    V vocabulary
    Hkv key/value heads    D head width    S positions held
"""

from __future__ import annotations

import ctypes
import math
import sys
import weakref

import torch
from torch import Tensor, nn

from attnlm import native
from attnlm.base.device import model_device
from attnlm.models.base import check_ids
from attnlm.native import structs
from attnlm.nn import fused
from attnlm.nn.blocks import ACTIVATIONS, SwiGLU
from attnlm.nn.cache import KVCache
from attnlm.nn.static_cache import StaticKVCache
from attnlm.quant.layers import QuantLinear
from attnlm.runtime.eager import EagerRunner, plain_block, unplain_part

__all__ = ["MAX_TOKENS", "CModel", "CStepRunner", "why_not_supported"]

MAX_TOKENS = 64  # new tokens per row from which the forward's GEMMs are faster (prefill)
# rows (B T) beyond which float weights go to the forward's GEMMs, which reuse each weight
# across rows better than the C step's products (measured): row-major float32 and bfloat16
# weights from 5 rows on; column-major float32 (the decoding layout), whose product applies
# each 8 x 16 weights to two rows at a time from registers, from MAX_FLOAT_ROWS_T + 1 (at 4 to
# 16 rows the whole step takes 0.7 times what MKL's GEMMs take for its products alone, and 32
# rows 0.83 times the forward); 8- and 4-bit weights are widened once for 4 rows at a time, as
# fast up to about MAX_TOKENS rows as dequantizing them for one GEMM (measured)
MAX_FLOAT_ROWS = 4
MAX_FLOAT_ROWS_T = 32
GROW = 256  # cache buffers grow by at least this many positions

_F32, _BF16, _Q8, _Q4, _F32T = structs.F32, structs.BF16, structs.Q8, structs.Q4, structs.F32T
_ACTS = {id(ACTIVATIONS["gelu"]): 1, id(ACTIVATIONS["gelu_tanh"]): 2, id(ACTIVATIONS["relu"]): 3}
_Linear, _Norm, _Block, _Model, _Scratch = structs.STRUCTS

_NOTED = [False]


def _library() -> ctypes.CDLL | None:
    lib = native.library()
    if lib is None:
        if not _NOTED[0] and native.why_not != "ATTNLM_NATIVE=0":  # say it once per process
            _NOTED[0] = True
            print(f"attnlm: {native.why_not}; decoding takes the slower eager path",
                  file=sys.stderr)  # fmt: skip
        return None
    return lib


# -- describing the model --------------------------------------------------------------------


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _linear_parts(layer: nn.Module) -> tuple[int, Tensor, Tensor | None, int] | None:
    """(format, weight tensor, scales or None, padded rows) of a layer the C step reads, or
    None (a LoRA layer, a float64 weight, ...)."""
    if isinstance(layer, QuantLinear):
        if not all(t.is_contiguous() for t in layer.buffers() if t is not None):
            return None
        if layer.fmt == "bf16":
            return _BF16, layer.weight, None, layer.out_features
        if layer.fmt == "q8":
            return _Q8, layer.qweight, layer.scales, layer.out_features
        return _Q4, layer.qweight, layer.scales_mins, layer.qweight.shape[0]
    if not (isinstance(layer, nn.Linear) and type(layer).forward in _PLAIN_FORWARDS):
        return None
    w = layer.weight
    if w.dtype != torch.float32 or w.device.type not in ("cpu", "meta"):  # meta: shapes only
        return None
    if w.is_contiguous():
        return _F32, w, None, layer.out_features
    if w.t().is_contiguous():  # the decoding layout (attnlm.nn.layout): Wᵀ row-major
        return _F32T, w, None, layer.out_features
    return None


_PLAIN_FORWARDS = (nn.Linear.forward, fused.Linear.forward)


def _bias_ok(layer: nn.Module) -> bool:
    b = getattr(layer, "bias", None)
    return b is None or (b.dtype == torch.float32 and b.is_contiguous())


def _describe_linear(layer: nn.Module, keep: list[Tensor]) -> _Linear:
    fmt, w, scales, n_pad = _linear_parts(layer)
    keep += [t for t in (w, scales, layer.bias) if t is not None]
    n = layer.out_features
    k = layer.in_features
    return _Linear(fmt, n, k, n_pad, _ptr(w), _ptr(scales), _ptr(layer.bias))


def _norm_kind(norm: nn.Module) -> tuple[int, float] | None:
    if isinstance(norm, nn.RMSNorm):
        eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
        return 0, eps
    if isinstance(norm, nn.LayerNorm) and len(norm.normalized_shape) == 1:
        return 1, norm.eps
    return None


def _norm_ok(norm: nn.Module) -> bool:
    tensors = (getattr(norm, "weight", None), getattr(norm, "bias", None))
    return all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors if t is not None)


def _describe_norm(norm: nn.Module, keep: list[Tensor]) -> _Norm:
    w, b = norm.weight, getattr(norm, "bias", None)
    keep += [t for t in (w, b) if t is not None]
    return _Norm(_ptr(w), _ptr(b))


def _act(mlp: nn.Module) -> int | None:
    if isinstance(mlp, SwiGLU):
        return 0
    return _ACTS.get(id(mlp.act))


def _linears(model: nn.Module) -> list[nn.Module]:
    """Every linear layer the C step multiplies by: four per block and the LM head."""
    layers = [model.lm_head]
    for block in model.blocks:
        layers += [block.attn.qkv_proj, block.attn.out_proj, block.mlp.fc, block.mlp.proj]
    return layers


def _blocks_reason(model: nn.Module) -> str | None:
    """What in ``model``'s blocks the C step does not compute, or None."""
    if getattr(model, "alibi", None) is not None:
        return "ALiBi positions"
    part = unplain_part(model)  # the Llama family's optional parts (models/llama.py)
    if part is not None:
        return part
    attns = [b.attn for b in model.blocks]
    if any(a.n_head * a.d_head != getattr(a, "d_model", a.n_head * a.d_head) for a in attns):
        return "a head width other than n_embd / n_head"
    if not len(model.blocks) or not all(plain_block(b) for b in model.blocks):
        return "blocks other than pre-norm attention + GELU/ReLU/SwiGLU feed-forward"
    kinds = {_norm_kind(n) for b in model.blocks for n in (b.ln_1, b.ln_2)}
    kinds.add(_norm_kind(model.ln_f))
    if len(kinds) != 1 or None in kinds:
        return "norms other than one kind of RMSNorm or LayerNorm"
    first = model.blocks[0].attn
    shapes = {(b.attn.n_head, b.attn.n_kv_head, b.attn.d_head) for b in model.blocks}
    if first.n_head % first.n_kv_head or len(shapes) != 1:
        return "heads that differ between layers"
    acts = {_act(b.mlp) for b in model.blocks}
    if len(acts) != 1 or None in acts:
        return "an activation other than one of GELU, GELU-tanh, ReLU or SwiGLU"
    return None


def why_not_supported(model: nn.Module) -> str | None:
    """Why the C step does not compute ``model``'s forward (a short phrase), or None when it
    does: its blocks (:func:`_blocks_reason`), its weights (every linear layer float32 on the
    CPU, bfloat16, q8 or q4, not adapted), its norms' tensors float32."""
    if not all(hasattr(model, a) for a in ("blocks", "tok_emb", "lm_head", "ln_f")):
        return f"a {type(model).__name__} is not a causal decoder"
    reason = _blocks_reason(model)
    if reason is not None:
        return reason
    norms = [n for b in model.blocks for n in (b.ln_1, b.ln_2)] + [model.ln_f]
    if not all(_norm_ok(n) for n in norms):
        return "norm weights that are not float32"
    if not all(_linear_parts(layer) is not None and _bias_ok(layer) for layer in _linears(model)):
        return "linear layers it does not read (adapters, float64, or weights off the CPU)"
    return None


class CModel:
    """The C description of one model (see the module docstring): the ``Model`` struct, its
    blocks, the tensors they point to (kept alive) and scratch buffers per call shape."""

    def __init__(self, model: nn.Module) -> None:
        keep: list[Tensor] = []
        blocks = model.blocks
        attn, mlp = blocks[0].attn, blocks[0].mlp
        self.H, self.Hkv, self.D = attn.n_head, attn.n_kv_head, attn.d_head
        self.C = model.tok_emb.embedding_dim
        act = _act(mlp)
        self.F = mlp.fc.out_features // 2 if act == 0 else mlp.fc.out_features
        self.NF = mlp.fc.out_features
        self.V = model.lm_head.out_features
        self.array = (_Block * len(blocks))()
        for i, block in enumerate(blocks):
            self.array[i] = _Block(
                _describe_norm(block.ln_1, keep), _describe_norm(block.ln_2, keep),
                _describe_linear(block.attn.qkv_proj, keep),
                _describe_linear(block.attn.out_proj, keep),
                _describe_linear(block.mlp.fc, keep), _describe_linear(block.mlp.proj, keep),
                None, None,
            )  # fmt: skip
            if getattr(block.attn, "nope", False):  # a layer without positions: no rotation
                self.array[i].table = -1
        norm, eps = _norm_kind(model.ln_f)
        scale = attn.score.sdpa_scale
        self.struct = _Model(
            len(blocks), self.C, self.H, self.Hkv, self.D, self.F, self.V, 0, norm, act,
            int(model.rotary is not None), eps, 1 / math.sqrt(self.D) if scale is None else scale,
            ctypes.addressof(self.array), _describe_norm(model.ln_f, keep),
            _describe_linear(model.lm_head, keep),
        )  # fmt: skip
        width = 2 * model.rotary.inv_freq.numel() if model.rotary is not None else self.D
        self.struct.rot = 0 if width == self.D else width  # partial rotary: the first R turn
        self.keep = keep
        fmt = self.array[0].qkv.fmt
        self.float_weights = fmt in (_F32, _F32T, _BF16)
        self.max_rows = MAX_FLOAT_ROWS_T if fmt == _F32T else MAX_FLOAT_ROWS
        self.scratch: dict[tuple[int, int, int], tuple[_Scratch, list[Tensor]]] = {}
        self.buffers: object = None  # the _Buffers whose pointers the blocks hold

    def scratch_for(self, m: int, cap: int, threads: int) -> _Scratch:
        key = (m, cap, threads)
        if key not in self.scratch:
            q = (self.H + 2 * self.Hkv) * self.D
            sizes = structs.scratch_sizes(m, cap, threads, self.C, q, self.H * self.D, self.NF,
                                          self.V)  # fmt: skip
            tensors = [torch.empty(n) for n in sizes]
            self.scratch = {key: (_Scratch(*[t.data_ptr() for t in tensors]), tensors)}
        return self.scratch[key][0]

    def point_at(self, buf: _Buffers) -> None:
        """Let the blocks' cache pointers name ``buf`` (buffers never change once made, so
        the same object means the same pointers)."""
        if self.buffers is not buf:
            for i, block in enumerate(self.array):
                block.k_cache, block.v_cache = buf.k[i].data_ptr(), buf.v[i].data_ptr()
            self.struct.cap = buf.cap
            self.buffers = buf


# -- the cache buffers -----------------------------------------------------------------------


class _Buffers:
    """Keys and values ``(B, Hkv, cap, D)`` per layer (``k``, ``v``), ``cap`` positions of
    room, and the views of them last given to the cache. Never changed once made: other
    tensors make other buffers."""

    def __init__(self, k: list[Tensor], v: list[Tensor]) -> None:
        self.k, self.v = k, v
        self.rows, _, self.cap, _ = k[0].shape
        self.views: tuple[list, list] = ([None] * len(k), [None] * len(k))

    @classmethod
    def empty(cls, n_layer: int, b: int, hkv: int, cap: int, d: int) -> _Buffers:
        return cls(*[[torch.empty(b, hkv, cap, d) for _ in range(n_layer)] for _ in "kv"])

    @classmethod
    def of_static(cls, state: StaticKVCache, b: int, hkv: int, d: int, end: int) -> _Buffers:
        """A :class:`~attnlm.nn.static_cache.StaticKVCache`'s own buffers (its ``k_buf`` /
        ``v_buf``, grown or refused by its own rule), so that its prefix-mode appends and the
        C step write to the same memory."""
        like = torch.empty(b, hkv, 0, d)
        for layer in range(len(state.keys)):
            state._buffers(layer, like, end)
        return cls(list(state.k_buf), list(state.v_buf))


def _holds(buf: _Buffers, state: KVCache, held: int) -> bool:
    """Whether ``state``'s keys and values are the first ``held`` positions of ``buf``."""
    for mine, theirs, views in ((buf.k, state.keys, buf.views[0]), (buf.v, state.values,
                                                                     buf.views[1])):  # fmt: skip
        for t, held_t, view in zip(mine, theirs, views):
            if held_t is view:
                continue
            if held_t is None or held_t.data_ptr() != t.data_ptr() or held_t.stride() != t.stride():
                return False
            if held_t.shape[-2] != held:
                return False
    return True


class CStepRunner(EagerRunner):
    """The ``c-step`` backend: ``step(tokens, state, last_only)`` as the eager backend's, in
    one C call where the call fits (:meth:`covers`). Build it where
    :func:`why_not_supported` is None and the C library loads (:mod:`attnlm.runtime.planner`
    decides)."""

    name = "c-step"

    def __init__(self, model: nn.Module, reason: str = "") -> None:
        super().__init__(model, reason)
        if model_device(model).type != "cpu":
            raise RuntimeError("the C step runs a model on the CPU")
        self.lib = _library()
        if self.lib is None:
            raise RuntimeError(f"no C decode step: {native.why_not}")
        self.c = CModel(model)
        # the key/value buffers of each state this runner has stepped (the states own nothing)
        self.held: weakref.WeakKeyDictionary[KVCache, _Buffers] = weakref.WeakKeyDictionary()

    def covers(self, tokens: Tensor, state: object) -> bool:
        """Whether this call runs in C: a dynamic KV cache of the model's depth without
        cross-attention holding float32, 1 to :data:`MAX_TOKENS` new tokens per row on the
        CPU (float weights: at most ``max_rows`` tokens in all), without gradients."""
        return (
            isinstance(state, KVCache)
            and not getattr(state, "fixed", False)
            and tokens.dim() == 2
            and 0 < tokens.shape[1] <= MAX_TOKENS
            and not (self.c.float_weights and tokens.numel() > self.c.max_rows)
            and tokens.device.type == "cpu"
            and state.cross[0] is None
            and len(state.keys) == len(self.model.blocks)
            and (state.keys[0] is None or state.keys[0].dtype == torch.float32)
            and not torch.is_grad_enabled()
            and not self.model.training
        )

    def step(self, tokens: Tensor, state: KVCache, last_only: bool = False) -> Tensor:
        if self.covers(tokens, state):
            return self.c_step(tokens, state, last_only)
        return super().step(tokens, state, last_only)

    def _buffers(self, state: KVCache, b: int, t: int) -> _Buffers:
        """The buffers holding ``state``'s keys and values with room for ``t`` more
        positions: a static cache's own, else the ones it already uses, or new ones with its
        tensors copied in."""
        held, mine = state.length, self.held.get(state)
        if isinstance(state, StaticKVCache):
            if not (
                mine is not None
                and mine.rows == b
                and held + t <= mine.cap
                and all(a is c for a, c in zip(mine.k + mine.v, state.k_buf + state.v_buf))
            ):
                mine = self.held[state] = _Buffers.of_static(state, b, self.c.Hkv, self.c.D,
                                                             held + t)  # fmt: skip
            return mine
        fits = mine is not None and mine.rows == b and held + t <= mine.cap
        if fits and _holds(mine, state, held):
            return mine
        cap = max(2 * (held + t), held + t + GROW)
        new = _Buffers.empty(len(state.keys), b, self.c.Hkv, cap, self.c.D)
        if held:
            for mine_t, theirs in ((new.k, state.keys), (new.v, state.values)):
                for dest, src in zip(mine_t, theirs):
                    dest[:, :, :held].copy_(src)
        self.held[state] = new
        return new

    def c_step(self, tokens: Tensor, state: KVCache, last_only: bool = False) -> Tensor:
        """Logits ``(B, T, V)`` of ``tokens`` ``(B, T)`` after what ``state`` holds (which
        takes their keys and values), as ``model(tokens, cache=state).logits``, or
        ``(B, 1, V)`` of each row's last token with ``last_only``; call where
        :meth:`covers`."""
        model, c = self.model, self.c
        check_ids(tokens, model.config.vocab_size, "tokens")
        b, t = tokens.shape
        m = b * t
        held = state.length
        buf = self._buffers(state, b, t)
        c.point_at(buf)
        positions = state.positions(t, tokens.device)  # (T,)
        x = model.tok_emb(tokens)  # (B, T, C)
        if model.pos_emb is not None:
            x = x + model.pos_emb(positions).to(x.dtype)
        x = x.reshape(m, c.C).float().contiguous()  # a fresh tensor: the C step overwrites it
        if model.rotary is not None:
            cos, sin = model.rotary(positions)  # (T, R): the two halves equal
            half = cos.shape[-1] // 2
            cos, sin = cos[:, :half].contiguous(), sin[:, :half].contiguous()
        else:
            cos = sin = x  # not read
        logits = torch.empty(b if last_only else m, c.V)
        threads = torch.get_num_threads()
        scratch = c.scratch_for(m, buf.cap, threads)
        pointers = (x.data_ptr(), b, t, held, cos.data_ptr(), sin.data_ptr(), logits.data_ptr())
        self.lib.attnlm_decode_step(ctypes.byref(c.struct), ctypes.byref(scratch), *pointers,
                                    int(last_only), threads)  # fmt: skip
        for i in range(len(buf.k)):
            k, v = buf.k[i][:, :, : held + t], buf.v[i][:, :, : held + t]
            buf.views[0][i], buf.views[1][i] = k, v
            state.keys[i], state.values[i] = k, v
        state.advance(t)
        return logits.view(b, 1 if last_only else t, c.V)
