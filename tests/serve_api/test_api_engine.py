"""The API on the C engine: a GGUF file the engine runs (the committed fixtures of
``tests/fixtures/gguf_arch``) is served on the engine's cache slots
(:class:`~attnlm.api.steppers.EngineStepper`), through the ``openai`` client on loopback.

The reference is the engine's own single-sequence decode (:meth:`Engine.feed`, one token a
step after the whole prompt; tested against llama.cpp in tests/runtime/test_engine_archs.py),
on a second engine over the same file: greedy replies served alone, served to several
concurrent streaming clients (four slots, prompts read in chunks of 5 between the decode
steps), and a prompt whose start a slot still holds (prompt caching) all equal it; a reply's
``logprobs`` and ``echo``'s are the log-softmax of its logits; ``n = 2`` greedy choices (two
slots) are both the reference."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openai")
from api_server_support import client, reuse_seen, serving  # noqa: E402

from attnlm import native  # noqa: E402
from attnlm.api.steppers import engine_rows  # noqa: E402
from attnlm.base.ggufio import GGUFFile  # noqa: E402
from attnlm.runtime.engine import Engine  # noqa: E402
from attnlm.runtime.engine_gguf import open_engine  # noqa: E402

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch"
DOC = json.loads((HERE / "llamacpp.json").read_text(encoding="utf-8"))
pytestmark = [
    pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)"),
    pytest.mark.skipif(not engine_rows(Engine), reason="the engine has no rows API"),
]
NEW = 24


def reference(path: Path, prompt: list[int], n: int, stops, limit) -> list[int]:
    """Greedy ids after ``prompt`` on a fresh engine, one sequence, up to ``n`` or a stop id."""
    engine = open_engine(GGUFFile(path), None, 2)
    engine.reset(1)
    for at in range(0, len(prompt), 32):  # at most 64 ids a feed
        last = engine.feed(np.asarray([prompt[at : at + 32]]), last_only=True)[0, -1]
    ids: list[int] = []
    while len(ids) < n:
        if limit is not None:
            last = last.copy()
            last[limit:] = -np.inf
        tok = int(last.argmax())
        if tok in stops:
            break
        ids.append(tok)
        last = engine.feed(np.asarray([[tok]]), last_only=True)[0, -1]
    return ids


def prompts(arch: str) -> list[list[int]]:
    """Six prompts of 3 to 12 ids: the fixture's prompt, cut and rotated."""
    p = DOC["archs"][arch]["Q8_0"]["prompt"]
    return [p, p[:7], p[3:], p[5:] + p[:5], p[:3], p[2:9]]


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma2"])
def engine_server(request):
    arch = request.param
    path = HERE / f"{arch}-Q8_0.gguf"
    with serving(path, parallel=4, prefill_chunk=5, threads=2) as (served, url):
        assert served.backend == "c-engine"  # chosen as chat/generate choose it
        refs = [reference(path, p, NEW, served.stop_ids, served.context.vocab_limit)
                for p in prompts(arch)]  # fmt: skip
        yield arch, served, client(url), refs


def text(served, prompt, ids) -> str:
    """The reply's text as the server writes it: what ``ids`` add to the prompt's text."""
    whole, head = served.decode(prompt + ids), served.decode(prompt)
    assert whole.startswith(head)
    return whole[len(head) :]


def test_a_reply_alone_equals_the_engine_decode(engine_server):
    arch, served, c, refs = engine_server
    for p, ref in zip(prompts(arch), refs):
        r = c.completions.create(model=served.id, prompt=p, max_tokens=NEW, temperature=0)
        assert r.choices[0].text == text(served, p, ref)
        assert r.usage.completion_tokens == len(ref) and r.usage.prompt_tokens == len(p)


def test_concurrent_streams_equal_the_engine_decode(engine_server):
    arch, served, c, refs = engine_server
    ps = prompts(arch)
    got: list = [None] * len(ps)
    errors: list = []
    before = served.scheduler.max_rows

    def one(i: int) -> None:
        try:
            stream = c.completions.create(model=served.id, prompt=ps[i], max_tokens=NEW,
                                          temperature=0, stream=True)  # fmt: skip
            got[i] = "".join(ch.choices[0].text for ch in stream if ch.choices)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert got == [text(served, p, r) for p, r in zip(ps, refs)]
    assert served.scheduler.max_rows > 1 or before > 1  # steps were shared


def test_a_held_prefix_is_not_read_again(engine_server):
    arch, served, c, refs = engine_server
    p = prompts(arch)[0]
    c.completions.create(model=served.id, prompt=p, max_tokens=NEW, temperature=0)
    longer = p + refs[0][:4] + p[:3]  # the reply's start, then new ids
    with reuse_seen(served.scheduler) as seen:
        r = c.completions.create(model=served.id, prompt=longer, max_tokens=NEW, temperature=0)
    assert seen and seen[0] >= len(p) + 4
    assert r.usage.prompt_tokens_details.cached_tokens == seen[0]
    ref = reference(served.info.path, longer, NEW, served.stop_ids, served.context.vocab_limit)
    assert r.choices[0].text == text(served, longer, ref)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_reply_logprobs_are_the_engine_logits(engine_server):
    arch, served, c, refs = engine_server
    p, ref = prompts(arch)[2], refs[2][:8]
    r = c.completions.create(model=served.id, prompt=p, max_tokens=len(ref), temperature=0,
                             logprobs=2, n=2)  # fmt: skip
    engine = open_engine(GGUFFile(served.info.path), None, 2)
    engine.reset(1)
    rows = [engine.feed(np.asarray([p]), last_only=True)[0, -1]]
    rows += [engine.feed(np.asarray([[t]]), last_only=True)[0, -1] for t in ref[:-1]]
    lp = log_softmax(np.stack(rows))  # (T, V)
    want = [lp[i, t] for i, t in enumerate(ref)]
    for choice in r.choices:  # two slots, the same greedy reply
        assert choice.text == text(served, p, ref)
        np.testing.assert_allclose(choice.logprobs.token_logprobs, want, rtol=1e-4, atol=1e-4)
        best = [max(d.values()) for d in choice.logprobs.top_logprobs]
        np.testing.assert_allclose(best, lp.max(axis=-1), rtol=1e-4, atol=1e-4)


def test_echo_logprobs_are_the_engine_logits(engine_server, monkeypatch):
    from attnlm.api import steppers

    monkeypatch.setattr(steppers, "ECHO_ROWS", 3)  # the prompt read in three calls
    arch, served, c, _ = engine_server
    p = prompts(arch)[1]
    r = c.completions.create(model=served.id, prompt=p, max_tokens=1, temperature=0, echo=True,
                             logprobs=2)  # fmt: skip
    lps = r.choices[0].logprobs.token_logprobs[: len(p)]
    engine = open_engine(GGUFFile(served.info.path), None, 2)
    engine.reset(1)
    ref = log_softmax(engine.feed(np.asarray([p]))[0])  # (T, V)
    assert lps[0] is None
    want = [ref[t - 1, p[t]] for t in range(1, len(p))]
    np.testing.assert_allclose(lps[1:], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "phi3"])
def test_the_default_slots_count_the_engine_parameters(arch):
    from attnlm.api.served import parameter_count
    from attnlm.models.gguf import load

    path = HERE / f"{arch}-Q8_0.gguf"
    model, _ = load(path)
    want = sum(p.numel() for p in model.parameters() if p.dim() > 1)  # norms left out
    assert parameter_count(open_engine(GGUFFile(path), None, 1)) == want


def test_slot_context_bounds_prompt_and_reply():
    import openai

    from attnlm.api.served import Limits

    path = HERE / "llama-Q8_0.gguf"
    with serving(path, parallel=2, threads=1, limits=Limits(slot_context=16)) as (served, url):
        assert served.window == 16 and served.scheduler.stepper.max_len == 16
        c = client(url)
        with pytest.raises(openai.BadRequestError, match="at most 15"):
            c.completions.create(model=served.id, prompt=list(range(5, 25)), max_tokens=1)
        never_end = {str(i): -100 for i in served.stop_ids}
        r = c.completions.create(model=served.id, prompt=list(range(5, 15)), max_tokens=100,
                                 temperature=0, logit_bias=never_end)  # fmt: skip
        assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"


def test_prompt_pieces_ride_in_the_decode_pass_and_long_ones_alone():
    """Requests held back until all wait, then admitted at once: four short prompts are read
    in one engine call (several rows of each slot); with two long ones (96 ids each, more than
    MIX_AVERAGE a slot) each prompt is read in a pass of its own. Every reply = the reference."""
    from attnlm.api.scheduler import MIX_AVERAGE

    path = HERE / "llama-Q8_0.gguf"
    p = DOC["archs"]["llama"]["Q8_0"]["prompt"]
    with serving(path, parallel=4, prefill_chunk=256, threads=1) as (served, url):
        sch, c = served.scheduler, client(url)
        engine, calls, prefills, wants = served.model, [], [], []
        step_rows, prefill = engine.step_rows, engine.prefill

        def spy_rows(tokens, positions, slots, want=None, ends=None):
            calls.append(list(slots))
            wants.append(None if want is None else list(want))
            return step_rows(tokens, positions, slots, want=want, ends=ends)

        def spy_prefill(slot, position, tokens, reach=None):
            prefills.append(len(tokens))
            return prefill(slot, position, tokens, reach)

        engine.step_rows, engine.prefill = spy_rows, spy_prefill

        def together(asks):
            gate, got = threading.Event(), [None] * len(asks)
            sch.call(gate.wait)  # the scheduler waits here until every request is queued

            def one(i):
                r = c.completions.create(model=served.id, prompt=asks[i], max_tokens=12,
                                         temperature=0)  # fmt: skip
                got[i] = r.choices[0].text

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
            for t in threads:
                t.start()
            while len(sch.waiting) < len(asks):
                time.sleep(0.01)
            gate.set()
            for t in threads:
                t.join(300)
            refs = [reference(path, a, 12, served.stop_ids, None) for a in asks]
            assert got == [text(served, a, r) for a, r in zip(asks, refs)]

        together([p, p[:7], p[3:], p[2:9]])
        first = next(k for k in calls if len(k) > 4)
        assert len(set(first)) == 4 and len(first) == 12 + 7 + 9 + 7  # all four pieces at once
        # the LM head only on each piece's last row (the prompts' next tokens)
        lasts = sorted({s: i for i, s in enumerate(first)}.values())
        assert sorted(wants[calls.index(first)]) == lasts
        assert not prefills
        together([p * 8, p[::-1] * 8, p[:5]])
        # the long ones alone, each whole (past what a slot may hold of p from before)
        assert len(prefills) == 2 and min(prefills) > MIX_AVERAGE
