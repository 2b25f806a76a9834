"""Token files (memmaps) and training/evaluation windows."""

import math

import numpy as np
import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.data.windows import (
    Windows,
    bits_per_char,
    read_token_file,
    token_dtype,
    write_token_file,
)


def test_dtype_follows_vocabulary_size():
    assert token_dtype(256) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32
    with pytest.raises(InputError):
        token_dtype(0)


@pytest.mark.parametrize("vocab", [100, 70000])
def test_token_file_roundtrip(tmp_path, vocab):
    ids = [0, 5, vocab - 1, 3, 2]
    tf = write_token_file(ids, tmp_path / "train.bin", vocab, n_chars=12)
    again = read_token_file(tmp_path / "train.bin")
    assert again == tf
    assert again.open().tolist() == ids
    assert isinstance(again.open(), np.memmap)
    assert (tmp_path / "train.bin").stat().st_size == len(ids) * np.dtype(tf.dtype).itemsize
    assert again.chars_per_token == pytest.approx(12 / 5)


def test_token_file_errors(tmp_path):
    with pytest.raises(InputError, match="out of range"):
        write_token_file([1, 200], tmp_path / "a.bin", 100, 2)
    write_token_file([1, 2, 3], tmp_path / "b.bin", 100, 3)
    (tmp_path / "b.bin").write_bytes(b"\x00")  # truncated
    with pytest.raises(InputError, match="wrong size"):
        read_token_file(tmp_path / "b.bin")
    with pytest.raises(InputError, match="metadata"):
        read_token_file(tmp_path / "missing.bin")


def test_random_windows_are_shifted_by_one():
    ids = np.arange(100, dtype=np.uint16)
    w = Windows(ids, block_size=8)
    x, y = w.sample(5, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 8) and x.dtype == torch.long
    assert torch.equal(y, x + 1)  # ids are consecutive numbers, so targets = inputs + 1
    assert int(x.min()) >= 0 and int(y.max()) <= 99
    # the same generator state gives the same windows
    a = w.sample(5, torch.Generator().manual_seed(1))
    b = w.sample(5, torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0])


def test_sequential_windows_predict_every_target_once():
    ids = np.arange(23, dtype=np.uint16)
    w = Windows(ids, block_size=5)
    targets = torch.cat([y.flatten() for _, y in w.sequential(batch_size=2)])
    assert targets.tolist() == list(range(1, 23))
    assert w.n_eval_batches(2) == len(list(w.sequential(2)))


def test_short_text_and_bpc():
    w = Windows(np.array([1, 2, 3], dtype=np.uint16), block_size=64)
    assert w.block_size == 2
    with pytest.raises(InputError, match="too short"):
        Windows(np.array([1], dtype=np.uint16), 8)
    assert bits_per_char(math.log(2) * 10, 10) == pytest.approx(1.0)
