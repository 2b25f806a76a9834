"""The decoding-state protocol: every state (no cache, the dynamic KV cache, the static one in
prefix and fixed mode) answers ``positions(T)`` and ``mask(T)``, checked against positions
counted by hand and the causal mask."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.nn.cache import KVCache, NoCache
from attnlm.nn.masks import causal_mask
from attnlm.nn.static_cache import StaticKVCache


def _fill(state, n: int) -> None:
    k = torch.randn(2, 1, n, 4)
    state.append(0, k, k)
    state.advance(n)


def test_a_fresh_state_of_every_kind_starts_at_zero_with_the_causal_rule():
    for state in (NoCache(), KVCache(1), StaticKVCache(1, 8)):
        assert state.length == 0 and not state.fixed
        assert state.positions(3, torch.device("cpu")).tolist() == [0, 1, 2]
        assert state.mask(3, torch.float32) is None  # attention applies the causal rule


def test_positions_continue_after_the_held_tokens_and_after_a_trim():
    for state in (KVCache(1), StaticKVCache(1, 8)):
        _fill(state, 3)
        assert state.positions(2, torch.device("cpu")).tolist() == [3, 4]
        state.trim(1)  # a sliding window: one token held, positions keep counting
        assert state.length == 1
        assert state.positions(2, torch.device("cpu")).tolist() == [3, 4]


def test_left_padded_rows_count_their_real_tokens_only():
    keep = torch.tensor([[False, False, True, True], [True, True, True, True]])
    got = NoCache().positions(4, torch.device("cpu"), keep)
    assert got.tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]  # padding clamped to 0, never read
    cache = KVCache(1)
    _fill(cache, 3)  # keep covers the 3 held tokens and the new one
    assert cache.positions(1, torch.device("cpu"), keep).tolist() == [[1], [3]]


def test_fixed_mode_positions_and_mask_over_the_whole_buffer():
    state = StaticKVCache(1, 8)
    _fill(state, 3)
    state.fix()
    positions = state.positions(2, torch.device("cpu"))
    assert positions.tolist() == [3, 4]
    mask = state.mask(2, torch.float32)  # (T, max_len)
    # the causal mask of 2 queries after 3 held tokens, the 3 slots not written yet hidden
    expected = torch.cat([causal_mask(2, 5), torch.full((2, 3), float("-inf"))], dim=1)
    assert torch.equal(mask, expected)
    with pytest.raises(InputError, match="attention_mask"):
        state.positions(1, torch.device("cpu"), torch.ones(2, 4, dtype=torch.bool))
    state.unfix()
    assert state.mask(1, torch.float32) is None
