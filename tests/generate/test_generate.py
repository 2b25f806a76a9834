"""Generation: logits filters, KV cache vs recompute, sliding window, batching, stop strings."""

import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.generate import SamplingConfig, apply_filters, decode, generate, generate_text
from attnlm.generate.filters import FILTERS, temperature, top_k, top_p
from attnlm.generate.options import DecodeOptions
from attnlm.models.gpt import GPT, GPTConfig


def tiny_gpt(positions="rope", n_layer=2, block=16, vocab=40, seed=0, sharpen=25.0):
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=vocab,
        block_size=block,
        n_layer=n_layer,
        n_head=2,
        n_embd=32,
        positions=positions,
    )
    model = GPT(cfg)
    # Sharpen the output so greedy/sampled tokens depend strongly on the context.
    with torch.no_grad():
        model.tok_emb.weight.mul_(sharpen)
    return model.eval()


class CharTok:
    """A minimal tokenizer stand-in: one id per character of a fixed alphabet."""

    def __init__(self, alphabet: str):
        self.chars = alphabet
        self.index = {c: i for i, c in enumerate(alphabet)}
        self.vocab_size = len(alphabet)

    def encode(self, text):
        return [self.index[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


# -- filters ---------------------------------------------------------------------------------


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = top_k(logits, 2)
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]
    assert out[0, 1] == 5.0 and out[0, 3] == 4.0


def test_top_p_hand_checked_nucleus():
    probs = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]])
    logits = probs.log()
    # cumulative mass 0.5, 0.7, 0.85, ...: p=0.7 keeps the first two, p=0.71 the first three
    assert torch.isfinite(top_p(logits, 0.7)).tolist() == [[True, True, False, False, False]]
    assert torch.isfinite(top_p(logits, 0.71)).tolist() == [[True, True, True, False, False]]
    # the most likely token always survives; p=1 keeps everything
    assert torch.isfinite(top_p(logits, 0.01)).sum() == 1
    assert torch.isfinite(top_p(logits, 1.0)).all()
    # order of the vocabulary does not matter
    perm = torch.tensor([3, 0, 4, 1, 2])
    assert torch.equal(top_p(logits[:, perm], 0.7), top_p(logits, 0.7)[:, perm])


def test_filters_are_pure_and_compose():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    before = logits.clone()
    out = apply_filters(logits, [("temperature", 2.0), ("top_k", 3), ("top_p", 0.6)])
    assert torch.equal(logits, before)
    expected = top_p(top_k(temperature(logits, 2.0), 3), 0.6)
    assert torch.equal(out, expected)
    assert set(FILTERS) >= {"temperature", "top_k", "top_p"}
    with pytest.raises(ConfigError, match="unknown logits filter"):
        apply_filters(logits, [("nope", 1)])
    with pytest.raises(ConfigError):
        top_p(logits, 0.0)
    with pytest.raises(ConfigError):
        top_k(logits, 0)


def test_temperature_gives_softmax_of_logits_over_t_even_when_t_is_tiny():
    """softmax(temperature(l, t)) is softmax(l / t) written out by hand; a denormal ``t``
    (``1e-320``: ``l / t`` overflows to ``inf`` and softmax to NaN) is greedy's one-hot, and
    sampling with it draws the argmax instead of raising on NaN probabilities."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.5, 3.0, float("-inf"), 1.0]])
    for t in (0.5, 1.0, 3.0):
        by_hand = torch.exp(logits / t) / torch.exp(logits / t).sum(-1, keepdim=True)
        torch.testing.assert_close(torch.softmax(temperature(logits, t), -1), by_hand)
    probs = torch.softmax(temperature(logits, 1e-320), -1)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 4).float())
    tok = CharTok("abcdefghijklmnopqrstuvwxyz .\n")
    model = tiny_gpt("rope", vocab=tok.vocab_size)
    cfg = SamplingConfig(max_new_tokens=5, temperature=1e-320, seed=1)
    greedy = SamplingConfig(max_new_tokens=5, temperature=0)
    assert generate_text(model, tok, ["ab"], cfg) == generate_text(model, tok, ["ab"], greedy)


def test_top_k_sampling_only_draws_allowed_tokens():
    model = tiny_gpt()
    gen = torch.Generator().manual_seed(0)
    ids = torch.tensor([[1, 2, 3]])
    for _ in range(5):
        with torch.no_grad():
            logits = model(ids).logits[:, -1]
        allowed = set(torch.topk(logits, 3).indices[0].tolist())
        nxt = generate(
            model, ids, SamplingConfig(temperature=1.5, top_k=3, max_new_tokens=1), generator=gen
        )[0, -1].item()
        assert nxt in allowed
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)


# -- KV cache vs full recomputation ----------------------------------------------------------


def reference_greedy(model, ids, n):
    """Plain loop: recompute the whole (cropped) context every step, take the argmax."""
    block = model.config.block_size
    with torch.no_grad():
        for _ in range(n):
            logits = model(ids[:, -block:]).logits[:, -1]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi", "sinusoidal", "none"])
def test_cache_equals_recompute_within_window(positions):
    model = tiny_gpt(positions)
    ids = torch.randint(40, (3, 4), generator=torch.Generator().manual_seed(1))
    cached = generate(
        model, ids, SamplingConfig(temperature=0, max_new_tokens=12), DecodeOptions(use_cache=True)
    )
    full = generate(
        model, ids, SamplingConfig(temperature=0, max_new_tokens=12), DecodeOptions(use_cache=False)
    )
    assert torch.equal(cached, full)
    assert torch.equal(full, reference_greedy(model, ids, 12))
    # seeded sampling also agrees token for token
    s1 = generate(
        model,
        ids,
        SamplingConfig(temperature=0.9, top_p=0.9, max_new_tokens=12),
        generator=torch.Generator().manual_seed(3),
    )
    s2 = generate(
        model,
        ids,
        SamplingConfig(temperature=0.9, top_p=0.9, max_new_tokens=12),
        DecodeOptions(use_cache=False),
        generator=torch.Generator().manual_seed(3),
    )
    assert torch.equal(s1, s2)


def test_learned_positions_crop_beyond_the_window():
    model = tiny_gpt("learned", block=8)
    ids = torch.randint(40, (2, 5), generator=torch.Generator().manual_seed(2))
    cached = generate(
        model, ids, SamplingConfig(temperature=0, max_new_tokens=20), DecodeOptions(use_cache=True)
    )  # 25 > block 8
    assert cached.shape == (2, 25)
    assert torch.equal(cached, reference_greedy(model, ids, 20))
    assert torch.equal(
        cached,
        generate(
            model,
            ids,
            SamplingConfig(temperature=0, max_new_tokens=20),
            DecodeOptions(use_cache=False),
        ),
    )


def test_rope_sliding_window_equals_recompute_on_the_last_window():
    # One layer: a trimmed cache of RoPE keys is exactly the cropped window's keys.
    model = tiny_gpt("rope", n_layer=1, block=8)
    ids = torch.randint(40, (2, 6), generator=torch.Generator().manual_seed(4))
    cached = generate(
        model, ids, SamplingConfig(temperature=0, max_new_tokens=24), DecodeOptions(use_cache=True)
    )
    assert torch.equal(cached, reference_greedy(model, ids, 24))


def test_long_prompt_is_cropped_to_the_window():
    model = tiny_gpt("rope", n_layer=1, block=8)
    ids = torch.randint(40, (1, 20), generator=torch.Generator().manual_seed(5))
    out = generate(model, ids, SamplingConfig(temperature=0, max_new_tokens=5))
    assert torch.equal(out, reference_greedy(model, ids, 5))


def test_batched_prompts_of_different_lengths_match_one_at_a_time():
    model = tiny_gpt("rope")
    prompts = [[1, 2, 3, 4, 5, 6], [7], [8, 9, 10]]
    batched = decode(model, prompts, SamplingConfig(temperature=0, max_new_tokens=9))
    alone = [
        decode(model, [p], SamplingConfig(temperature=0, max_new_tokens=9))[0] for p in prompts
    ]
    assert batched == alone
    assert [len(r) for r in batched] == [9, 9, 9]


def test_generate_api_greedy_and_training_mode_restored():
    model = tiny_gpt("learned").train()
    out = generate(model, torch.tensor([[1, 2]]), SamplingConfig(temperature=0.0, max_new_tokens=3))
    assert out.shape == (1, 5) and out.dtype == torch.long
    assert model.training
    assert torch.equal(
        generate(model, torch.tensor([[1, 2]]), SamplingConfig(max_new_tokens=0)),
        torch.tensor([[1, 2]]),
    )
    with pytest.raises(InputError):
        decode(model, [[]], SamplingConfig(max_new_tokens=3))


# -- text level: stop strings, streaming, bad prompts ----------------------------------------


def test_stop_strings_and_streaming():
    tok = CharTok("abcdefghijklmnopqrstuvwxyz .\n")
    model = tiny_gpt("rope", vocab=tok.vocab_size)
    full = generate_text(model, tok, ["ab"], SamplingConfig(temperature=0, max_new_tokens=30))[0]
    assert len(full) == 30
    stop = full[10:12]
    cut = full.find(stop)
    pieces: list[str] = []
    text = generate_text(
        model,
        tok,
        ["ab"],
        SamplingConfig(temperature=0, max_new_tokens=30, stop=[stop]),
        on_text=lambda r, p: pieces.append(p),
    )[0]
    assert text == full[:cut]
    assert "".join(pieces) == text  # the stop string itself is never printed
    # streaming without stop strings prints everything, piece by piece
    pieces.clear()
    generate_text(
        model,
        tok,
        ["ab"],
        SamplingConfig(temperature=0, max_new_tokens=30),
        on_text=lambda r, p: pieces.append(p),
    )
    assert "".join(pieces) == full and len(pieces) > 1


def test_seeded_sampling_is_reproducible():
    tok = CharTok("abcdefghijklmnopqrstuvwxyz .\n")
    model = tiny_gpt("rope", vocab=tok.vocab_size, sharpen=1.0)
    a = generate_text(
        model, tok, ["ab", "c"], SamplingConfig(temperature=1.0, top_k=5, max_new_tokens=20, seed=7)
    )
    b = generate_text(
        model, tok, ["ab", "c"], SamplingConfig(temperature=1.0, top_k=5, max_new_tokens=20, seed=7)
    )
    c = generate_text(
        model, tok, ["ab", "c"], SamplingConfig(temperature=1.0, top_k=5, max_new_tokens=20, seed=8)
    )
    assert a == b and a != c


def test_prompt_with_unknown_characters_is_a_clear_error():
    tok = CharTok("abc")
    model = tiny_gpt("rope", vocab=3)
    with pytest.raises(InputError, match="cannot encode"):
        generate_text(model, tok, ["abé"], SamplingConfig(max_new_tokens=5))
    with pytest.raises(InputError, match="empty"):
        generate_text(model, tok, [""], SamplingConfig(max_new_tokens=5))


def test_bad_sampling_values():
    model = tiny_gpt()
    with pytest.raises(ConfigError):
        generate(model, torch.tensor([[1]]), SamplingConfig(temperature=-1.0, max_new_tokens=2))
    with pytest.raises(ConfigError):
        generate(model, torch.tensor([[1]]), SamplingConfig(top_p=1.5, max_new_tokens=2))


# -- lookahead drafts (prompt-lookup decoding) -------------------------------------------------


def test_lookup_draft():
    from attnlm.generate.lookahead import lookup_draft

    assert lookup_draft([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert lookup_draft([1, 2, 3, 1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]  # longest n-gram, latest
    assert lookup_draft([4, 4, 4, 4, 4, 4], 3) == [4, 4]  # the occurrence followed by the most
    assert lookup_draft([1, 2, 3, 4], 3) == []
    assert lookup_draft([1, 2, 1, 2], 0) == []


def test_drop_newest_undoes_cache_entries():
    from attnlm.generate.lookahead import drop_newest

    model = tiny_gpt("learned")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        cache = model.new_state()
        model(ids, cache=cache)
        drop_newest(cache, 2)
        assert cache.length == 3 and cache.position == 3
        a = model(torch.tensor([[9]]), cache=cache).logits
        fresh = model.new_state()
        model(ids[:, :3], cache=fresh)
        b = model(torch.tensor([[9]]), cache=fresh).logits
    torch.testing.assert_close(a, b)


class Counting:
    """A backend (attnlm.runtime) that counts the passes of the one it wraps and records the
    state's length before each."""

    name, reason = "counting", "a test"

    def __init__(self, model):
        from attnlm.runtime.planner import runner_for

        self.model, self.inner, self.calls, self.held = model, runner_for(model), 0, []

    def new_state(self, *args, **kwargs):
        return self.inner.new_state(*args, **kwargs)

    def step(self, tokens, state, last_only=False):
        self.calls += 1
        self.held.append(state.length)
        return self.inner.step(tokens, state, last_only)

    def last_logits(self, tokens, state):
        return self.step(tokens, state, last_only=True)[:, -1]


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("sharpen", [25.0, 1.0])
def test_lookahead_gives_the_greedy_tokens_with_fewer_passes(positions, sharpen):
    model = tiny_gpt(positions, block=64, sharpen=sharpen)
    prompt = [[3, 1, 4, 1, 5, 9, 2, 6]]
    greedy = SamplingConfig(temperature=0, max_new_tokens=50)
    counting = Counting(model)
    fast = decode(model, prompt, greedy, DecodeOptions(lookahead=8, runner=counting))
    passes = counting.calls
    counting = Counting(model)
    slow = decode(model, prompt, greedy, DecodeOptions(lookahead=0, runner=counting))
    assert fast == slow and len(fast[0]) == 50
    assert counting.calls == 50  # one pass per token: the prefill gives the first
    ref = reference_greedy(model, torch.tensor(prompt), 50)[0, 8:].tolist()
    assert fast[0] == ref
    if sharpen > 1:  # a sharp random model repeats itself, so drafts get accepted
        assert passes < 40


def test_lookahead_respects_stop_callback():
    model = tiny_gpt("rope", block=64)
    seen = []
    out = decode(
        model,
        [[1, 2, 3]],
        SamplingConfig(temperature=0, max_new_tokens=40),
        on_token=lambda r, t: seen.append(t) or len(seen) == 7,
    )
    assert len(out[0]) == 7 and out[0] == seen


def test_lookahead_rejected_drafts_are_undone(monkeypatch):
    import attnlm.generate.lookahead as la

    model = tiny_gpt("rope", block=64, sharpen=1.0)
    prompt = [3, 1, 4, 1, 5]
    truth = decode(
        model,
        [prompt],
        SamplingConfig(temperature=0, max_new_tokens=40),
        DecodeOptions(lookahead=0),
    )[0]
    full = prompt + truth

    def half_right(seq, k, max_ngram=4):
        # the true next two tokens, then wrong guesses that must be rejected and undone
        nxt = full[len(seq) : len(seq) + k]
        return nxt[:2] + [(t + 1) % 40 for t in nxt[2:]]

    monkeypatch.setattr(la, "lookup_draft", half_right)
    counting = Counting(model)  # records the cache's length before each pass
    greedy = SamplingConfig(temperature=0, max_new_tokens=40)
    assert decode(model, [prompt], greedy, DecodeOptions(lookahead=6, runner=counting))[0] == truth
    held = counting.held
    # prefill, then each pass commits the next token and two accepted guesses; the four wrong
    # guesses are fed too but dropped from the cache again
    assert held[:5] == [0, 5, 8, 11, 14]
