"""A few new tokens through a causal decoder in one C call (:mod:`attnlm.native`), the weights
read in the format they are stored in: float32 (either layout), bfloat16, q8 or q4
(:mod:`attnlm.nn.quant`).

This is the decoding path of gpt and llama models on the CPU: :meth:`Decoder.step
<attnlm.models.decoder.Decoder.step>` and :meth:`Decoder.forward
<attnlm.models.decoder.Decoder.forward>` with a cache and at most :data:`MAX_TOKENS` new
tokens per row take it where :func:`native_applies` says so, else the PyTorch path
(:func:`~attnlm.models.decode_step.flat_step` or the forward). Both give the same logits up to
float rounding of a different summation order (tested: within 1e-4 for every weight format,
the same greedy tokens over 64 steps, one and several rows, one and several new tokens).

The C side needs every tensor as a pointer. :class:`_Plan` holds the model's description (the
pointers and sizes, built once per model and checked cheaply on every call: a replaced layer or
a weight moved to new memory builds a new one) and keeps the tensors it points to alive. The
keys and values live in per-cache buffers with room to grow (:class:`_Buffers`); after each
call the cache's ``keys`` / ``values`` are views of them, so every other user of the cache
(the forward, lookahead's trimming, beam search's reordering) sees an ordinary
:class:`~attnlm.nn.cache.KVCache`; a cache whose tensors were replaced is copied in again.

Shape legend
    B rows    T new tokens per row    M = B T    C width    V vocabulary
    Hkv key/value heads    D head width    S positions held
"""

from __future__ import annotations

import ctypes
import math
import sys

import torch
from torch import Tensor, nn

from attnlm import native
from attnlm.models.base import check_ids
from attnlm.models.decode_step import _plain_block
from attnlm.native import structs
from attnlm.nn import fused
from attnlm.nn.blocks import ACTIVATIONS, SwiGLU
from attnlm.nn.cache import KVCache
from attnlm.nn.quant import QuantLinear
from attnlm.nn.static_cache import StaticKVCache

__all__ = ["MAX_TOKENS", "native_applies", "native_step"]

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

# Counts every module, parameter and buffer assignment in the process (torch's global
# registration hooks): a plan built at one count still describes the same layers if the count
# has not moved (then only a weight moved to new memory, ``.data = ...``, is left to check).
_ASSIGNMENTS = [0]


def _count(*_args: object) -> None:
    _ASSIGNMENTS[0] += 1


for _register in (
    torch.nn.modules.module.register_module_module_registration_hook,
    torch.nn.modules.module.register_module_parameter_registration_hook,
    torch.nn.modules.module.register_module_buffer_registration_hook,
):
    _register(_count)


_NOTED = [False]


def _library() -> ctypes.CDLL | None:
    lib = native.library()
    if lib is None:
        if not _NOTED[0] and native.why_not != "ATTNLM_NATIVE=0":  # say it once per process
            _NOTED[0] = True
            print(f"attnlm: {native.why_not}; decoding takes the slower PyTorch path",
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
    if w.dtype != torch.float32 or w.device.type != "cpu":
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


def _supported(model: nn.Module) -> bool:
    """Whether the C step computes ``model``'s forward (checked once per description)."""
    if getattr(model, "alibi", None) is not None or not len(model.blocks):
        return False
    if not all(_plain_block(b) for b in model.blocks):
        return False
    kinds = {_norm_kind(n) for b in model.blocks for n in (b.ln_1, b.ln_2)}
    kinds.add(_norm_kind(model.ln_f))
    if len(kinds) != 1 or None in kinds:
        return False
    first = model.blocks[0].attn
    if first.n_head % first.n_kv_head:
        return False
    for block in model.blocks:
        attn = block.attn
        if (attn.n_head, attn.n_kv_head, attn.d_head) != (first.n_head, first.n_kv_head,
                                                          first.d_head):  # fmt: skip
            return False
        if _act(block.mlp) is None or _act(block.mlp) != _act(model.blocks[0].mlp):
            return False
        if not (_norm_ok(block.ln_1) and _norm_ok(block.ln_2)):
            return False
    if not all(_linear_parts(layer) is not None and _bias_ok(layer) for layer in _linears(model)):
        return False
    return _norm_ok(model.ln_f)


class _Plan:
    """The C description of one model (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.assignments = _ASSIGNMENTS[0]
        self.supported = _supported(model)
        self.keep: list[Tensor] = []
        self.movable: list[Tensor] = []
        self.ptrs: list[int] = []
        self.float_weights = False
        self.max_rows = MAX_FLOAT_ROWS
        self.scratch: dict[tuple[int, int, int], tuple[_Scratch, list[Tensor]]] = {}
        self.buffers: object = None  # the _Buffers whose pointers the blocks hold
        if not self.supported:
            return
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
        norm, eps = _norm_kind(model.ln_f)
        scale = attn.score.sdpa_scale
        self.struct = _Model(
            len(blocks), self.C, self.H, self.Hkv, self.D, self.F, self.V, 0, norm, act,
            int(model.rotary is not None), eps, 1 / math.sqrt(self.D) if scale is None else scale,
            ctypes.addressof(self.array), _describe_norm(model.ln_f, keep),
            _describe_linear(model.lm_head, keep),
        )  # fmt: skip
        self.keep = keep
        self.float_weights = self.array[0].qkv.fmt in (_F32, _F32T, _BF16)
        self.max_rows = MAX_FLOAT_ROWS_T if self.array[0].qkv.fmt == _F32T else MAX_FLOAT_ROWS
        # parameters may be moved by ``.data = ...`` (attnlm.nn.layout does), which no hook sees
        self.movable = [t for t in keep if isinstance(t, nn.Parameter)]
        self.ptrs = [t.data_ptr() for t in self.movable]

    def current(self) -> bool:
        """Whether the model still holds the layers and tensor memory described (tens of
        microseconds: no layer was assigned anywhere, and the tensors are where they were)."""
        moved = [t.data_ptr() for t in self.movable] != self.ptrs
        return _ASSIGNMENTS[0] == self.assignments and not moved

    def scratch_for(self, m: int, cap: int, threads: int) -> _Scratch:
        key = (m, cap, threads)
        if key not in self.scratch:
            q = (self.H + 2 * self.Hkv) * self.D
            sizes = structs.scratch_sizes(m, cap, threads, self.C, q, self.H * self.D, self.NF,
                                          self.V)  # fmt: skip
            tensors = [torch.empty(n) for n in sizes]
            self.scratch = {key: (_Scratch(*[t.data_ptr() for t in tensors]), tensors)}
        return self.scratch[key][0]


def _plan(model: nn.Module) -> _Plan:
    plan = model.__dict__.get("_native_plan")
    if plan is None or not plan.current():
        plan = _Plan(model)
        model.__dict__["_native_plan"] = plan  # not a submodule, not in the state dict
    return plan


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


def _buffers(plan: _Plan, state: KVCache, b: int, t: int) -> _Buffers:
    """The buffers holding ``state``'s keys and values with room for ``t`` more positions:
    a static cache's own, else the ones it already uses, or new ones with its tensors copied
    in."""
    held = state.length
    if isinstance(state, StaticKVCache):
        mine = state.__dict__.get("_native_buffers")
        if not (
            isinstance(mine, _Buffers)
            and mine.rows == b
            and held + t <= mine.cap
            and all(a is c for a, c in zip(mine.k + mine.v, state.k_buf + state.v_buf))
        ):
            mine = _Buffers.of_static(state, b, plan.Hkv, plan.D, held + t)
            state.__dict__["_native_buffers"] = mine
        return mine
    buf = state.__dict__.get("_native_buffers")
    if buf is not None and buf.rows == b and held + t <= buf.cap and _holds(buf, state, held):
        return buf
    cap = max(2 * (held + t), held + t + GROW)
    new = _Buffers.empty(len(state.keys), b, plan.Hkv, cap, plan.D)
    if held:
        for mine, theirs in ((new.k, state.keys), (new.v, state.values)):
            for dest, src in zip(mine, theirs):
                dest[:, :, :held].copy_(src)
    state.__dict__["_native_buffers"] = new
    return new


# -- the public calls ------------------------------------------------------------------------


def native_applies(model: nn.Module, tokens: Tensor, state: object) -> bool:
    """Whether :func:`native_step` computes ``model(tokens, cache=state).logits``: the C
    library is available, the model is evaluated without gradients on the CPU in float32,
    its blocks are what the C step computes (pre-norm, RMSNorm or LayerNorm, rotary, learned,
    sinusoidal or no positions, no ALiBi, GELU/ReLU or SwiGLU, every linear layer float32,
    bfloat16, q8 or q4), ``state`` is a dynamic :class:`~attnlm.nn.cache.KVCache` without
    cross-attention, and each row brings 1 to :data:`MAX_TOKENS` tokens (float weights: at
    most :data:`MAX_FLOAT_ROWS` tokens in all, :data:`MAX_FLOAT_ROWS_T` in the decoding
    layout)."""
    if torch.compiler.is_compiling():  # a compiled step traces the PyTorch path
        return False
    if not (
        isinstance(state, KVCache)
        and not getattr(state, "fixed", False)
        and tokens.dim() == 2
        and 0 < tokens.shape[1] <= MAX_TOKENS
        and tokens.device.type == "cpu"
        and not model.training
        and not torch.is_grad_enabled()
        and _library() is not None
    ):
        return False
    if state.cross[0] is not None or len(state.keys) != len(model.blocks):
        return False
    if state.keys[0] is not None and state.keys[0].dtype != torch.float32:
        return False
    plan = _plan(model)
    if plan.supported and plan.float_weights and tokens.numel() > plan.max_rows:
        return False
    return plan.supported


def native_step(model: nn.Module, tokens: Tensor, state: KVCache, last_only: bool = False
                ) -> Tensor:  # fmt: skip
    """Logits ``(B, T, V)`` of ``tokens`` ``(B, T)`` after what ``state`` holds (which takes
    their keys and values), as ``model(tokens, cache=state).logits``, or ``(B, 1, V)`` of each
    row's last token with ``last_only``; call only where :func:`native_applies`."""
    lib = _library()
    plan = _plan(model)
    check_ids(tokens, model.config.vocab_size, "tokens")
    b, t = tokens.shape
    m = b * t
    held = state.length
    buf = _buffers(plan, state, b, t)
    if plan.buffers is not buf:  # buffers never change, so the same object: the same pointers
        for i, block in enumerate(plan.array):
            block.k_cache, block.v_cache = buf.k[i].data_ptr(), buf.v[i].data_ptr()
        plan.struct.cap = buf.cap
        plan.buffers = buf
    positions = state.positions(t, tokens.device)  # (T,)
    x = model.tok_emb(tokens)  # (B, T, C)
    if model.pos_emb is not None:
        x = x + model.pos_emb(positions).to(x.dtype)
    x = x.reshape(m, plan.C).float().contiguous()  # a fresh tensor: the C step overwrites it
    if model.rotary is not None:
        angles = positions.float()[:, None] * model.rotary.inv_freq  # (T, D/2)
        cos, sin = angles.cos(), angles.sin()
    else:
        cos = sin = x  # not read
    logits = torch.empty(b if last_only else m, plan.V)
    threads = torch.get_num_threads()
    scratch = plan.scratch_for(m, buf.cap, threads)
    pointers = (x.data_ptr(), b, t, held, cos.data_ptr(), sin.data_ptr(), logits.data_ptr())
    lib.attnlm_decode_step(ctypes.byref(plan.struct), ctypes.byref(scratch), *pointers,
                           int(last_only), threads)  # fmt: skip
    for i in range(len(buf.k)):
        k, v = buf.k[i][:, :, : held + t], buf.v[i][:, :, : held + t]
        buf.views[0][i], buf.views[1][i] = k, v
        state.keys[i], state.values[i] = k, v
    state.advance(t)
    return logits.view(b, 1 if last_only else t, plan.V)
