"""The encoder-decoder Transformer: parity with Hugging Face ``MarianMTModel`` (logits,
attention weights, beams of ``generate(num_beams=k)``), the save_hf round trip, the
decoding-state equivalences (cache vs recompute, batched vs alone) and the config checks.

The references are small random Marian models built from a ``MarianConfig`` and written with
``save_pretrained`` (offline), with every weight randomised (layer norms and the logits bias
too, which Marian's own init leaves at 1 / 0)."""

from __future__ import annotations

import pytest
import torch

from attnlm.base.errors import ConfigError, InputError
from attnlm.models import from_hf, save_hf
from attnlm.models.hf import marian as hf_marian
from attnlm.models.transformer import Transformer, TransformerConfig
from support import randomize_marian

transformers = pytest.importorskip("transformers")

PAD, EOS = 5, 0  # Marian: eos 0, pad = decoder start (the last id in OPUS-MT models)


def _marian(
    tmp_path, *, shared=True, act="swish", scale=True, vocab=23, dec_vocab=None, seed=0, forced=EOS
):
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    cfg = MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=dec_vocab,
        share_encoder_decoder_embeddings=shared,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=24,
        decoder_ffn_dim=24,
        activation_function=act,
        max_position_embeddings=64,
        scale_embedding=scale,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=EOS,
        forced_eos_token_id=forced,
        dropout=0.0,
    )
    model = MarianMTModel(cfg).eval()
    randomize_marian(model)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    model.generation_config = GenerationConfig(
        decoder_start_token_id=PAD,
        pad_token_id=PAD,
        eos_token_id=EOS,
        forced_eos_token_id=forced,
        bad_words_ids=[[PAD]],
        max_length=64,
    )
    folder = tmp_path / "marian"
    model.save_pretrained(folder)
    ref = MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()
    return ref, folder


def _batch(vocab=23, dec_vocab=None):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(6, vocab, (3, 7), generator=g)
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[1, 5:] = False
    src_mask[2, 3:] = False
    src[~src_mask] = PAD
    src[0, -1] = EOS
    tgt = torch.randint(6, dec_vocab or vocab, (3, 6), generator=g)
    tgt[:, 0] = PAD  # decoder start
    return src, src_mask, tgt


@pytest.mark.parametrize(
    "shared,act,scale,dec_vocab",
    [(True, "swish", True, None), (False, "gelu", False, 19), (True, "relu", True, None)],
)
def test_marian_logits_and_attention_match(tmp_path, shared, act, scale, dec_vocab):
    ref, folder = _marian(tmp_path, shared=shared, act=act, scale=scale, dec_vocab=dec_vocab)
    ours = from_hf(folder)
    assert isinstance(ours, Transformer)
    src, src_mask, tgt = _batch(dec_vocab=dec_vocab)
    with torch.no_grad():
        theirs = ref(
            input_ids=src,
            attention_mask=src_mask.long(),
            decoder_input_ids=tgt,
            output_attentions=True,
            output_hidden_states=True,
        )
        out = ours(src, tgt, src_mask, return_attention=True, return_hidden=True)
    torch.testing.assert_close(out.logits, theirs.logits, atol=1e-5, rtol=1e-5)
    real = src_mask[:, :, None]  # encoder states at padding are not compared (never read)
    torch.testing.assert_close(
        out.encoder_hidden_states[-1] * real, theirs.encoder_last_hidden_state * real,
        atol=1e-5, rtol=1e-5,
    )  # fmt: skip
    for a, b in zip(out.attentions, theirs.decoder_attentions, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(out.cross_attentions, theirs.cross_attentions, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    rows = src_mask[:, None, :, None]  # encoder attention of real queries
    for a, b in zip(out.encoder_attentions, theirs.encoder_attentions, strict=True):
        torch.testing.assert_close(a * rows, b * rows, atol=1e-5, rtol=1e-5)


def _hf_beam(ref, sources, k, lp, es, n):
    from transformers import GenerationConfig

    out = []
    for s in sources:  # one at a time: no source padding inside generate's batch
        gen = GenerationConfig(
            **ref.generation_config.to_dict()
            | dict(
                num_beams=k,
                length_penalty=lp,
                early_stopping=es,
                max_new_tokens=n,
                do_sample=False,
                max_length=None,
            )  # fmt: skip
        )
        seq = ref.generate(torch.tensor([s]), generation_config=gen)[0].tolist()
        while len(seq) > 1 and seq[-1] == PAD:  # generate pads finished rows after eos
            seq.pop()
        out.append(seq)
    return out


@pytest.mark.parametrize(
    "k,lp,es",
    [
        (1, 1.0, False),
        (2, 1.0, False),
        (4, 1.0, False),
        (3, 0.5, True),
        (4, 2.0, "never"),
        (4, -1.0, False),
        (2, 1.0, True),
    ],  # fmt: skip
)
def test_marian_beams_match_generate(tmp_path, k, lp, es):
    from attnlm.generate import beam_search

    ref, folder = _marian(tmp_path, seed=3)
    ours = from_hf(folder)
    g = torch.Generator().manual_seed(7)
    sources = [torch.randint(6, 23, (n,), generator=g).tolist() + [EOS] for n in (4, 6, 2, 6)]
    got = beam_search(ours, sources, k, length_penalty=lp, early_stopping=es, max_new_tokens=9)
    want = _hf_beam(ref, sources, k, lp, es, 9)
    assert got == want
    assert all(seq[0] == PAD for seq in got)  # the decoder start token, as generate returns


def test_greedy_decode_matches_generate(tmp_path):
    from attnlm.generate import SamplingConfig, decode

    ref, folder = _marian(tmp_path, seed=4)
    ours = from_hf(folder)
    sources = [[7, 8, 9, 10, EOS], [11, 12, EOS]]
    setup = ours.prepare_decoding(sources)
    got = decode(
        ours,
        setup.prompts,
        SamplingConfig(temperature=0, max_new_tokens=8),
        eos_id=EOS,
        state_batch=setup.state_batch,
        process=setup.process,
    )
    want = _hf_beam(ref, sources, 1, 1.0, False, 8)
    assert [[PAD, *g] for g in got] == want


FORCED = 9  # a forced "end" token that is not eos (issue 22)


@pytest.mark.parametrize("k", [1, 3])
def test_forced_token_other_than_eos_loads_and_matches_generate(tmp_path, k):
    """A Marian folder whose ``forced_eos_token_id`` differs from ``eos_token_id`` loads, and
    greedy / beam search force that token at the length limit as ``generate`` does."""
    from attnlm.generate import SamplingConfig, beam_search, decode
    from attnlm.models.hf import marian

    ref, folder = _marian(tmp_path, seed=5, forced=FORCED)
    ours = from_hf(folder)
    assert ours.config.forced_eos == FORCED and ours.config.eos_id == EOS
    g = torch.Generator().manual_seed(11)
    sources = [torch.randint(6, 23, (n,), generator=g).tolist() + [EOS] for n in (5, 3, 7, 2)]
    n = 6
    want = _hf_beam(ref, sources, k, 1.0, False, n)
    if k == 1:
        setup = ours.prepare_decoding(sources)
        got = decode(
            ours,
            setup.prompts,
            SamplingConfig(temperature=0, max_new_tokens=n),
            eos_id=EOS,
            state_batch=setup.state_batch,
            process=setup.process,
        )
        got = [[PAD, *row] for row in got]
    else:
        got = beam_search(ours, sources, k, max_new_tokens=n)
    assert got == want
    at_limit = [row for row in want if len(row) == n + 1]
    assert at_limit and all(row[-1] == FORCED for row in at_limit)  # the forced token is used
    hf, generation = marian.config_to_hf(ours.config)
    assert hf["forced_eos_token_id"] == generation["forced_eos_token_id"] == FORCED


def test_save_hf_roundtrip(tmp_path):
    from transformers import MarianMTModel

    torch.manual_seed(0)
    cfg = TransformerConfig(
        vocab_size=21, d_model=16, n_head=2, n_encoder_layers=2, n_decoder_layers=1, d_ff=20,
        activation="silu", positions_layout="split", final_logits_bias=True, dropout=0.0,
        pad_id=3, bos_id=3, eos_id=1,
    )  # fmt: skip
    ours = Transformer(cfg).eval()
    with torch.no_grad():
        ours.logits_bias.normal_()
    save_hf(ours, tmp_path / "out")
    theirs = MarianMTModel.from_pretrained(tmp_path / "out").eval()
    src = torch.tensor([[4, 5, 6, 1], [7, 8, 1, 3]])
    mask = src != 3
    mask[0, :] = True
    tgt = torch.tensor([[3, 9, 10], [3, 11, 12]])
    with torch.no_grad():
        a = ours(src, tgt, mask).logits
        b = theirs(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    again = hf_marian.load(tmp_path / "out")
    assert again.config == cfg
    for (ka, va), (kb, vb) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def _tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    base = dict(vocab_size=17, d_model=16, n_head=2, n_encoder_layers=2, n_decoder_layers=2,
                dropout=0.0, pad_id=0, bos_id=1, eos_id=2)  # fmt: skip
    return Transformer(TransformerConfig(**(base | kw))).eval()


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cache_equals_recompute_and_padding_is_invisible(norm):
    model = _tiny(norm=norm)
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    mask = src != 0
    tgt = torch.tensor([[1, 10, 11, 12], [1, 13, 14, 15]])
    with torch.no_grad():
        full = model(src, tgt, mask).logits
        state = model.new_state({"src": src, "src_mask": mask})
        steps = torch.cat([model.step(tgt[:, i : i + 1], state) for i in range(4)], dim=1)
        alone = model(src[1:, :3], tgt[1:]).logits  # row 1 without its padding
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full[1:], alone, atol=1e-5, rtol=1e-5)


def test_beam_batched_equals_alone_and_sampling_runs():
    from attnlm.generate import SamplingConfig, beam_search, decode

    model = _tiny()
    sources = [[5, 6, 7, 2], [8, 2], [9, 10, 11, 12, 13, 2]]
    together = beam_search(model, sources, 3, max_new_tokens=6)
    alone = [beam_search(model, [s], 3, max_new_tokens=6)[0] for s in sources]
    assert together == alone
    assert all(h[0] == 1 and 0 not in h for h in together)  # start token, never padding
    setup = model.prepare_decoding(sources)
    a = decode(model, setup.prompts, sampling=SamplingConfig(max_new_tokens=5, seed=3),
               eos_id=2, state_batch=setup.state_batch, process=setup.process)  # fmt: skip
    b = decode(model, setup.prompts, sampling=SamplingConfig(max_new_tokens=5, seed=3),
               eos_id=2, state_batch=setup.state_batch, process=setup.process)  # fmt: skip
    assert a == b and all(0 < len(r) <= 5 for r in a)
    assert all(r[-1] == 2 for r in a)  # forced end token at the length limit


@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_cross_attention_and_in_place_reorder_equal_per_row_state(need_weights):
    """The decoding-state fast paths (one copy of a source's cross-attention keys for all its
    beams, ``cross_group``; self-attention rows copied in place only where they move; sources
    leaving the batch) give the logits of a state that keeps every row's entries apart."""
    from attnlm.nn.attention import KVCache

    model = _tiny()
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0], [3, 2, 0, 0]])
    batch = {"src": src, "src_mask": src != 0}
    K = 3
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        fast, slow = model.new_state(batch), model.new_state(batch)
        start = torch.ones(3, 1, dtype=torch.long)
        model.step(start, fast), model.step(start, slow)
        expand = torch.arange(3).repeat_interleave(K)
        fast.reorder(expand)
        KVCache.reorder(slow, expand)  # every row its own copy (the generic reorder)
        slow.rows = torch.arange(3 * K)
        assert fast.cross_group == K and fast.cross[0][0].shape[0] == 3
        assert slow.cross_group == 1 and slow.cross[0][0].shape[0] == 3 * K
        for t in range(5):
            B = fast.keys[0].shape[0] // K
            tokens = torch.randint(3, 17, (B * K, 1), generator=gen)
            if need_weights:
                a = model.decode(tokens, None, fast.context_mask, fast, return_attention=True)
                b = model.decode(tokens, None, slow.context_mask, slow, return_attention=True)
                for wa, wb in zip(a[2], b[2]):  # cross-attention weights per row
                    torch.testing.assert_close(wa, wb, atol=1e-6, rtol=1e-6)
                a, b = a[0], b[0]
            else:
                a, b = model.step(tokens, fast), model.step(tokens, slow)
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
            # beams take parents within their source; at t == 2 the middle source leaves
            parents = torch.randint(0, K, (B, K), generator=gen)
            parents[0] = torch.arange(K)  # the first source's beams keep their places
            keep = torch.tensor([0, 2]) if t == 2 else torch.arange(B)
            flat = (keep[:, None] * K + parents[keep]).view(-1)
            fast.reorder(flat)
            slow.reorder(flat)
        assert fast.cross_group == K and fast.cross[0][0].shape[0] == 2


def _targets_with_holes(tgt: torch.Tensor, lengths: list[int], g) -> torch.Tensor:
    """Targets right-padded to each row's length with -100, plus -100 holes inside: row 1
    has none counted at all, row 2 a hole before its last counted one."""
    targets = torch.randint(6, 19, tgt.shape, generator=g)
    for r, n in enumerate(lengths):
        targets[r, n:] = -100
    targets[1] = -100
    targets[2, 1] = -100
    return targets


@pytest.mark.parametrize("shared,act,scale,dec_vocab", [(True, "swish", True, None),
                                                         (False, "relu", False, 19)])  # fmt: skip
def test_packed_training_loss_matches_marian_and_padded_gradients(
    tmp_path, shared, act, scale, dec_vocab
):
    """With targets, ``forward`` runs the per-token layers on real tokens only (packed). Its
    loss equals Marian's on the padded batch, and its gradients equal our padded path's."""
    ref, folder = _marian(tmp_path, shared=shared, act=act, scale=scale, dec_vocab=dec_vocab)
    ours = from_hf(folder).train()  # dropout 0: train mode changes nothing else
    g = torch.Generator().manual_seed(3)
    src, src_mask, tgt = _batch(dec_vocab=dec_vocab)
    tgt = torch.cat([tgt, tgt[:, :2]], 1)  # 8 target positions, rows of length 8, 5, 6
    targets = _targets_with_holes(tgt, [8, 5, 6], g)
    packed = ours(src, tgt, src_mask, targets=targets)
    assert packed.logits.shape == (int((targets != -100).sum()), ours.config.vocab_size)
    logits = ref(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(packed.loss, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.logits, logits[targets != -100], atol=1e-5, rtol=1e-5)

    params = [p for p in ours.parameters() if p.requires_grad]
    fast = torch.autograd.grad(packed.loss, params)
    padded = ours(src, tgt, src_mask, targets=targets, return_hidden=True)  # the padded path
    assert padded.logits.shape == (*tgt.shape, ours.config.vocab_size)
    slow = torch.autograd.grad(padded.loss, params)
    torch.testing.assert_close(packed.loss, padded.loss, atol=1e-6, rtol=1e-6)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_packed_training_equals_padded_with_label_smoothing(norm):
    model = _tiny(norm=norm, label_smoothing=0.1, share_embeddings=False, src_vocab_size=21)
    model.train()
    g = torch.Generator().manual_seed(4)
    src = torch.randint(3, 21, (4, 9), generator=g)
    src_mask = torch.arange(9)[None] < torch.tensor([9, 2, 5, 1])[:, None]
    src = src.masked_fill(~src_mask, 0)
    tgt = torch.randint(3, 17, (4, 7), generator=g)
    targets = _targets_with_holes(tgt, [7, 3, 4, 2], g).clamp(max=16)
    packed = model(src, tgt, src_mask, targets=targets)
    padded = model(src, tgt, src_mask, targets=targets, return_hidden=True)
    assert packed.logits.dim() == 2 and padded.logits.dim() == 3
    assert int(packed.n_targets) == int(padded.n_targets) == int((targets != -100).sum())
    torch.testing.assert_close(packed.loss, padded.loss, atol=1e-6, rtol=1e-6)
    params = list(model.parameters())
    for a, b in zip(torch.autograd.grad(packed.loss, params),
                    torch.autograd.grad(padded.loss, params), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_packing_pads_and_takes():
    from attnlm.nn.attention import Packing

    keep = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    p = Packing(keep)
    x = torch.arange(9.0).view(3, 3, 1)
    packed = p.take(x)  # (N, 1)
    assert packed.view(-1).tolist() == [0.0, 1.0, 6.0, 8.0]
    assert p.positions.tolist() == [0, 1, 0, 2]
    assert torch.equal(p.pad(packed), x * keep[..., None])  # zeros where not kept


def test_label_smoothing_loss_matches_formula():
    model = _tiny(label_smoothing=0.1)
    src = torch.tensor([[5, 6, 2]])
    tgt_in, targets = torch.tensor([[1, 7, 8]]), torch.tensor([[7, 8, -100]])
    out = model(src, tgt_in, targets=targets)
    full = model(src, tgt_in).logits[0, :2]  # (2, V): no targets, every position
    torch.testing.assert_close(out.logits, full)  # with targets: the counted ones only
    logp = torch.log_softmax(full, -1)
    eps, V = 0.1, 17
    want = -((1 - eps) * logp[[0, 1], [7, 8]] + eps / V * logp.sum(-1)).mean()
    torch.testing.assert_close(out.loss, want)
    assert int(out.n_targets) == 2


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="model.n_head"):
        TransformerConfig(vocab_size=10, d_model=10, n_head=3)
    with pytest.raises(ConfigError, match="share_embeddings"):
        TransformerConfig(vocab_size=10, src_vocab_size=12)
    with pytest.raises(ConfigError, match="model.eos_id"):
        Transformer(TransformerConfig(vocab_size=10, eos_id=10))
    with pytest.raises(ConfigError, match="model.norm"):
        TransformerConfig(vocab_size=10, norm="middle")
    with pytest.raises(InputError, match="source"):
        _tiny().new_state(None)
