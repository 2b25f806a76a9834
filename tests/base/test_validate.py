"""attnlm.base.validate: one validator per kind of value (issue 15)."""

import argparse
import math

import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.base.validate import (
    MAX_THREADS,
    above_zero,
    at_least,
    device,
    existing_dir,
    existing_file,
    existing_path,
    finite_float,
    fraction,
    non_negative,
    non_negative_int,
    one_of,
    output_file,
    positive,
    positive_int,
    probability,
    seed,
    threads,
    utf8_text,
)
from attnlm.cli.common import arg


@pytest.mark.parametrize("value,want", [("3", 3), (3, 3), (3.0, 3), ("+7", 7)])
def test_ints_convert(value, want):
    assert positive_int(value, "--n") == want


@pytest.mark.parametrize(
    "value", ["0", -1, "x", "1.5", 1.5, True, None, "nan", "1_6", " 3", "3 ", "\u0663", "0x3"]
)
def test_positive_int_rejects(value):
    with pytest.raises(ConfigError, match="^--n must be an integer >= 1") as e:
        positive_int(value, "--n")
    assert "\n" not in str(e.value)


def test_ranges():
    assert non_negative_int("0") == 0
    assert seed(2**63 - 1) == 2**63 - 1
    for bad in (-1, 2**63):
        with pytest.raises(ConfigError, match="seed must be an integer in"):
            seed(bad)
    assert threads("4") == 4
    assert threads(MAX_THREADS) == MAX_THREADS
    for bad in ("0", "-1", "5000", MAX_THREADS + 1):
        with pytest.raises(ConfigError, match="threads"):
            threads(bad)


@pytest.mark.parametrize(
    "bad", ["nan", "inf", "-inf", math.nan, math.inf, "x", "", True, "1_0.5", " 3", "\u0663"]
)
def test_finite_float_rejects_non_finite(bad):
    with pytest.raises(ConfigError, match="finite number"):
        finite_float(bad, "--t")


def test_float_bounds():
    assert finite_float("0.5", lo=0, lo_open=True) == 0.5
    with pytest.raises(ConfigError, match="> 0"):
        finite_float("0", "--t", lo=0, lo_open=True)
    assert probability("1") == 1.0
    with pytest.raises(ConfigError, match="<= 1"):
        probability(1.01, "--p")


def test_device():
    assert device("CPU") == "cpu" and device("auto") == "auto"
    for bad in ("bogus", "cpu:0", "cuda:", "cuda:-1", "gpu", 3):
        with pytest.raises(ConfigError, match="auto, cpu, cuda, cuda:N or mps"):
            device(bad, "--device")
    assert device("cuda:7", check_available=False) == "cuda:7"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ConfigError, match="not available|no such GPU"):
        device(f"cuda:{n}", "--device")
    if not torch.backends.mps.is_available():
        with pytest.raises(ConfigError, match="MPS is not available"):
            device("mps")


def test_paths(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("x")
    assert existing_file(str(f)) == f and existing_path(f) == f
    assert existing_dir(tmp_path) == tmp_path and existing_path(tmp_path) == tmp_path
    with pytest.raises(InputError, match="no such file"):
        existing_file(tmp_path / "b", "--x")
    with pytest.raises(InputError, match="not a file"):
        existing_file(tmp_path)
    with pytest.raises(InputError, match="no such folder"):
        existing_dir(f)
    with pytest.raises(InputError, match="no such file or folder"):
        existing_path(tmp_path / "none")
    assert output_file(tmp_path / "new" / "x.json") == tmp_path / "new" / "x.json"
    with pytest.raises(InputError, match="is a folder"):
        output_file(tmp_path)
    with pytest.raises(InputError, match="is not a folder"):
        output_file(f / "x.json")


def test_utf8_text():
    assert utf8_text("\ufeffcafé".encode()) == "café"
    with pytest.raises(InputError, match=r"stdin: not valid UTF-8 \(bad byte 0xe9 at offset 3\)"):
        utf8_text(b"caf\xe9", "stdin")


def test_argparse_adapter():
    p = argparse.ArgumentParser()
    p.add_argument("--t", type=arg(finite_float, lo=0, lo_open=True))
    assert p.parse_args(["--t", "0.7"]).t == 0.7
    with pytest.raises(argparse.ArgumentTypeError, match="finite number > 0"):
        arg(finite_float, lo=0, lo_open=True)("nan")


class _Config:
    def __init__(self, **fields):
        self.__dict__.update(fields)


@pytest.mark.parametrize(
    "check,value,message",
    [
        (positive, 0, "model.x must be an integer >= 1, got 0"),
        (positive, 2.0, "model.x must be an integer >= 1, got 2.0"),
        (positive, "3", "model.x must be an integer >= 1, got '3'"),
        (positive, True, "model.x must be an integer >= 1, got True"),
        (non_negative, -1, "model.x must be an integer >= 0, got -1"),
        (fraction, 1.0, "model.x must be a finite number >= 0 and < 1, got 1"),
        (fraction, "0.1", "model.x must be a finite number >= 0 and < 1, got '0.1'"),
        (fraction, math.nan, "model.x must be a finite number >= 0 and < 1, got nan"),
        (above_zero, 0.0, "model.x must be a finite number > 0, got 0"),
    ],
)
def test_config_field_checks(check, value, message):
    with pytest.raises(ConfigError) as e:
        check(_Config(x=value), "x")
    assert str(e.value) == message


def test_config_field_checks_pass_and_name_the_table():
    c = _Config(a=1, b=None, p=0.0, kind="gru")
    positive(c, "a")
    positive(c, "b", optional=True)
    fraction(c, "p")
    one_of(c, "kind", ("gru", "lstm"))
    with pytest.raises(ConfigError, match=r"^train\.b must be an integer >= 1, got None$"):
        positive(c, "b", where="train")
    with pytest.raises(ConfigError, match=r"^model\.a must be an integer >= 2, got 1$"):
        at_least(c, 2, "a")
    with pytest.raises(ConfigError, match=r"^kind must be one of lstm, rnn, got 'gru'$"):
        one_of(c, "kind", ("lstm", "rnn"), where="")
    with pytest.raises(ConfigError, match=r"^max_chars must be an integer >= 1, got 0$"):
        positive({"max_chars": 0}, "max_chars", where="")
