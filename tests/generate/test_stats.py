"""Decode statistics (:mod:`attnlm.generate.stats`): token counts equal what the decode
returned, the prefill/decode split is where the first token appears, and the rate is the
tokens after each row's first over the decode time."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from attnlm.generate import SamplingConfig, generate_text
from attnlm.generate.stats import DecodeStats, Timer, peak_rss_mb
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.tokenizers import CharTokenizer


def test_counts_match_the_decode():
    tok = CharTokenizer.train("abcdefgh ")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16)
    model = GPT(cfg).eval()
    stats = DecodeStats()
    sampling = SamplingConfig(max_new_tokens=7, temperature=0)
    texts = generate_text(model, tok, ["ab", "abc"], sampling, stats=stats)
    assert stats.rows == 2 and stats.new_tokens == 14
    assert stats.prompt_tokens == len(tok.encode("ab")) + len(tok.encode("abc"))
    assert stats.prefill_seconds > 0 and stats.decode_seconds > 0
    assert stats.decode_tokens_per_second == pytest.approx(12 / stats.decode_seconds)
    assert len(texts) == 2
    # a second decode adds to the same counters
    generate_text(model, tok, ["ab"], sampling, stats=stats)
    assert stats.rows == 3 and stats.new_tokens == 21
    doc = stats.to_json()
    assert doc["new_tokens"] == 21 and doc["peak_rss_mb"] == round(peak_rss_mb(), 1)


def test_timer_split(monkeypatch):
    clock = iter([1.0, 3.0, 10.0])
    monkeypatch.setattr("attnlm.generate.stats.time.perf_counter", lambda: next(clock))
    stats = DecodeStats()
    t = Timer(stats, prompt_tokens=5, rows=1)
    t.start()
    t.token()
    t.token()  # only the first token ends the prefill
    t.stop(8)
    assert (stats.prefill_seconds, stats.decode_seconds) == (2.0, 7.0)
    assert stats.decode_tokens_per_second == 1.0
    assert DecodeStats(new_tokens=1, rows=1, decode_seconds=1.0).decode_tokens_per_second is None


def test_peak_rss_grows():
    before = peak_rss_mb()
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB touched
    assert peak_rss_mb() >= before and peak_rss_mb() > 64
    del block


@pytest.mark.skipif(sys.platform != "linux", reason="VmHWM is Linux's")
def test_a_started_process_reports_its_own_peak_not_its_parents():
    """``ru_maxrss`` of a process started by a large one reports the parent's copy (the
    benchmark's peers started by it would all show its size); ``VmHWM`` is the child's own."""
    big = bytearray(300 * 2**20)  # touched: 300 MB resident in this process
    big[::4096] = b"x" * len(big[::4096])
    code = (
        "import resource; from attnlm.generate.stats import peak_rss_mb; "
        "print(peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ours, maxrss = map(float, out.stdout.split())
    assert ours < 150 < 300 < maxrss  # the child's own few tens of MB; ru_maxrss: the parent's
    del big
