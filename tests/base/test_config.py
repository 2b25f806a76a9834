"""Preset loading and dict -> dataclass conversion."""

from dataclasses import dataclass

import pytest

from attnlm.base.config import from_dict, load_preset, parse_override
from attnlm.base.errors import ConfigError


@dataclass(frozen=True)
class Cfg:
    n: int
    lr: float = 1e-3
    name: str | None = None


def test_from_dict_accepts_ints_for_floats_and_rejects_unknown_and_bad_types():
    assert from_dict(Cfg, {"n": 2, "lr": 1}) == Cfg(n=2, lr=1.0)
    with pytest.raises(ConfigError, match=r"unknown config key model\.nn"):
        from_dict(Cfg, {"n": 2, "nn": 3}, where="model")
    with pytest.raises(ConfigError, match=r"model\.n must be int"):
        from_dict(Cfg, {"n": "two"}, where="model")
    with pytest.raises(ConfigError, match="missing"):
        from_dict(Cfg, {}, where="model")


def test_load_preset_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'no-such-preset'"):
        load_preset("no-such-preset")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_preset(bad)
    good = tmp_path / "good.toml"
    good.write_text("[model]\nn = 3\n")
    assert load_preset(good) == {"model": {"n": 3}}


def test_parse_override():
    assert parse_override("lr=3e-4") == ("lr", 3e-4)
    assert parse_override("name=abc") == ("name", "abc")
    assert parse_override("flag=true") == ("flag", True)
    with pytest.raises(ConfigError):
        parse_override("novalue")
