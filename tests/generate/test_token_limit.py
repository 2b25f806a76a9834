"""A model with more output rows than its tokenizer has ids (an embedding padded to a round
size): decoding never picks an id the tokenizer cannot decode, on every backend (PyTorch eager,
the compiled step, the C step, the C engine without PyTorch), greedy and sampled, in
``generate_text``, a chat (drafts and a draft model included) and translation (greedy,
sampled, beam search). The padded rows' head weights are scaled so that, unmasked, they win."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlm import native
from attnlm.generate import SamplingConfig, generate_text
from attnlm.generate.chat import ChatSession
from attnlm.generate.options import DecodeOptions
from attnlm.generate.sampling import mask_from, masking, token_limit
from attnlm.models.gpt import GPT, GPTConfig
from attnlm.tokenizers import CharTokenizer
from attnlm.tokenizers.base import InvalidTokenIdError
from attnlm.tokenizers.chat_template import ChatTemplate

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "abcdefghijklmnopqrstuvwxyz <>/\n"
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<a>{% endif %}")  # fmt: skip
BACKENDS = ["eager", "c-step", "compiled"]


def padded_model(tok):
    """A GPT with 16 rows past the tokenizer's ids, those rows' logits made the largest."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size + 16, block_size=96, n_layer=1, n_head=2, n_embd=16)
    model = GPT(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[tok.vocab_size :] *= 50  # the padded rows would win every pick
    return model


@pytest.fixture(scope="module")
def padded():
    tok = CharTokenizer.train(TEXT)
    return padded_model(tok), tok


_OPTIONS: dict = {}  # backend -> options (one compiled step for the module's tests)


def _options(model, backend: str) -> DecodeOptions:
    """Decode options that insist on ``backend``."""
    from attnlm.runtime.compiled import CompiledStep
    from attnlm.runtime.planner import runner_for

    if backend == "c-step" and native.library() is None:
        pytest.skip(f"no C decode step: {native.why_not}")
    if (model, backend) not in _OPTIONS:
        if backend == "compiled":  # dynamo's capture without code generation: seconds
            step = CompiledStep(model, backend="eager")
            options = DecodeOptions(compile=step, runner=runner_for(model, compile=step))
        else:
            options = DecodeOptions(runner=runner_for(model, backend=backend))
        _OPTIONS[model, backend] = options
    return _OPTIONS[model, backend]


def _allowed(ids, tok) -> bool:
    return all(0 <= i < tok.vocab_size for i in ids)


def test_unmasked_the_padded_rows_win(padded):
    """The test's premise: without the mask, greedy decoding picks the padded ids."""
    from attnlm.generate import decode

    model, tok = padded
    raw = decode(model, [tok.encode("ab")], SamplingConfig(max_new_tokens=5, temperature=0))
    assert max(raw[0]) >= tok.vocab_size
    with pytest.raises(InvalidTokenIdError):
        tok.decode(raw[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_generate_never_picks_a_padded_row(padded, backend, temperature):
    model, tok = padded
    assert token_limit(model, tok) == tok.vocab_size
    sampling = SamplingConfig(max_new_tokens=30, temperature=temperature, seed=1)
    texts = generate_text(model, tok, ["ab", "ba"], sampling, _options(model, backend))
    assert all(len(t) == 30 and set(t) <= set(TEXT) for t in texts)


@pytest.mark.parametrize("temperature", [0, 1.0])
@pytest.mark.parametrize("drafts", ["none", "lookahead", "draft model"])
def test_chat_never_picks_a_padded_row(padded, temperature, drafts):
    from attnlm.generate.speculative import draft_model

    model, tok = padded
    sampling = SamplingConfig(max_new_tokens=20, temperature=temperature, seed=3)
    draft = draft_model(model, "q8") if drafts == "draft model" else None
    chat = ChatSession(model, tok, ChatTemplate(TEMPLATE), sampling=sampling,
                       lookahead=0 if drafts == "none" else 8, draft=draft)  # fmt: skip
    for turn in ("abc", "hello there"):
        reply = chat.reply(turn)
        assert len(reply.ids) == 20 and _allowed(reply.ids, tok)


def test_no_limit_where_the_rows_match():
    tok = CharTokenizer.train("abc")
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=1, n_embd=8)
    assert token_limit(GPT(cfg), tok) is None


def test_mask_from_takes_tensors_and_arrays():
    t = mask_from(torch.zeros(2, 5), 3)
    a = mask_from(np.zeros((2, 5), np.float32), 3)
    for x in (t.numpy(), a):
        assert np.isneginf(x[:, 3:]).all() and (x[:, :3] == 0).all()


def test_masking_runs_the_processor_after_the_mask():
    seen = []
    process = masking(lambda x, n, m: seen.append((x.clone(), n, m)) or x + 1, 2)
    out = process(torch.zeros(1, 4), 5, 9)
    assert out.tolist() == [[1, 1, float("-inf"), float("-inf")]]
    assert seen[0][1:] == (5, 9) and np.isneginf(seen[0][0][0, 2:].numpy()).all()
    assert masking(None, None) is None


# -- translation: a target vocabulary smaller than the model's output rows ---------------------


@pytest.fixture(scope="module")
def padded_translator():
    from attnlm.data.pairs import Pair, PairTokenizerConfig, train_pair_tokenizers
    from attnlm.models.transformer import Transformer, TransformerConfig

    pairs = [Pair("abc def", "xyz uvw"), Pair("fed cba", "wvu zyx")]
    toks = train_pair_tokenizers(pairs, PairTokenizerConfig(kind="char"))
    ids = toks.target_ids
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=ids.vocab_size + 8, d_model=16, n_head=2,
                            n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0,
                            pad_id=ids.pad, bos_id=ids.bos, eos_id=ids.eos)  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[ids.vocab_size :] *= 60
    return model, toks


@pytest.mark.parametrize("how", ["greedy", "sampled", "beams"])
def test_translation_never_outputs_a_padded_row(padded_translator, how):
    from attnlm.generate.translate import target_limit, translate, translate_ids

    model, toks = padded_translator
    limit = target_limit(model, toks)
    assert limit == toks.target_ids.vocab_size
    kw = {"num_beams": 3} if how == "beams" else {}
    if how == "sampled":
        kw["sampling"] = SamplingConfig(temperature=1.0, seed=4)
    sources = [toks.encode_source("abc"), toks.encode_source("fed cba")]
    raw = translate_ids(model, sources, max_new_tokens=12, **kw)  # the premise: unmasked
    assert any(i >= limit for row in raw for i in row)
    masked = translate_ids(model, sources, max_new_tokens=12, vocab_limit=limit, **kw)
    assert all(_allowed(row, toks.target_ids) for row in masked)
    assert all(len(row) > 1 for row in masked)
    texts = translate(model, toks, ["abc", "fed cba"], max_new_tokens=12, **kw)
    assert texts == [toks.decode_target(row) for row in masked]


# -- the C engine without PyTorch --------------------------------------------------------------


@pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_the_engine_never_picks_a_padded_row(tmp_path_factory, temperature):
    """A Llama GGUF of 300 rows decoded on the engine with a 31-id tokenizer."""
    transformers = pytest.importorskip("transformers")
    from attnlm.base.ggufio import GGUFFile
    from attnlm.generate import engine_decode
    from attnlm.runtime.engine_gguf import open_engine
    from gguf_support import write_llama

    tok = CharTokenizer.train(TEXT)
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        tie_word_embeddings=False,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight[tok.vocab_size :] *= 50
    path = tmp_path_factory.mktemp("gguf") / "padded.gguf"
    write_llama(path, hf, types=("Q8_0",))
    engine = open_engine(GGUFFile(path), None, 1)
    assert token_limit(engine, tok) == tok.vocab_size
    prompt = [tok.encode("abc")]
    sampling = SamplingConfig(max_new_tokens=25, temperature=temperature, seed=2)
    raw = engine_decode.decode(engine, prompt, sampling)  # the premise: unmasked
    assert max(raw[0]) >= tok.vocab_size
    texts = generate_text(engine, tok, ["abc", "cab"], sampling)
    assert all(len(t) == 25 and set(t) <= set(TEXT) for t in texts)
