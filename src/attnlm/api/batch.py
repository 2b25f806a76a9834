"""One decode step for several sequences at different positions, each with its own KV cache:
the server's batched step on PyTorch (:class:`attnlm.api.steppers.TorchStepper`; a GGUF file
the C engine runs is stepped by the engine instead).

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
from attnlm.nn.cache import KVCache
from attnlm.nn.masks import window_mask
from attnlm.runtime.eager import (
    _turn,
    flat_block_rest,
    flat_embed,
    flat_head,
    flat_model,
    flat_qkv,
    flat_turns,
)

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
    device = model_device(model)
    if not flat_model(model) or not all(type(s) is KVCache for s in states):
        rows = [runner.last_logits(torch.tensor([[t]], device=device), s)
                for t, s in zip(tokens, states)]  # fmt: skip
        return torch.cat(rows)
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    positions = [s.position for s in states]
    x = flat_embed(model, ids, torch.tensor(positions, device=device))  # (N, C)
    turns = flat_turns(model, lambda rotary: _rows_turn(rotary, positions, device, x.dtype))
    bands = _row_bands(model, states, device, x.dtype)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        H, window = attn.n_head, getattr(attn, "window", None)
        qk, v = flat_qkv(block, x, turns)  # (N, H + Hkv, 1, D), (N, Hkv, 1, D)
        ys = []
        for r, s in enumerate(states):  # each row attends over its own cache
            k_all, v_all = s.append(layer, qk[r : r + 1, H:], v[r : r + 1])
            mask = None if window is None else bands[(r, window)]
            y, _ = attn._mix(qk[r : r + 1, :H], k_all, v_all, mask, False, False)
            ys.append(y.reshape(1, -1))
        x = flat_block_rest(block, x, torch.cat(ys))  # heads' outputs (N, H D)
    for s in states:
        s.advance(1)
    return flat_head(model, x)  # (N, V)


def _row_bands(model: nn.Module, states: Sequence[KVCache], device, dtype
               ) -> dict[tuple[int, int], Tensor]:  # fmt: skip
    """``(row, window) -> (1, S)``: the keys each row's sliding layers may see (before any
    layer appends this step's key)."""
    bands: dict[tuple[int, int], Tensor] = {}
    for r, s in enumerate(states):
        for block in model.blocks:
            w = getattr(block.attn, "window", None)
            if w is not None and (r, w) not in bands:
                pos = torch.tensor([s.position], device=device)
                bands[(r, w)] = window_mask(pos, s.key_positions(1, device), w, dtype)
    return bands
