"""Fused training kernels for the CPU: the same numbers as the straightforward layers (tested
against them, gradients included) in fewer passes over memory.

In eager PyTorch every elementwise operation is one pass over its tensors, and autograd's
backward of a chain of small operations is a longer chain (slices become zero-filled copies,
``chunk``/``split`` become ``cat``). Each kernel here is an :class:`torch.autograd.Function`
whose backward is written by hand from the derivative, so it reads and writes each tensor as
few times as the math allows and saves only what it needs. When autograd does not record
(inference, decoding) the plain ATen ops run instead (:func:`rotary_heads` keeps its one-pass
forward), since there is no backward to save and their calls cost less on small tensors;
under ``torch.compile`` the callers use the plain ops too (the compiler fuses them itself).

* :func:`linear`: ``y = x Wᵀ + b`` on oneDNN's float32 matrix multiply where PyTorch has it
  (``torch.ops.mkldnn._linear_pointwise``, an internal PyTorch operator, so
  :func:`onednn_available` checks it once against ``F.linear``); the backward's two products
  ``dx = dy W`` and ``dW = dyᵀ x`` go through it too.
  On x86 CPUs where MKL's float32 GEMM is not tuned for these shapes (AMD EPYC) this is
  the largest saving; on Intel CPUs, whose tuned MKL code ``F.linear`` and ``torch.mm`` already
  run, oneDNN is no faster (slower for the transposed products of the backward), so
  :func:`onednn_preferred` keeps it off there (``ATTNLM_ONEDNN=1``/``0`` overrides the choice).
  For fewer than :data:`ONEDNN_MIN_ROWS` rows, under autocast, or with
  ``torch.backends.mkldnn.enabled = False`` it is ``torch.nn.functional.linear``.
* :func:`rms_norm`: ``y = x / rms(x) · γ`` with ``rms(x) = sqrt(mean(x²) + ε)``; backward
  ``dx = (g - x̂ · mean(g ⊙ x̂)) / rms`` with ``g = dy ⊙ γ`` and ``x̂ = x / rms``, and
  ``dγ = Σ_rows dy ⊙ x̂``; the row sums are matrix-vector products.
* :func:`rotary_heads`: the fused q/k/v projection split into heads, with rotary positions
  applied to q and k in one pass. A rotation is orthogonal, so the backward is the inverse
  rotation (angle ``-θ``) of the incoming gradient, written into one ``(B, T, C + 2 C_kv)``
  buffer: nothing is saved but ``cos`` and ``sin``.

Shape legend
    N  rows (tokens: B T)
    B  batch size, T tokens
    H  query heads, Hkv key/value heads, D head width
    C  model width
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlm.nn.grad_precision import bf16_backward, bf16_backward_support
from attnlm.nn.grad_precision import bf16_grads as _bf16_grads
from attnlm.nn.grad_precision import products_in_bf16 as _products_in_bf16

__all__ = [
    "ONEDNN_MIN_ROWS",
    "Linear",
    "RMSNorm",
    "bf16_backward",
    "bf16_backward_support",
    "chunked_head_loss",
    "linear",
    "mkl_tuned",
    "onednn_available",
    "onednn_preferred",
    "rms_norm",
    "rotary_heads",
    "swiglu",
    "use_onednn",
]

# Below this many rows MKL's call overhead is smaller than oneDNN's (measured), unless the
# product is large: from ONEDNN_SMALL_ROWS rows, a product of ONEDNN_MIN_WORK multiply-adds
# or more is faster on oneDNN (a 16-token prompt through a 768-wide model: 1.5-2.3x on an
# AMD EPYC, bench_interp.py; 64-wide layers stay on MKL, whose call costs ~10 us less)
ONEDNN_MIN_ROWS = 32
ONEDNN_SMALL_ROWS = 8
ONEDNN_MIN_WORK = 1 << 21


def _needs_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd records this call. Without a backward to save passes in (inference,
    decoding), the element-wise kernels below fall back to the plain ATen ops, whose calls
    cost less Python overhead on the small tensors of a decoding step."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# ---------------------------------------------------------------------------------------------
# The backward's products in bfloat16 (the mode itself: attnlm.nn.grad_precision)


def _grad_mm(bf16: bool) -> Callable[[Tensor, Tensor], Tensor]:
    """The product ``prod(a, w) = a wᵀ`` for a backward: ``F.linear`` in bfloat16 mode (the
    mode applies to its kernel, not to :func:`_gemm`'s oneDNN primitive), else :func:`_mm`."""
    return F.linear if bf16 else _mm


# ---------------------------------------------------------------------------------------------
# Linear layers on oneDNN


@functools.cache
def onednn_available() -> bool:
    """Whether this PyTorch has oneDNN's float32 linear kernel and it gives F.linear's
    numbers (checked once on a small product)."""
    try:
        op = torch.ops.mkldnn._linear_pointwise.default
        x = torch.linspace(-1, 1, 320).view(40, 8)  # fixed values: no draw from the global RNG
        w = torch.linspace(-2, 1, 96).view(12, 8)
        return bool(torch.allclose(op(x, w, None, "none", [], ""), F.linear(x, w), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


ONEDNN_ENV = "ATTNLM_ONEDNN"  # 1: oneDNN's linear wherever it applies, 0: never


def mkl_tuned(cpuinfo: str) -> bool:
    """Whether ``cpuinfo`` (the text of ``/proc/cpuinfo``) names an Intel CPU, on which MKL,
    PyTorch's float32 GEMM on x86, takes its tuned code paths."""
    return any(
        line.split(":", 1)[-1].strip() == "GenuineIntel"
        for line in cpuinfo.splitlines()
        if line.startswith("vendor_id")
    )


@functools.cache
def onednn_preferred() -> bool:
    """Whether :func:`linear` uses oneDNN's kernel (where it applies at all): it is available
    (:func:`onednn_available`) and the CPU is not one MKL is tuned for (:func:`mkl_tuned`);
    ``ATTNLM_ONEDNN=1`` or ``0`` decides instead. Read once per process."""
    import os

    forced = os.environ.get(ONEDNN_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1" and onednn_available()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            intel = mkl_tuned(f.read())
    except OSError:
        intel = False
    return not intel and onednn_available()


def _gemm(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """``x wᵀ + b`` for ``x`` ``(..., K)``, ``w`` ``(M, K)`` (any strides): oneDNN for float32,
    ``F.linear`` otherwise (float64 in the gradient checks)."""
    if x.dtype == torch.float32:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return F.linear(x, w, b)


class _Linear(torch.autograd.Function):
    """``y = x Wᵀ + b``; ``dx = dy W``, ``dW = dyᵀ x``, ``db = Σ_rows dy``. The products run
    on oneDNN's float32 kernel (``onednn``) or ``F.linear``; the backward's in bfloat16 when
    the forward ran inside :func:`bf16_backward`."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, onednn: bool) -> Tensor:
        # x serves dW only: a frozen weight (fine-tuning, LoRA) does not keep its input alive
        ctx.save_for_backward(x if weight.requires_grad else None, weight)
        ctx.has_bias, ctx.bf16 = bias is not None, _bf16_grads(x)
        ctx.onednn = onednn and not ctx.bf16
        return _gemm(x, weight, bias) if onednn else F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        dx = dw = db = None
        prod = _gemm if ctx.onednn else F.linear  # prod(a, w) = a wᵀ
        dy2 = dy.reshape(-1, dy.shape[-1])  # (N, M)
        with _products_in_bf16(ctx.bf16):
            if ctx.needs_input_grad[0]:
                dx = prod(dy, weight.t())  # dy W: (..., M) (M, K) -> (..., K)
            if ctx.needs_input_grad[1]:
                x2 = x.reshape(-1, x.shape[-1])  # (N, K)
                # oneDNN copies its first operand into row-major order: the narrower one
                if ctx.onednn and x2.shape[1] < dy2.shape[1]:
                    dw = prod(x2.t(), dy2.t()).t()  # (xᵀ dy)ᵀ: (M, K)
                else:
                    dw = prod(dy2.t(), x2.t())  # dyᵀ x: (M, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db, None


def _fusable(x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`linear` may take its own path: a float32 CPU product of at least
    :data:`ONEDNN_MIN_ROWS` rows (or :data:`ONEDNN_SMALL_ROWS` of a product of at least
    :data:`ONEDNN_MIN_WORK` multiply-adds), outside autocast and the compiler."""
    rows = x.numel() // max(1, x.shape[-1])
    return (
        (
            rows >= ONEDNN_MIN_ROWS  # first: decoding steps leave here
            or (rows >= ONEDNN_SMALL_ROWS and rows * weight.numel() >= ONEDNN_MIN_WORK)
        )
        and x.dim() >= 2
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.enabled
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()  # torch.compile picks its own kernels
    )


def _use_onednn(x: Tensor, weight: Tensor) -> bool:
    return _fusable(x, weight) and onednn_preferred()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` (``x`` ``(..., K)``, ``weight`` ``(M, K)``) on oneDNN's
    float32 kernel when it applies (CPU, float32, at least :data:`ONEDNN_MIN_ROWS` rows, no
    autocast, oneDNN enabled), otherwise ``F.linear`` itself; inside :func:`bf16_backward`
    the backward's products take bfloat16 inputs."""
    if not _fusable(x, weight):
        return F.linear(x, weight, bias)
    onednn = onednn_preferred()
    if _needs_grad(x, weight, bias) and (onednn or _bf16_grads(x)):
        return _Linear.apply(x, weight, bias, onednn)
    return _gemm(x, weight, bias) if onednn else F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state-dict keys) computed by :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def use_onednn(model: nn.Module) -> nn.Module:
    """Compute every ``nn.Linear`` of ``model`` by :func:`linear`: each is replaced by a
    :class:`Linear` holding the same parameter objects (so tied weights stay tied, optimisers
    and state-dict keys see the same tensors), in place; returns ``model``. A family applies it
    once to the model it built, so its block parts stay the plain ``nn.Linear`` layers of the
    lecture."""
    made: dict[int, Linear] = {}  # a layer shared by two parents stays one layer
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, made.setdefault(id(child), _as_fused(child)))
    return model


def _as_fused(layer: nn.Linear) -> Linear:
    """A :class:`Linear` over ``layer``'s own parameters (nothing allocated)."""
    fused = Linear(layer.in_features, layer.out_features, bias=False, device="meta")
    fused.weight, fused.bias = layer.weight, layer.bias
    fused.train(layer.training)
    return fused


# ---------------------------------------------------------------------------------------------
# RMSNorm


class _RMSNorm(torch.autograd.Function):
    """``y = x̂ γ`` with ``x̂ = x r``, ``r = 1 / sqrt(mean(x²) + ε)`` per row.

    Backward, with ``g = dy γ``: ``dx = r (g - x̂ mean(g x̂)) = r g - x (r³ Σ(dy x γ) / C)``,
    ``dγ = Σ_rows dy x̂ = (dy x)ᵀ r``; both sums are matrix-vector products of ``dy ⊙ x``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        C = x.shape[-1]
        x2 = x.reshape(-1, C)  # (N, C)
        ss = torch.linalg.vector_norm(x2, dim=-1, keepdim=True).square_()  # Σ x²: (N, 1)
        r = ss.div_(C).add_(eps).rsqrt_()  # (N, 1)
        ctx.save_for_backward(x2, weight, r)
        return (x2 * r).mul_(weight).view(x.shape)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x2, weight, r = ctx.saved_tensors
        C = x2.shape[-1]
        dy2 = dy.reshape(-1, C)  # (N, C)
        dyx = dy2 * x2  # (N, C)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            coef = torch.mv(dyx, weight).unsqueeze(-1).mul_(r.pow(3)).div_(-C)  # (N, 1)
            dx = (dy2 * weight).mul_(r).addcmul_(x2, coef).view(dy.shape)
        if ctx.needs_input_grad[1]:
            dw = torch.mv(dyx.t(), r.view(-1))  # (C,)
        return dx, dw, None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension of ``x`` ``(..., C)`` with gain ``weight`` ``(C,)``."""
    if not _needs_grad(x, weight) or x.dtype != weight.dtype or torch.compiler.is_compiling():
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return _RMSNorm.apply(x, weight, eps)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` over the last dimension (same parameter, same state-dict key) computed
    by :func:`rms_norm`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.weight is None or len(self.normalized_shape) != 1:
            return super().forward(x)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return rms_norm(x, self.weight, eps)


# ---------------------------------------------------------------------------------------------
# Rotary positions on the fused q/k/v projection


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, sign: float) -> None:
    """``out = R(sign θ) x`` on rotate-half pairs ``(x₁, x₂)`` (the two halves of the last
    dimension): ``(x₁ cos - sign x₂ sin, x₂ cos + sign x₁ sin)``; ``cos, sin`` ``(..., D/2)``
    broadcast to the halves."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-sign)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin, value=sign)


def _rotary_heads(
    qkv: Tensor, cos: Tensor, sin: Tensor, split: tuple[int, int, int]
) -> tuple[Tensor, ...]:
    """``qkv`` ``(B, T, (H + 2 Hkv) D)`` -> q ``(B, H, T, D)`` and k ``(B, Hkv, T, D)``
    rotated, v ``(B, Hkv, T, D)``: views of one new ``(B, T, H + 2 Hkv, D)`` buffer."""
    B, T, width = qkv.shape
    heads = sum(split)
    x = qkv.view(B, T, heads, width // heads).transpose(1, 2)  # (B, H + 2 Hkv, T, D)
    out = torch.empty_like(x.transpose(1, 2)).transpose(1, 2)  # the same layout
    rotated = split[0] + split[1]  # q and k heads
    _rotate(x[:, :rotated], cos, sin, out[:, :rotated], 1.0)
    out[:, rotated:].copy_(x[:, rotated:])
    return out.split(split, dim=1)


class _RotaryHeads(torch.autograd.Function):
    """:func:`_rotary_heads`; the backward rotates the gradients back."""

    @staticmethod
    def forward(ctx, qkv: Tensor, cos: Tensor, sin: Tensor, split: tuple[int, int, int]):
        ctx.save_for_backward(cos, sin)
        ctx.split = split
        return _rotary_heads(qkv, cos, sin, split)

    @staticmethod
    def backward(ctx, dq: Tensor | None, dk: Tensor | None, dv: Tensor | None):
        cos, sin = ctx.saved_tensors
        ref = next(t for t in (dq, dk, dv) if t is not None)
        B, _, T, D = ref.shape
        heads = sum(ctx.split)
        dx = ref.new_empty(B, T, heads, D)  # the layout of qkv
        parts = dx.transpose(1, 2).split(ctx.split, dim=1)  # (B, H | Hkv, T, D) views
        for grad, part, rotated in zip((dq, dk, dv), parts, (True, True, False), strict=True):
            if grad is None:
                part.zero_()
            elif rotated:  # the inverse rotation: R(θ)ᵀ = R(-θ)
                _rotate(grad, cos, sin, part, -1.0)
            else:
                part.copy_(grad)
        return dx.view(B, T, heads * D), None, None, None


def rotary_heads(
    qkv: Tensor, cos: Tensor, sin: Tensor, n_head: int, n_kv_head: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Split the fused projection ``qkv`` ``(B, T, (H + 2 Hkv) D)`` into heads and rotate q
    and k: returns q ``(B, H, T, D)``, k and v ``(B, Hkv, T, D)``. ``cos, sin`` are
    :class:`~attnlm.nn.positional.RotaryEmbedding`'s ``(T, D)`` or ``(B, 1, T, D)`` (the two
    halves of ``D`` hold the same angles)."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    split = (n_head, n_kv_head, n_kv_head)
    if not _needs_grad(qkv):
        return _rotary_heads(qkv, cos, sin, split)
    return _RotaryHeads.apply(qkv, cos, sin, split)


# ---------------------------------------------------------------------------------------------
# SwiGLU's gate


class _SwiGLU(torch.autograd.Function):
    """``y = SiLU(g) ⊙ u`` of ``gu = [g, u]`` ``(..., 2F)``; saves only ``gu``. With
    ``s = σ(g)``: ``du = dy SiLU(g)``, ``dg = dy u s (1 + g (1 - s))``."""

    @staticmethod
    def forward(ctx, gu: Tensor) -> Tensor:
        ctx.save_for_backward(gu)
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g).mul_(u)

    @staticmethod
    def backward(ctx, dy: Tensor) -> Tensor:
        (gu,) = ctx.saved_tensors
        g, u = gu.chunk(2, dim=-1)
        s = torch.sigmoid(g)  # (..., F)
        dgu = torch.empty_like(gu)
        dg, du = dgu.chunk(2, dim=-1)
        silu = torch.mul(g, s, out=du)  # SiLU(g), in du's memory
        # s (1 + g (1 - s)) = s (1 - SiLU(g)) + SiLU(g): two in-place passes over s, no
        # temporaries (seven passes in all, about 4x faster than the expanded formula)
        s.addcmul_(s, silu, value=-1).add_(silu)
        torch.mul(dy, u, out=dg).mul_(s)
        du.mul_(dy)  # dy SiLU(g)
        return dgu


def swiglu(gu: Tensor) -> Tensor:
    """``SiLU(gate) ⊙ up`` of a fused projection ``gu`` ``(..., 2F)`` (gate half first) ->
    ``(..., F)``; under autograd the hand-written backward keeps only ``gu``."""
    if not _needs_grad(gu) or torch.compiler.is_compiling():
        gate, up = gu.chunk(2, dim=-1)
        return F.silu(gate) * up
    return _SwiGLU.apply(gu)


# ---------------------------------------------------------------------------------------------
# LM head and cross-entropy, a chunk of rows at a time


def _mm(x: Tensor, w: Tensor) -> Tensor:
    """``x wᵀ``: oneDNN where :func:`linear` would use it, else ``F.linear``."""
    return _gemm(x, w) if _use_onednn(x, w) else F.linear(x, w)


class _ChunkedHeadLoss(torch.autograd.Function):
    """Summed cross-entropy of ``h Wᵀ`` against ``targets``, ``rows`` rows at a time: each
    chunk's logits ``(rows, V)`` live only while its loss and gradients are computed, so the
    ``(N, V)`` logits, their log-softmax and their gradient (three arrays of 50k columns for a
    modern vocabulary) are never held at once. The gradient of the summed loss with respect to
    a chunk's logits is ``softmax - onehot`` (zero on ignored rows); ``dh = G W`` and
    ``dW = Gᵀ h`` are computed in the forward and scaled by the incoming gradient in the
    backward."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, rows: int, ignore: int):
        want_h, want_w = h.requires_grad, weight.requires_grad
        bf16 = _bf16_grads(h)  # the gradients' products only
        grad_mm = _grad_mm(bf16)
        dh = torch.empty_like(h) if want_h else None
        dw = torch.zeros_like(weight) if want_w else None
        total = h.new_zeros((), dtype=torch.float32)
        for start in range(0, h.shape[0], rows):
            hc, tc = h[start : start + rows], targets[start : start + rows]  # (n, C), (n,)
            logits = _mm(hc, weight).float()  # (n, V)
            keep = tc != ignore
            safe = torch.where(keep, tc, 0).unsqueeze(1)  # (n, 1)
            picked = logits.gather(1, safe)
            # log-sum-exp and softmax in the logits' own memory: five passes over (n, V)
            top = logits.amax(dim=-1, keepdim=True)  # (n, 1)
            sums = logits.sub_(top).exp_().sum(dim=-1, keepdim=True)  # exp(l - top): (n, V)
            lse = top + sums.log()  # (n, 1)
            total += ((lse - picked).squeeze(1) * keep).sum()
            if not (want_h or want_w):
                continue
            g = logits.mul_(sums.reciprocal_())  # softmax
            g.scatter_add_(1, safe, -torch.ones_like(picked))
            # the check is free on the CPU; elsewhere it would wait for the device each chunk
            if h.device.type != "cpu" or not bool(keep.all()):
                g.mul_(keep.unsqueeze(1))
            g = g.to(h.dtype)
            with _products_in_bf16(bf16):
                if want_h:
                    dh[start : start + rows] = grad_mm(g, weight.t())  # (n, V) (V, C) -> (n, C)
                if want_w:
                    dw.add_(grad_mm(g.t(), hc.t()))  # (V, n) (n, C) -> (V, C)
        ctx.save_for_backward(dh, dw)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        dh, dw = ctx.saved_tensors
        return (None if dh is None else dh * grad, None if dw is None else dw * grad,
                None, None, None)  # fmt: skip


def chunked_head_loss(
    h: Tensor, weight: Tensor, targets: Tensor, rows: int = 1024, ignore_index: int = -100
) -> Tensor:
    """``F.cross_entropy(h Wᵀ, targets, reduction="sum")`` for ``h`` ``(N, C)``, ``weight``
    ``(V, C)``, ``targets`` ``(N,)`` (``ignore_index`` not counted), computed ``rows`` rows at
    a time without holding the ``(N, V)`` logits; the same gradients, for ``h`` and for
    ``weight`` where they require one."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        logits = F.linear(h, weight).float()
        return F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
    return _ChunkedHeadLoss.apply(h, weight, targets, rows, ignore_index)
