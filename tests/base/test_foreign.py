"""The foreign-file boundary (``attnlm.base.foreign``): parse errors become one line naming the
file, JSON nesting is bounded without recursion, reads are bounded, NaN/inf refused, and the
parameter estimate every model config checks is an upper bound of the real count for every family
and preset (so no real model is refused) and within a small factor of it (so it means something)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attnlm.base import foreign
from attnlm.base.errors import ConfigError, InputError


def test_reading_names_the_file_and_the_problem(tmp_path):
    with pytest.raises(InputError, match=r"^x\.bin: not a valid thing file \(missing 'k'\)$"):
        with foreign.reading("x.bin", "thing"):
            {}["k"]
    with pytest.raises(InputError, match="nested too deeply"):
        with foreign.reading("x.json", "JSON"):
            raise RecursionError
    # an attnlm error that does not name the file gets the path in front, same class
    with pytest.raises(ConfigError, match=r"^cfg\.json: model\.n_layer bad$"):
        with foreign.reading("cfg.json", "config"):
            raise ConfigError("model.n_layer bad")
    with pytest.raises(InputError, match=r"^a/cfg\.json: cfg\.json is bad$"):
        with foreign.reading("a/cfg.json", "config"):  # already named: unchanged
            raise InputError("a/cfg.json: cfg.json is bad")
    with pytest.raises(ZeroDivisionError):  # not a parse error: a bug stays a bug
        with foreign.reading("x", "thing"):
            1 / 0  # noqa: B018


def test_foreign_reader_registers_and_wraps():
    @foreign.foreign_reader("test format")
    def read(path):
        return json.loads("{bad")

    assert (
        f"{__name__}.test_foreign_reader_registers_and_wraps.<locals>.read"
        in (foreign.READERS["test format"])
    )
    with pytest.raises(InputError, match="^p.x: not a valid test format file"):
        read("p.x")
    foreign.READERS.pop("test format")


@pytest.mark.parametrize(
    "text, deep",
    [
        ("[" * 201 + "]" * 201, True),
        ("[" * 200 + "]" * 200, False),
        ('{"a": "' + "[" * 500 + '"}', False),  # brackets inside a string do not count
        ('["\\"' + "[" * 300 + '"]', False),  # nor after an escaped quote
        ("{" * 150 + "[" * 60, True),
    ],
)
def test_json_depth_without_recursion(text, deep):
    assert (foreign.json_depth_problem(text) is not None) == deep


def test_deep_json_file_is_one_line(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="deep.json: .*nested more than 200 levels"):
        foreign.load_json(p, expect=None)
    p.write_text("[1, 2]")
    with pytest.raises(InputError, match="expected a JSON object"):
        foreign.load_json(p)
    assert foreign.load_json(p, expect=list) == [1, 2]


def test_read_bounded(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc" * 10)
    assert foreign.read_bounded(p, 30) == b"abc" * 10
    with pytest.raises(InputError, match="longer than 29 bytes"):
        foreign.read_bounded(p, 29)
    p.write_bytes(b"ab\x00c")
    with pytest.raises(InputError, match="NUL"):
        foreign.read_bounded(p, 100)
    with pytest.raises(InputError, match="NUL"):  # one block, not the endless device
        foreign.read_bounded("/dev/zero", 1 << 40)
    assert foreign.read_bounded(p, 100, stop_at_nul=False) == b"ab\x00c"


def test_check_finite():
    foreign.check_finite({"a": torch.ones(3), "i": torch.arange(3)}, "w")
    foreign.check_finite(np.ones(3), "v")
    with pytest.raises(InputError, match=r"^w: weight 'b' holds NaN"):
        foreign.check_finite({"a": torch.ones(3), "b": torch.tensor([1.0, math.nan])}, "w")
    with pytest.raises(InputError, match=r"^v: vectors hold|^v: vectors holds"):
        foreign.check_finite(np.array([1.0, np.inf], dtype=np.float32), "v", "vector")


def test_check_fits():
    foreign.check_fits(1000, "m", available=4000)
    with pytest.raises(InputError, match=r"^m: the model would need about 3\.9 KiB"):
        foreign.check_fits(1001, "m", available=4000)


def _family_configs():
    from attnlm.base.config import load_preset
    from attnlm.models import registry

    out = []
    for family in registry.families():
        for name in registry.presets_of(family.type):
            table = dict(load_preset(name)["model"])
            table.setdefault("vocab_size", 300)
            out.append(pytest.param(table, id=f"{family.type}:{name}"))
    return out


@pytest.mark.parametrize("table", _family_configs())
def test_parameter_estimate_bounds_the_real_count(table):
    from attnlm.models import registry

    family, config = registry.make_config(table)
    estimate = foreign.config_params(config)
    if estimate * 4 > 2 << 30:  # gpt2-large/xl: do not build them here, but nothing absurd
        assert estimate < 5 * 10**9
        return
    with torch.device("meta"):
        model = family.model(config)
    real = sum(p.numel() for p in model.parameters())
    assert real <= estimate <= 8 * real + 10_000, (real, estimate)


def test_absurd_config_is_refused_before_building():
    from attnlm.models import registry

    table = {"type": "llama", "vocab_size": 100, "block_size": 8, "n_layer": 10**12,
             "n_head": 2, "n_embd": 8}  # fmt: skip
    with pytest.raises(InputError, match=r"would need about .* PiB .* memory available"):
        registry.build(table)
    with pytest.raises(InputError, match="memory available"):
        registry.build({"type": "hmm", "vocab_size": 10**9, "n_states": 4096})


def test_shapes_only_checks_against_a_fixed_budget(monkeypatch):
    """``params`` builds on the meta device: a model larger than this machine's memory is
    counted, an absurd one is still refused."""
    from attnlm.models import registry

    monkeypatch.setattr(foreign, "available_memory", lambda: 1 << 20)  # a 1 MiB machine
    table = {
        "type": "gpt",
        "vocab_size": 50257,
        "block_size": 1024,
        "n_layer": 48,
        "n_head": 25,
        "n_embd": 1600,
    }  # fmt: skip  (GPT-2 XL: 1.5 billion parameters)
    with pytest.raises(InputError, match="memory available"):
        registry.make_config(table)
    with foreign.shapes_only():
        registry.make_config(table)
        with pytest.raises(InputError, match="PiB"):
            registry.make_config({**table, "n_layer": 10**12})


@pytest.mark.parametrize("where", [None, 0, "middle", -1])
def test_check_finite_in_slices_agrees_with_isfinite(monkeypatch, where):
    """The check goes a slice at a time: a bad value in any slice (the first, a middle one,
    the last, shorter one) is found, as torch.isfinite over the whole tensor finds it."""
    monkeypatch.setattr(foreign, "FINITE_CHUNK", 64)
    t = torch.randn(7, 50)  # 350 values: slices of 64, the last one of 30
    if where is not None:
        t.view(-1)[175 if where == "middle" else where] = math.inf if where == -1 else math.nan
    for view in (t, t.t()):  # a transposed (non-contiguous) view too
        assert foreign._is_finite(view) == bool(torch.isfinite(view).all())
    if where is not None:
        with pytest.raises(InputError, match="holds NaN or infinite"):
            foreign.check_finite({"w": t.t()}, "f")
