"""Every command on every architecture of issue 44 (and SmolLM3, Llama 3.1's rotary scaling,
Mistral Nemo's head width), through the CLI, on the tiny llama.cpp fixtures of
``tests/fixtures/gguf_arch`` (Q8_0): ``generate`` (greedy text = the library's
greedy decode of the same file), ``eval`` (= the loss computed here from the model's logits,
the BOS first where the tokenizer adds one), ``params``, ``lens`` (last row = the model's own
prediction), ``attention`` (local / global layers), ``chat`` with Qwen's template and its
system default, the explorer's model endpoints, ``export --out`` (transformers gives the same
logits), ``train --init-from`` / ``--lora`` (the loss falls, the run loads back) and
``export --gguf`` of the trained run (attnlm reads it back with the same logits)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlm.cli import main
from attnlm.data.windows import Windows
from attnlm.generate import SamplingConfig, decode
from attnlm.loading.evaluation import leading_bos
from attnlm.loading.sources import load_model_ref
from attnlm.tokenizers.base import special_encoder

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gguf_arch"
GEMMA_TEMPLATE = ROOT / "tests" / "fixtures" / "real_models" / "gemma3.chat_template.jinja"
QWEN_TEMPLATE = (
    ROOT
    / "tests"
    / "fixtures"
    / "real_models"
    / ("qwen2.5-coder-0.5b-instruct.chat_template.jinja")
)
ARCHS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "smollm3", "llama3",
         "mistral-nemo", "granite", "olmo2", "qwen3-yarn", "phi3-longrope",
         "phi4-mini", "olmo3", "gptoss")  # fmt: skip
# llama.cpp writes Mistral as a "llama" file without its window: it loads as Llama (so do
# Llama 3.1's scaling, llama3, and Mistral Nemo's head width)
LABEL = {"llama": "Llama", "mistral": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3",
         "phi3": "Phi-3", "gemma2": "Gemma 2", "gemma3": "Gemma 3", "smollm3": "SmolLM3",
         "llama3": "Llama", "mistral-nemo": "Llama", "granite": "Granite",
         "olmo2": "OLMo 2", "qwen3-yarn": "Qwen3", "phi3-longrope": "Phi-3",
         "phi4-mini": "Phi-3", "olmo3": "OLMo 3", "gptoss": "gpt-oss"}  # fmt: skip
PROMPT = "The quick brown"
TEXT = (
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.\n"
    "A small model learns to predict the next word of a text from the words before it.\n"
)
WEIGHTS: dict[str, str] = {}  # an architecture's --weights, where not the file's own


def fixture(arch: str) -> Path:
    return FIXTURES / f"{arch}-Q8_0.gguf"


def run_cli(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main([str(a) for a in args]) == 0
    return capsys.readouterr().out


def weights_args(arch: str) -> list[str]:
    return ["--weights", WEIGHTS[arch]] if arch in WEIGHTS else []


@pytest.fixture(scope="module")
def loaded():
    """Each architecture's fixture loaded once through the library: (model, tokenizer)."""
    cache: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in cache:
            ck = load_model_ref(None, fixture(arch), torch.device("cpu"), WEIGHTS.get(arch))
            cache[arch] = (ck.model.eval(), ck.tokenizer)
        return cache[arch]

    return get


def direct_loss(model, tok, text: str) -> tuple[float, int]:
    """Mean next-token loss of ``text`` in one window, the BOS first where the tokenizer adds
    one (then every token of the text is predicted), computed here from the logits."""
    ids = list(tok.encode(text))
    bos = leading_bos(tok)
    x = ([bos] if bos is not None else []) + ids
    with torch.no_grad():
        logits = model(torch.tensor([x[:-1]])).logits[0].double()
    y = torch.tensor(x[1:])
    return float(torch.nn.functional.cross_entropy(logits, y)), len(y)


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_eval_params_lens_attention(arch, loaded, tmp_path, capsys):
    model, tok = loaded(arch)
    m, w = fixture(arch), weights_args(arch)
    # generate: the greedy text of the library's decode of the same file (prompt with specials)
    ids = special_encoder(tok)(PROMPT)
    (want,) = decode(model, [ids], SamplingConfig(temperature=0, max_new_tokens=10))
    out = run_cli(capsys, "generate", "--model", m, *w, "--prompt", PROMPT,
                  "--temperature", "0", "--max-new-tokens", "10")  # fmt: skip
    assert out == PROMPT + tok.decode(want) + "\n"  # (the text may end in a newline itself)

    # eval: the numbers of a direct computation
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    got = json.loads(run_cli(capsys, "eval", "--model", m, *w, "--text", text, "--json"))
    loss, n = direct_loss(model, tok, TEXT)
    assert got["tokens"] == n and got["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-5)
    assert got["ppl"] == pytest.approx(math.exp(loss), rel=1e-4)
    # characters: those of the predicted tokens (all of the text where the BOS comes first)
    chars = round(n * len(TEXT) / len(tok.encode(TEXT)))
    assert got["chars"] == chars
    assert got["bpc"] == pytest.approx(loss * n / chars / math.log(2), rel=1e-4)
    assert ("BOS" in got["data"]) == (leading_bos(tok) is not None)

    # params: the architecture and its parts
    first = run_cli(capsys, "params", "--model", m).splitlines()[0]
    cfg = model.config
    assert LABEL[arch] in first and f"L={cfg.n_layer}" in first
    if cfg.sliding_window:
        assert f"sliding window {cfg.sliding_window}" in first
    if cfg.nope_layers:  # SmolLM3's fourth layer
        assert f"no positions in {len(cfg.nope_layers)} of {cfg.n_layer} layers (NoPE)" in first
    if cfg.rope_scaling:  # Llama 3.1's, from the file's rope_freqs
        assert f"rope scaling {cfg.rope_scaling['rope_type']}" in first
    if cfg.d_head and cfg.d_head * cfg.n_head != cfg.n_embd:  # Qwen3's, Mistral Nemo's heads
        assert f"d_head={cfg.d_head}" in first

    # lens: the last layer's best token at each position is the model's own argmax
    lens = json.loads(run_cli(capsys, "lens", "--model", m, PROMPT, "--json"))
    enc = lens["ids"]  # the BOS first where the tokenizer adds one
    assert enc == ([leading_bos(tok)] if leading_bos(tok) is not None else []) + tok.encode(PROMPT)
    with torch.no_grad():
        best = model(torch.tensor([enc])).logits[0].argmax(-1).tolist()
    assert lens_last_row(lens) == best

    # attention: a grid of every layer and head; windowed layers labelled local / global
    png = tmp_path / "a.png"
    out = run_cli(capsys, "attention", "--model", m, PROMPT, "--out", png)
    assert f"{cfg.n_layer} layer(s) x {cfg.n_head} head(s)" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    from attnlm.inspect.record import inspect

    assert inspect(model, tok, PROMPT).ids == enc  # what attention reads: the lens' ids
    from attnlm.cli.inspect import layer_labels

    kinds = layer_labels(model) or []
    if arch in ("gemma2", "gemma3", "olmo3", "gptoss"):
        assert "local" in kinds and "global" in kinds
        from attnlm.cli.inspect import select_panels

        maps = [torch.zeros(cfg.n_head, 2, 2)] * cfg.n_layer
        titles = [t for row in select_panels(maps, None, 0, kinds) for t, _ in row]
        g = kinds.index("global")
        assert titles[g] == f"layer {g} (global) head 0" and titles[0] == "layer 0 (local) head 0"
    else:
        assert not kinds or set(kinds) == {"global"}


def lens_last_row(doc: dict) -> list[int]:
    """The last layer's top-1 id at each position of ``attnlm lens --json``."""
    return [cell[0]["id"] for cell in doc["layers"][-1]["positions"]]


@pytest.mark.parametrize(
    ("arch", "template", "system"),
    [("qwen2", QWEN_TEMPLATE, "You are Qwen, created by Alibaba Cloud"),
     ("gemma3", GEMMA_TEMPLATE, None)],
)  # fmt: skip
def test_chat_with_the_models_template(arch, template, system, loaded, capsys):
    """``attnlm chat``: Qwen's template adds its system default; Gemma's writes the BOS
    itself and the prompt holds it once. The reply is the library's greedy decode of the
    rendering."""
    from attnlm.tokenizers import chat_template

    model, tok = loaded(arch)
    out = run_cli(capsys, "chat", "--model", fixture(arch), *weights_args(arch),
                  "--template", template, "--message", "Hi", "--max-new-tokens", "6",
                  "--temperature", "0", "--json")  # fmt: skip
    got = json.loads(out)
    tpl = chat_template.from_file(template, {"bos_token": tok.tokens[tok.bos_id]})
    rendered = tpl.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    if system is not None:
        assert system in rendered
    ids = special_encoder(tok)(rendered)
    if leading_bos(tok) is not None:
        assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert got["prompt_tokens"] == len(ids)
    (want,) = decode(model, [ids], SamplingConfig(temperature=0, max_new_tokens=6))
    assert got["tokens"] == list(want)[: len(got["tokens"])]


def test_windows_put_the_bos_first():
    ids = np.arange(10, 20)
    w = Windows(ids, 4, bos=1)
    batches = list(w.sequential(8))
    xs = [x.tolist() for x, _ in batches]
    ys = [y.tolist() for _, y in batches]
    # every token of the text is a target once; each window starts with the BOS
    assert xs == [[[1, 10, 11, 12], [1, 14, 15, 16]], [[1, 18]]]
    assert ys == [[[10, 11, 12, 13], [14, 15, 16, 17]], [[18, 19]]]
    assert w.n_eval_batches(8) == 2
    x, y = w.batch(torch.tensor([6]))
    assert x.tolist() == [[1, 16, 17, 18]] and y.tolist() == [[16, 17, 18, 19]]
    assert w.n_starts == 7  # starts 0..6
    plain = list(Windows(ids, 4).sequential(8))  # without: as before
    assert [y.tolist() for _, y in plain] == [[[11, 12, 13, 14], [15, 16, 17, 18]], [[19]]]


def test_leading_bos_follows_the_tokenizer(loaded):
    _, gemma = loaded("gemma3")
    assert leading_bos(gemma) == gemma.bos_id
    _, qwen = loaded("qwen3")
    assert leading_bos(qwen) is None


def test_eval_windows_with_bos_match_the_direct_sum(loaded, tmp_path):
    """Several windows (a block of 16 tokens): each starts with the BOS; the summed loss is
    the direct computation's, window by window."""
    from attnlm.loading.evaluation import evaluate_ids

    model, tok = loaded("gemma3")
    ids = np.asarray(tok.encode(TEXT), dtype=np.int64)
    bos = leading_bos(tok)
    got = evaluate_ids(model, ids, len(TEXT), 16, batch_size=3, bos=bos)
    total = 0.0
    for b in range(0, len(ids), 16):
        y = ids[b : b + 16].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([[bos] + y[:-1]])).logits[0].double()
        total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(y), reduction="sum"))
    assert got.tokens == len(ids)
    assert got.loss == pytest.approx(total / len(ids), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-0.5b-instruct"])
def test_eval_real_model_within_one_percent_of_llama_cpp(name, tmp_path, capsys):
    """``attnlm eval --model NAME`` on the text of llama.cpp's perplexity reference
    (tests/fixtures/real_models, benchmarks/make_real_model_fixtures.py: the first 1,000 ids
    of the text in one context of 1,024, the BOS first for Gemma, tokens 1..999 scored).
    attnlm puts the BOS first in its window too where the tokenizer adds one (Gemma) and then
    predicts every text token, so ``--max-tokens 999`` (Gemma) or ``1000`` (Qwen, the first
    token context only) scores the same 999 tokens given the same contexts (one window)."""
    from support_real import needs_arch, real_file, references

    needs_arch(name)
    real_file(name, fetch=True)
    ref = references()["perplexity"]
    want = ref["files"][name]
    bos = want["settings"]["add_bos"]
    text = tmp_path / "text.txt"
    text.write_text(ref["text"], encoding="utf-8")
    n = want["n_predicted"]
    out = run_cli(capsys, "eval", "--model", name, "--text", text, "--max-tokens",
                  n if bos else n + 1, "--batch-size", "1", "--json")  # fmt: skip
    got = json.loads(out)
    assert got["tokens"] == n and ("BOS (id 2) first" in got["data"]) == bos
    assert got["ppl"] == pytest.approx(want["perplexity"], rel=0.01)


def request(url: str, body: dict | None = None) -> tuple[int, dict]:
    """(status, JSON) of a GET or POST to the explorer."""
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, json.loads(r.read())


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_explorer_model_endpoints(arch, loaded):
    """``attnlm serve --model FILE.gguf``'s service: models, attention, generate, lens."""
    from attnlm.inspect.record import inspect
    from attnlm.web import server as S
    from attnlm.web.service import resolve_named_model

    model, tok = loaded(arch)
    srv = S.make_server([resolve_named_model(str(fixture(arch)))], "127.0.0.1", 0)
    S.serve_in_thread(srv)
    try:
        _, data = request(srv.url + "api/models")
        (info,) = data["models"]
        cfg = model.config
        assert (info["n_layer"], info["n_head"]) == (cfg.n_layer, cfg.n_head)
        name = info["name"]
        status, data = request(srv.url + "api/attention", {"text": PROMPT, "model": name})
        got = torch.tensor(data["attention"])  # (L, H, T, T)
        want = torch.stack(inspect(model, tok, PROMPT).attentions)
        assert status == 200 and got.shape == want.shape
        assert torch.allclose(got, want, atol=2e-5)
        body = {"text": PROMPT, "temperature": 0, "max_new_tokens": 6, "model": name}
        status, data = request(srv.url + "api/generate", body)
        ids = special_encoder(tok)(PROMPT)
        (expected,) = decode(model, [ids], SamplingConfig(temperature=0, max_new_tokens=6))
        assert status == 200 and data["continuation"] == tok.decode(expected)
        status, data = request(srv.url + "api/lens", {"text": PROMPT, "model": name})
        assert status == 200 and data
        # the page's tokens are the ids the model sees: the BOS first where the file asks
        status, data = request(srv.url + "api/tokens", {"text": PROMPT, "model": name})
        assert status == 200 and data["ids"] == special_encoder(tok)(PROMPT)
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_export_hf_folder_opens_in_transformers(arch, tmp_path, capsys):
    """``attnlm export --model FILE.gguf --out DIR``: transformers loads the folder (model and
    tokenizer) and gives the float32 model's logits and ids."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    out = tmp_path / "hf"
    run_cli(capsys, "export", "--model", fixture(arch), "--out", out)
    ck = load_model_ref(None, fixture(arch), torch.device("cpu"), "f32")
    ids = special_encoder(ck.tokenizer)(TEXT)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok(TEXT)["input_ids"] == ids
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ck.model.eval()(torch.tensor([ids])).logits[0]
        got = hf(torch.tensor([ids])).logits[0]
    span = float(want.max() - want.min())
    assert float((got - want).abs().max()) <= 1e-4 * span


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_export_hf_folder_reads_back_in_attnlm(arch, tmp_path, capsys):
    """attnlm reads its exported folder back (SentencePiece-style vocabularies as ``hf-spm``):
    ``eval`` gives the file's numbers, the BOS first where the file's tokenizer adds one; the
    folder exports on with the same tokenizer."""
    out = tmp_path / "hf"
    run_cli(capsys, "export", "--model", fixture(arch), "--out", out)
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    b = json.loads(run_cli(capsys, "eval", "--model", fixture(arch), "--weights", "f32",
                           "--text", text, "--json"))  # fmt: skip
    a = json.loads(run_cli(capsys, "eval", "--model", out, "--text", text, "--json"))
    assert a["tokens"] == b["tokens"] and ("BOS" in a["data"]) == ("BOS" in b["data"])
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    again = tmp_path / "hf-again"
    run_cli(capsys, "export", "--model", out, "--out", again)
    from tokenizers import Tokenizer

    first, second = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (out, again))
    assert second.encode(TEXT).ids == first.encode(TEXT).ids
    assert json.loads((again / "tokenizer_config.json").read_text()).get("add_bos_token") == (
        json.loads((out / "tokenizer_config.json").read_text()).get("add_bos_token")
    )


def eval_loss(capsys, model: Path | str, text: Path) -> float:
    return json.loads(run_cli(capsys, "eval", "--model", model, "--text", text, "--json"))["loss"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_train_init_from_lora_and_export_gguf(arch, tmp_path, capsys):
    """``train --init-from FILE.gguf`` and ``--lora 4`` lower the loss on their text and the
    runs load back (eval, generate); ``export --gguf`` of the trained run is read back by
    attnlm with the run's logits."""
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 20, encoding="utf-8")
    before = eval_loss(capsys, fixture(arch), text)
    common = ["--text", text, "--block-size", "32", "--batch-size", "4", "--eval-iters", "1",
              "--no-progress", "--lr", "1e-3", "--max-iters", "12"]  # fmt: skip
    full, lora = tmp_path / "full", tmp_path / "lora"
    run_cli(capsys, "train", "--init-from", fixture(arch), "--out", full, *common)
    run_cli(capsys, "train", "--init-from", fixture(arch), "--lora", "4", "--out", lora, *common)
    for run in (full, lora):
        after = eval_loss(capsys, run, text)
        assert after < before - 0.01, (run.name, before, after)
        out = run_cli(capsys, "generate", "--model", run, "--prompt", PROMPT,
                      "--max-new-tokens", "4", "--temperature", "0")  # fmt: skip
        assert out.startswith(PROMPT)

    gguf = tmp_path / "full.gguf"
    run_cli(capsys, "export", "--model", full, "--gguf", gguf, "--type", "f32")
    ck = load_model_ref(None, full, torch.device("cpu"))
    back = load_model_ref(None, gguf, torch.device("cpu"), "f32")
    ids = torch.tensor([special_encoder(ck.tokenizer)(TEXT)])
    assert special_encoder(back.tokenizer)(TEXT) == ids[0].tolist()
    with torch.no_grad():
        want, got = ck.model.eval()(ids).logits[0], back.model.eval()(ids).logits[0]
    span = float(want.max() - want.min())
    assert float((got - want).abs().max()) <= 1e-4 * span
