"""One decode step for several sequences at different positions, each with its own KV cache:
the server's batched step (:mod:`attnlm.api.scheduler`).

Every matrix product of the step (q/k/v, the output projection, the feed-forward, the LM head)
takes the ``N`` active rows at once, so the weights stream from memory once per step for all
the clients; what differs per row (the position's rotation, the row's own cache, its window
band, attention over what it holds) is done row by row, which is small next to the products.
The arithmetic is :func:`attnlm.runtime.eager.flat_step`'s, its helpers reused; a model the
flat step does not compute (:func:`~attnlm.runtime.eager.flat_model` False: ALiBi, recurrent
families) is stepped one row at a time through its runner instead (the same tokens, no
sharing of the weight pass).

Shape legend
    N  active rows     C  model width     H / Hkv  query / key-value heads
    D  head width      V  vocabulary
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnlm.base.device import model_device
from attnlm.nn.blocks import ACTIVATIONS, SwiGLU
from attnlm.nn.cache import KVCache
from attnlm.nn.masks import window_mask
from attnlm.runtime.eager import _linear, _norm, _turn, flat_model

__all__ = ["batched_applies", "batched_step"]


def batched_applies(model: nn.Module) -> bool:
    """Whether :func:`batched_step` shares one weight pass between the rows for ``model``."""
    return flat_model(model)


def _rows_turn(rotary: nn.Module | None, positions: Sequence[int], device, dtype):
    """Each row's rotation ``(cos, ±sin)`` as ``(N, 1, 2, D/2)`` tensors, or None."""
    if rotary is None:
        return None
    cs, ss = [], []
    for p in positions:
        c, s = _turn(rotary, torch.tensor([p], device=device), dtype)
        cs.append(c)
        ss.append(s)
    return torch.stack(cs)[:, None], torch.stack(ss)[:, None]


@torch.inference_mode()
def batched_step(
    model: nn.Module, runner, tokens: Sequence[int], states: Sequence[KVCache]
) -> Tensor:
    """Logits ``(N, V)`` of one new token per row (``tokens[i]`` after what ``states[i]``
    holds); every state takes its row's keys and values and moves on one position."""
    if not flat_model(model) or not all(type(s) is KVCache for s in states):
        device = model_device(model)
        return torch.cat(
            [
                runner.last_logits(torch.tensor([[t]], device=device), s)
                for t, s in zip(tokens, states)
            ]  # fmt: skip
        )
    device = model_device(model)
    N = len(tokens)
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    positions = [s.position for s in states]
    x = model.tok_emb(ids)  # (N, C)
    if getattr(model, "embed_scale", None) is not None:
        x = x * model.embed_scale
    if model.pos_emb is not None:
        x = x + model.pos_emb(torch.tensor(positions, device=device)).to(x.dtype)
    turn = _rows_turn(model.rotary, positions, device, x.dtype)
    local = getattr(model, "rotary_local", None)
    turn_local = turn if local is None else _rows_turn(local, positions, device, x.dtype)
    bands: dict[tuple[int, int], Tensor] = {}  # (row, window) -> (1, S)
    for r, s in enumerate(states):
        for block in model.blocks:
            w = getattr(block.attn, "window", None)
            if w is not None and (r, w) not in bands:
                pos = torch.tensor([s.position], device=device)
                bands[(r, w)] = window_mask(pos, s.key_positions(1, device), w, x.dtype)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        H, Hkv, D = attn.n_head, attn.n_kv_head, attn.d_head
        window = getattr(attn, "window", None)
        qkv = _linear(attn.qkv_proj)(_norm(block.ln_1)(x))  # (N, (H + 2 Hkv) D)
        qk = qkv[:, : (H + Hkv) * D].view(N, H + Hkv, D)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        if q_norm is not None or k_norm is not None:
            q, k = qk[:, :H], qk[:, H:]
            qk = torch.cat(
                [q if q_norm is None else q_norm(q), k if k_norm is None else k_norm(k)], 1
            )
        qk = qk.reshape(N, H + Hkv, 2, D // 2)
        t = turn if window is None else turn_local
        if t is not None:
            qk = torch.addcmul(qk * t[0], qk.flip(2), t[1])
        qk = qk.reshape(N, H + Hkv, 1, D)
        v = qkv[:, (H + Hkv) * D :].reshape(N, Hkv, 1, D)
        ys = []
        for r, s in enumerate(states):
            k_all, v_all = s.append(layer, qk[r : r + 1, H:], v[r : r + 1])
            mask = None if window is None else bands[(r, window)]
            y, _ = attn._mix(qk[r : r + 1, :H], k_all, v_all, mask, False, False)
            ys.append(y.reshape(1, H * D))
        y = torch.cat(ys)  # (N, H D)
        post = getattr(block, "ln_post_attn", None)
        if post is None:
            x = _linear(attn.out_proj)(y, x)
        else:
            x = x + _norm(post)(_linear(attn.out_proj)(y))
        h = _norm(block.ln_2)(x)
        mlp = block.mlp
        if isinstance(mlp, SwiGLU):
            gate, up = _linear(mlp.fc)(h).chunk(2, dim=-1)
            h = ACTIVATIONS[mlp.gated_act](gate) * up
        else:
            h = mlp.act(_linear(mlp.fc)(h))
        if post is None:
            x = _linear(mlp.proj)(h, x)
        else:
            x = x + _norm(block.ln_post_mlp)(_linear(mlp.proj)(h))
    for s in states:
        s.advance(1)
    logits = _linear(model.lm_head)(_norm(model.ln_f)(x))  # (N, V)
    cap = getattr(model, "final_softcap", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits
