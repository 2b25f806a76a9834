"""Issue 15 items the model-family refactor fixed, checked against the issue's wording:
bounded decode buffers, the max_new_tokens cap, leftover checkpoint temp folders, device
strings, and a tokenizer that does not fit its model."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.device import resolve_device
from attnlm.base.errors import AttnlmError, ConfigError, InputError
from attnlm.generate import decode
from attnlm.generate.sampling import MAX_NEW_TOKENS_LIMIT, SamplingConfig
from attnlm.loading.checkpoint import check_vocab, load_checkpoint, save_checkpoint
from attnlm.models import registry
from attnlm.tokenizers import CharTokenizer


def _tiny(vocab: int = 12):
    torch.manual_seed(0)
    table = {"type": "gpt", "vocab_size": vocab, "block_size": 16, "n_layer": 1}
    return registry.build({**table, "n_head": 1, "n_embd": 8})


def test_huge_max_new_tokens_allocates_in_chunks(monkeypatch):
    model, _, _ = _tiny()
    sizes = []
    real = torch.zeros

    def zeros(*shape, **kw):
        t = real(*shape, **kw)
        sizes.append(t.numel())
        return t

    monkeypatch.setattr(torch, "zeros", zeros)
    got = decode(
        model,
        [[1, 2], [3]],
        sampling=SamplingConfig(max_new_tokens=MAX_NEW_TOKENS_LIMIT, temperature=0),
        on_token=lambda r, t: True,  # every row ends after its first token
    )
    assert [len(g) for g in got] == [1, 1]
    assert max(sizes) < 10_000, f"allocated {max(sizes):,} elements up front"


@pytest.mark.parametrize("n", [MAX_NEW_TOKENS_LIMIT + 1, 10**9, 10**12, -1, 1.5, True])
def test_max_new_tokens_cap_is_a_one_line_config_error(n):
    with pytest.raises(ConfigError) as e:
        SamplingConfig(max_new_tokens=n)
    assert "\n" not in str(e.value) and "max_new_tokens" in str(e.value)


def test_leftover_checkpoint_temp_folders_are_removed(tmp_path):
    model, cfg, family = _tiny()
    tok = CharTokenizer.train("abcdefghijk")
    config = {"step": 1, "model": registry.config_table(family, cfg), "train": {}}
    for name in (".checkpoint.tmp-123", ".checkpoint.tmp-99999"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_bytes(b"half written")
    save_checkpoint(tmp_path / "checkpoint", model, config, tok, {"step": torch.tensor(1)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert load_checkpoint(tmp_path).step == 1


@pytest.mark.parametrize("spec", ["bogus", "cuda:x", "gpu", "cpu:0", "", "cuda:-1"])
def test_bad_device_strings(spec):
    with pytest.raises(ConfigError) as e:
        resolve_device(spec)
    assert "\n" not in str(e.value)


def test_tokenizer_bigger_than_model_is_refused(tmp_path):
    model, cfg, family = _tiny(vocab=5)
    tok = CharTokenizer.train("abcdefgh")  # 8 ids for a 5-id model
    with pytest.raises(InputError, match="8 ids but the model only 5"):
        check_vocab(tok, cfg, "x")
    config = {"step": 0, "model": registry.config_table(family, cfg), "train": {}}
    save_checkpoint(tmp_path / "checkpoint", model, config, tok, {})
    with pytest.raises(AttnlmError, match="do not belong together"):
        load_checkpoint(tmp_path)


def test_crafted_state_pt_is_a_short_plain_line(tmp_path):
    from fractions import Fraction

    from attnlm.loading.checkpoint import load_state

    torch.save({"step": Fraction(1, 3)}, tmp_path / "state.pt")
    with pytest.raises(InputError) as e:
        load_state(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "\x1b" not in msg and len(msg) < 300, msg
    assert "fractions.Fraction" in msg and "refused" in msg
    (tmp_path / "state.pt").write_bytes(b"PK\x03\x04 not a zip" * 100)
    with pytest.raises(InputError) as e:
        load_state(tmp_path)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300
