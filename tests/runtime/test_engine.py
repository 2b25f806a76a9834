"""The decode engine without PyTorch (:mod:`attnlm.runtime.engine`, built from a GGUF file by
:mod:`attnlm.runtime.engine_gguf`, decoded by :mod:`attnlm.generate.engine_decode`), against
``transformers`` on the weights the file holds, against attnlm's PyTorch loader and decoder,
and through ``attnlm generate``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import support_runtime
from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.generate import SamplingConfig, apply_filters, decode, engine_decode, sampling_filters
from attnlm.generate.options import DecodeOptions
from attnlm.loading.sources import gguf_file
from attnlm.models import gguf
from attnlm.native import structs
from attnlm.runtime.engine_gguf import engine_format, open_engine
from gguf_support import write_gpt2, write_llama

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler (cc)")

V = 300
Q4_BODY = ("Q8_0",) + ("Q4_1", "Q4_0") * 20  # token_embd Q8_0, every other matrix 4-bit
FILES = {  # name: (matrix types in file order, tied embeddings, format)
    "q4 tied": (Q4_BODY, True, "q4"),
    "q4 head q4": (Q4_BODY, False, "q4"),
    "q4 head q8": (("Q8_0", "Q8_0") + ("Q4_1",) * 20, False, "q4"),
    "q8 tied": (("Q8_0",), True, "q8"),
}


def asked(name: str) -> str | None:
    """The ``weights`` that puts a file in its format: q8 is asked for (an all-Q8_0 file is
    multiplied in its blocks by default, as llama.cpp multiplies it), q4 is the default."""
    return "q8" if FILES[name][2] == "q8" else None


def hf_llama(tied: bool):
    return support_runtime.hf_llama(tied, V, width=64, ffn=128, seed=5)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (path, transformers model holding what the file holds)"""
    out = {}
    for name, (types, tied, _fmt) in FILES.items():
        path = tmp_path_factory.mktemp("gguf") / f"{name.replace(' ', '-')}.gguf"
        model = hf_llama(tied)
        held = write_llama(path, model, types=types)
        state = {k: torch.from_numpy(np.array(v)) for k, v in held.items()}
        if tied:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model.load_state_dict(state, strict=False)
        out[name] = (path, model)
    return out


@pytest.mark.parametrize("name", FILES)
def test_the_engine_holds_the_pytorch_loaders_bytes(files, name):
    """Every product's codes and scales, and the embedding's, are the bytes the PyTorch loader
    gives its q8 / q4 layers (so the C step reads the same weights on both paths)."""
    path, _ = files[name]
    header = GGUFFile(path)
    fmt = FILES[name][2]
    assert engine_format(header, asked(name)) == fmt
    assert engine_format(header, None) == (fmt if fmt == "q4" else "ggml-block")
    engine = open_engine(header, asked(name), 1)
    model = gguf.load_model(header, fmt)

    def same(ours, layer):
        assert ours.n == layer.out_features and ours.k == layer.in_features
        if ours.fmt == structs.Q8:
            theirs = (layer.qweight, layer.scales)
        else:
            theirs = (layer.qweight, layer.scales_mins)
        for a, b in zip((ours.w, ours.scales), theirs):
            assert a.shape == tuple(b.shape) and a.dtype.itemsize == b.element_size()
            assert a.tobytes() == b.numpy().tobytes()

    for mine, block in zip(engine.blocks, model.blocks):
        same(mine.qkv, block.attn.qkv_proj)
        same(mine.out, block.attn.out_proj)
        same(mine.fc, block.mlp.fc)
        same(mine.proj, block.mlp.proj)
        assert mine.ln_1.tobytes() == block.ln_1.weight.detach().numpy().tobytes()
    table = model.tok_emb.table
    assert engine.embedding.tobytes() == table.qweight.numpy().tobytes()
    assert engine.emb_scales.tobytes() == table.scales.numpy().tobytes()
    same(engine.head, model.lm_head)


@pytest.mark.parametrize("name", FILES)
def test_logits_equal_transformers_on_the_weights_the_file_holds(files, name):
    """Prompts of 2 rows (a prefill of 70 tokens: two calls of the step), then single tokens,
    and the last position alone, against ``LlamaForCausalLM`` with the dequantized weights."""
    path, hf = files[name]
    engine = open_engine(GGUFFile(path), asked(name), 2)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, size=(2, 75))
    engine.reset(2)
    got = np.concatenate([
        engine_decode._feed(engine, ids[:, :70], last_only=False),
        engine.feed(ids[:, 70:72]), engine.feed(ids[:, 72:73]),
        engine.feed(ids[:, 73:75], last_only=True),
    ], axis=1)  # fmt: skip
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(got[:, :73], want[:, :73], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(got[:, 73], want[:, 74], atol=1e-4, rtol=1e-4)
    assert engine.length == 75


@pytest.mark.parametrize("name", ["q4 tied", "q8 tied"])
@pytest.mark.parametrize("lookahead", [0, 8])
def test_greedy_tokens_equal_the_pytorch_paths(files, name, lookahead):
    path, _ = files[name]
    header = GGUFFile(path)
    engine = open_engine(header, asked(name), 2)
    model = gguf.load_model(header, FILES[name][2]).eval()
    prompt = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
    greedy = SamplingConfig(temperature=0, max_new_tokens=64)
    ours = engine_decode.decode(engine, prompt, greedy, lookahead=lookahead)
    assert ours == decode(model, prompt, greedy, DecodeOptions(lookahead=lookahead))
    assert len(ours[0]) == 64
    # two rows, and a callback that ends one row early
    seen: list[tuple[int, int]] = []

    def on_token(row, token):
        seen.append((row, token))
        return row == 1 and sum(r == 1 for r, _ in seen) == 5

    two = engine_decode.decode(engine, prompt * 2, greedy, on_token=on_token)
    assert two[0] == ours[0] and two[1] == ours[0][:5]


def test_sampling_draws_from_the_filtered_distribution():
    """The numpy filters and draw against :mod:`attnlm.generate.filters` (PyTorch): 40,000
    draws per setting, frequencies within 0.01 of the filtered softmax; nothing filtered out is
    ever drawn; a seed repeats its draws."""
    logits = np.random.default_rng(1).normal(size=40).astype(np.float32) * 2
    settings = [
        dict(temperature=0.7),
        dict(temperature=1.0, top_k=5),
        dict(temperature=1.3, top_p=0.8),
        dict(temperature=0.9, top_k=12, top_p=0.6),
    ]
    for s in settings:
        sampling = SamplingConfig(**s)
        specs = sampling_filters(sampling.temperature, sampling.top_k, sampling.top_p)
        want = torch.softmax(apply_filters(torch.from_numpy(logits)[None], specs), -1)[0]
        batch = np.repeat(logits[None], 40_000, axis=0)
        drawn = engine_decode._sample(batch, sampling, np.random.default_rng(7))
        freq = np.bincount(drawn, minlength=len(logits)) / len(drawn)
        assert np.abs(freq - want.numpy()).max() < 0.01, s
        assert (freq[want.numpy() == 0] == 0).all(), s
        again = engine_decode._sample(batch[:50], sampling, np.random.default_rng(7))
        assert (again == drawn[:50]).all()


def test_where_the_engine_does_not_apply(files, tmp_path):
    path, _ = files["q4 tied"]
    header = GGUFFile(path)
    assert engine_format(header, "q8") is None  # re-quantizing is the PyTorch path's
    assert engine_format(header, "q4") == "q4"
    mixed = tmp_path / "mixed.gguf"
    write_llama(mixed, hf_llama(True), types=("Q8_0", "Q4_1", "F32"))
    assert engine_format(GGUFFile(mixed), None) == "ggml-block"  # multiplied as stored
    assert engine_format(GGUFFile(mixed), "q4") is None  # converting is the PyTorch path's
    gpt = tmp_path / "gpt.gguf"
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    write_gpt2(gpt, transformers.GPT2LMHeadModel(cfg).eval())
    assert engine_format(GGUFFile(gpt), None) is None
    assert gguf_file(str(path)) == path
    assert gguf_file(str(path.parent)) == path  # a folder holding one .gguf file
    (path.parent / "config.json").write_text("{}")
    assert gguf_file(str(path.parent)) is None  # a run or a Hugging Face folder
    (path.parent / "config.json").unlink()
    assert gguf_file("org/name") is None
    from attnlm.loading.checkpoint import CHECKPOINT_DIR

    assert CHECKPOINT_DIR == "checkpoint"  # the name gguf_file looks for


def _attnlm(*args, engine=True):
    """``attnlm ARGS`` in a fresh process, which says on its last stderr line whether it
    imported torch."""
    code = ("import sys; from attnlm.cli import main; code = main(sys.argv[1:]); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr); "
            "sys.exit(code)")  # fmt: skip
    env = {**os.environ, "ATTNLM_ENGINE": "1" if engine else "0"}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip


def _generate(path, *extra, engine=True):
    return _attnlm("generate", "--model", path, "--prompt", "Hello there", "--threads", "1",
                   *extra, engine=engine)  # fmt: skip


@pytest.mark.parametrize("extra", [
    ("--temperature", "0", "--max-new-tokens", "40", "--json"),
    ("--temperature", "0", "--max-new-tokens", "40", "--stream", "--stop", "e", "--lookahead", "0"),
])  # fmt: skip
def test_generate_runs_without_pytorch_and_prints_the_pytorch_paths_text(files, extra):
    path, _ = files["q4 tied"]
    ours, theirs = _generate(path, *extra), _generate(path, *extra, engine=False)
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr
    assert ours.stderr.strip().endswith("no torch")
    assert theirs.stderr.strip().endswith("torch imported")
    if "--json" in extra:
        a, b = (json.loads(r.stdout.strip().splitlines()[-1]) for r in (ours, theirs))
        assert a["texts"] == b["texts"] and a["new_tokens"] == b["new_tokens"] == 40
        assert a["threads"] == 1 and a["peak_rss_mb"] < b["peak_rss_mb"] - 100  # no torch
    else:
        assert ours.stdout == theirs.stdout


def test_a_seed_repeats_its_samples_on_the_engine(files):
    path, _ = files["q4 tied"]
    args = ("--max-new-tokens", "20", "--seed", "11", "--top-k", "30", "--num-samples", "2")
    first, again = _generate(path, *args), _generate(path, *args)
    other = _generate(path, "--max-new-tokens", "20", "--seed", "12", "--top-k", "30")
    assert first.returncode == 0 and first.stdout == again.stdout
    assert first.stdout.split("\n" + "-" * 40 + "\n")[0] != other.stdout.strip()
    assert first.stderr.strip().endswith("no torch")


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_a_vocabulary_limit_is_kept(files, temperature):
    """Ids past the tokenizer's are never picked on the engine (greedy: the PyTorch loop's
    tokens with the same logits processor)."""
    from attnlm.generate.sampling import mask_from

    path, _ = files["q8 tied"]
    header = GGUFFile(path)
    engine = open_engine(header, None, 1)
    prompt = [[3, 1, 4, 1, 5]]
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=40, seed=2)
    ours = engine_decode.decode(engine, prompt, sampling, vocab_limit=150)
    assert max(ours[0]) < 150 and len(ours[0]) == 40
    if temperature == 0:
        model = gguf.load_model(header, "q8").eval()
        theirs = decode(model, prompt, sampling, process=lambda x, _p, _t: mask_from(x, 150))
        assert ours == theirs


TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")  # fmt: skip


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_chat_on_the_engine_follows_the_pytorch_session(files, temperature):
    """Three turns, an edited history (the engine's positions cut back to the common prefix),
    a reset: greedy replies equal the PyTorch ChatSession's; sampled ones repeat with a seed."""
    from attnlm.generate.chat import ChatSession
    from attnlm.generate.engine_chat import EngineChatSession
    from attnlm.tokenizers.chat_template import from_string
    from attnlm.tokenizers.gguf import GGUFTokenizer

    path, _ = files["q4 tied"]
    header = GGUFFile(path)
    tok = GGUFTokenizer.from_gguf(header)
    template = from_string(TEMPLATE)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=12, seed=4)
    stops = (7,)

    def conversation(session):
        out = [session.reply(u).ids for u in ("hello", "and then?")]
        session.messages[-1]["content"] = "an edited reply"
        out.append(session.reply("again").ids)
        reply = session.reply("more")
        assert 0 < reply.reused < reply.prompt_tokens  # the cache served the common prefix
        out.append(reply.ids)
        session.reset()
        out.append(session.reply("hello").ids)
        return out

    ours = conversation(EngineChatSession(open_engine(header, None, 1), tok, template, stops,
                                          sampling=sampling))  # fmt: skip
    if temperature == 0:
        model = gguf.load_model(header, "q4").eval()
        assert ours == conversation(ChatSession(model, tok, template, stops, sampling=sampling))
        plain = EngineChatSession(open_engine(header, None, 1), tok, template, stops,
                                  sampling=sampling, lookahead=0)  # fmt: skip
        assert ours == conversation(plain)  # drafts (the default) change no reply
        assert ours[0] == ours[-1]  # after reset() the first turn again
    else:
        again = conversation(EngineChatSession(open_engine(header, None, 1), tok, template,
                                               stops, sampling=sampling))  # fmt: skip
        assert ours == again


def test_a_yarn_file_runs_without_pytorch():
    """YaRN's ramp and scale come from :mod:`attnlm.nn.yarn`, which needs no PyTorch: a Qwen3
    file with YaRN decodes on the engine without importing it (it once did)."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch" / "qwen3-yarn-Q8_0.gguf"
    run = _attnlm("generate", "--model", path, "--prompt", "The", "--max-new-tokens", "3",
                  "--threads", "1", "--json")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip().endswith("no torch")
    assert json.loads(run.stdout.strip().splitlines()[-1])["backend"] == "c-engine"


def test_chat_command_runs_without_pytorch(files, tmp_path):
    path, _ = files["q4 tied"]
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    args = ("chat", "--model", path, "--template", template, "--message", "hello",
            "--temperature", "0", "--max-new-tokens", "8", "--threads", "1", "--json")  # fmt: skip
    runs = [_attnlm(*args, engine=e) for e in (True, False)]
    runs.append(_attnlm(*args, "--lookahead", "0", engine=True))
    assert all(r.returncode == 0 for r in runs), "".join(r.stderr for r in runs)
    assert runs[0].stderr.strip().endswith("no torch")
    assert runs[1].stderr.strip().endswith("torch imported")
    a, b, c = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert a["tokens"] == b["tokens"] == c["tokens"] and a["reply"] == b["reply"] == c["reply"]
    assert (a["backend"], b["backend"]) == ("c-engine", "c-step")  # --json names the backend
    assert "without PyTorch" in a["backend_reason"] and "C call" in b["backend_reason"]


def test_a_draft_for_the_files_own_4_bit_weights_is_refused(files):
    """``--draft`` speeds up float32 weights; on the engine (the file's q4) it is one line."""
    path, _ = files["q4 tied"]
    run = _generate(path, "--temperature", "0", "--draft", "q4")
    lines = [line for line in run.stderr.splitlines() if line != "no torch"]
    assert run.returncode == 2 and len(lines) == 1 and "--weights f32" in lines[0], run.stderr
    ok = _generate(path, "--temperature", "0", "--draft", "q4", "--weights", "f32",
                   "--max-new-tokens", "8")  # fmt: skip
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("where", ["scale", "norm"])
def test_a_damaged_file_is_refused_in_one_line(files, tmp_path, where):
    """A NaN block scale or norm gain: the engine refuses the file as the PyTorch loader does
    (exit 2, one line naming the tensor), instead of decoding NaN logits."""
    path, _ = files["q4 tied"]
    header = GGUFFile(path)
    name = "blk.1.attn_v.weight" if where == "scale" else "blk.0.ffn_norm.weight"
    info = header.tensors[name]
    data = bytearray(path.read_bytes())
    nan = np.array([np.nan], np.float16 if where == "scale" else np.float32).tobytes()
    data[info.offset : info.offset + len(nan)] = nan  # the first block's d, or the first gain
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    run = _generate(bad, "--temperature", "0", "--max-new-tokens", "4")
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line != "no torch"]
    assert len(lines) == 1 and name in lines[0] and "NaN" in lines[0], run.stderr
