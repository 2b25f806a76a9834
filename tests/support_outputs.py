"""The decoding-outputs table (``tests/fixtures/outputs/decode_outputs.json``): small
deterministic models of every family that decodes, the cases decoded on them, and the calls
that decode them. ``tests/fixtures/outputs/make_outputs.py`` records the table;
``tests/generate/test_outputs_table.py`` recomputes every row and compares. Both decode
through ``run_on_backend`` at the top of that test (the one place that says how a backend is
chosen).

Models are deterministic across machines and torch versions: every parameter is drawn from
numpy's PCG64 generator with a fixed seed (after ``torch.manual_seed``, which only fixes what
no parameter covers), scaled up from a typical initialisation so that logits spread over
several units and greedy picks are not decided by rounding (the script asserts a top-1 /
top-2 margin above :data:`MIN_MARGIN` at every greedy step).

A row is ``family/weights/backend/case``:

- families: ``gpt``, ``llama`` (weights ``f32``, ``q8``, ``q4``:
  :func:`attnlm.quant.layers.quantize_weights`), ``rnn`` (LSTM), ``ffnn``, ``hmm`` (generate),
  ``transformer``, ``rnn-seq2seq`` (translate), and ``llama-gguf``: a Llama GGUF file written
  with ``gguf.GGUFWriter`` (:func:`gguf_support.write_llama`) in ``q8`` (every matrix Q8_0) or
  ``q4`` (token embedding Q8_0, tied head, other matrices Q4_0 / Q4_1), the file the C engine
  decodes;
- backends: ``eager`` (PyTorch, the C step off), ``cstep`` (the C step inside the PyTorch
  model, the CPU default), ``compiled`` (``torch.compile``'s one-token step), ``engine`` (the
  C engine without PyTorch; ``llama-gguf`` only);
- cases: :data:`LM_CASES` (language models), :data:`TRANSLATE_CASES`, :data:`CLI_CASES`
  (``attnlm generate --json`` on the GGUF file: texts, not ids).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from attnlm.generate.options import DecodeOptions

MIN_MARGIN = 1e-3  # top-1 minus top-2 logit at every greedy step, asserted by the script
N_NEW = 24  # new tokens per row
V = 100  # vocabulary of the language models
V_PAIRS = 40  # target and source vocabulary of the translation models
V_GGUF = 300  # the GGUF file's vocabulary (GPT-2's 256 bytes, "Ġt", unused tokens)
SAMPLE = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7}

ONE = ((5, 17, 42, 8, 63, 21, 9),)
BATCH = ((5, 17, 42, 8, 63, 21, 9), (12, 3, 88, 41, 7, 19, 55, 2, 70, 33, 14), (60, 4, 27))
SOURCES = ((5, 17, 22, 8, 33, 21, 9), (12, 3, 28, 11, 7, 19, 35, 4, 30, 13, 14), (30, 4, 27))
GGUF_ONE = ((72, 101, 108, 108, 111, 256, 104, 101, 114, 101),)  # "Hello there"
GGUF_BATCH = (
    GGUF_ONE[0],
    (40, 41, 42, 43, 44, 45, 46, 47, 48, 49),
    (256, 104, 101, 32, 200, 7, 99, 3, 150, 63),
)
CLI_PROMPT = "Hello there"


@dataclass(frozen=True)
class Case:
    """One decode: ``kind`` ``decode`` (:func:`attnlm.generate.decode`), ``translate``
    (:func:`attnlm.generate.translate.translate_ids`, greedy or sampled), ``beam`` (its beam
    search, 3 beams) or ``cli`` (``attnlm generate`` with ``args``)."""

    name: str
    kind: str
    prompts: tuple = ()
    sample: bool = False
    max_new_tokens: int = N_NEW
    lookahead: int = 8
    args: tuple = ()

    @property
    def greedy(self) -> bool:
        return not self.sample

    def sampling(self):
        from attnlm.generate import SamplingConfig

        extra = SAMPLE if self.sample else {"temperature": 0.0}
        return SamplingConfig(max_new_tokens=self.max_new_tokens, **extra)


def lm_cases(one=ONE, batch=BATCH) -> list[Case]:
    """Greedy: one prompt (with lookahead drafts where the family has them, and without), a
    batch of prompts of different lengths, one prompt past a 64-position window (gpt crops and
    recomputes, llama slides); seeded sampling of the batch."""
    return [
        Case("greedy_one", "decode", one),
        Case("greedy_one_plain", "decode", one, lookahead=0),
        Case("greedy_batch", "decode", batch),
        Case("greedy_window", "decode", one, max_new_tokens=72),
        Case("sample_batch", "decode", batch, sample=True),
    ]


LM_CASES = lm_cases()
# the engine's rows advance together (prompts of one length) and never slide past the window
GGUF_CASES = [c for c in lm_cases(GGUF_ONE, GGUF_BATCH) if c.name != "greedy_window"]
TRANSLATE_CASES = [
    Case("greedy", "translate", SOURCES),
    Case("sample", "translate", SOURCES, sample=True),
    Case("beam", "beam", SOURCES),
]
CLI_CASES = [
    Case("cli_greedy", "cli", args=("--temperature", "0")),
    Case("cli_sample", "cli", sample=True, args=(
        "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "7",
        "--num-samples", "2")),
]  # fmt: skip

TABLES: dict[str, dict[str, Any]] = {
    "gpt": {"type": "gpt", "vocab_size": V, "block_size": 64, "n_layer": 2, "n_head": 4,
            "n_embd": 64, "d_ff": 128},
    "llama": {"type": "llama", "vocab_size": V, "block_size": 64, "n_layer": 2, "n_head": 4,
              "n_kv_head": 2, "n_embd": 64, "d_ff": 96},
    "rnn": {"type": "rnn", "vocab_size": V, "cell": "lstm", "n_layer": 2, "n_embd": 32},
    "ffnn": {"type": "ffnn", "vocab_size": V, "order": 4, "n_embd": 16, "n_hidden": 64},
    "hmm": {"type": "hmm", "vocab_size": V, "n_states": 16},
    "transformer": {"type": "transformer", "vocab_size": V_PAIRS, "d_model": 32, "n_head": 4,
                    "n_encoder_layers": 2, "n_decoder_layers": 2, "d_ff": 64, "dropout": 0.0,
                    "norm": "pre", "tie_output": False},
    "rnn-seq2seq": {"type": "rnn-seq2seq", "vocab_size": V_PAIRS, "cell": "gru", "d_emb": 16,
                    "d_hidden": 32},
}  # fmt: skip
# numpy seed; std of matrices (and of the HMM's logits), chosen for clear greedy margins
# and varied continuations (a random post-norm transformer with a tied head repeats one token),
# and small enough that no model is chaotic: at 1.0 the GRU's state grew a 1e-5 rounding
# difference (PyTorch's AVX2 kernels against its AVX-512 ones) to 14 logits in 22 steps
SEEDS = {"gpt": 11, "llama": 12, "rnn": 13, "ffnn": 14, "hmm": 25, "transformer": 16,
         "rnn-seq2seq": 17, "llama-gguf": 18}  # fmt: skip
STD = {"gpt": 0.3, "llama": 0.3, "rnn": 1.0, "ffnn": 1.0, "hmm": 2.0, "transformer": 0.3,
       "rnn-seq2seq": 0.6, "llama-gguf": 0.3}  # fmt: skip
GGUF_TYPES = {"q8": ("Q8_0",), "q4": ("Q8_0",) + ("Q4_0", "Q4_1") * 20}

LM_FAMILIES = ("gpt", "llama", "rnn", "ffnn", "hmm")
TRANSLATE_FAMILIES = ("transformer", "rnn-seq2seq")
DECODERS = ("gpt", "llama")  # the families the C step and torch.compile run


@dataclass(frozen=True)
class Row:
    family: str
    weights: str
    backend: str
    case: Case
    slow: bool = False
    needs_c: bool = False  # the C step or the C engine

    @property
    def key(self) -> str:
        return f"{self.family}/{self.weights}/{self.backend}/{self.case.name}"

    @property
    def group(self) -> str:
        """The rows that must give the same greedy output: one family, weights and case."""
        return f"{self.family}/{self.weights}/{self.case.name}"


def rows() -> list[Row]:
    """Every row of the table, in its order."""
    out = []
    for family in LM_FAMILIES:
        for weights in ("f32", "q8", "q4") if family in DECODERS else ("f32",):
            backends = ("eager", "cstep") if family in DECODERS else ("eager",)
            for case in LM_CASES:
                out += [Row(family, weights, b, case, needs_c=b == "cstep") for b in backends]
                if family in DECODERS and weights == "f32" and case.greedy and case.lookahead:
                    out.append(Row(family, weights, "compiled", case, slow=True))
    for family in TRANSLATE_FAMILIES:
        out += [Row(family, "f32", "eager", case) for case in TRANSLATE_CASES]
    for weights in GGUF_TYPES:
        for case in GGUF_CASES + CLI_CASES:
            for backend in ("eager", "cstep", "engine"):
                out.append(Row("llama-gguf", weights, backend, case, needs_c=backend != "eager"))
    return out


# -- the models ------------------------------------------------------------------------------


def draw(named: list[tuple[str, tuple[int, ...]]], seed: int, std: float) -> dict[str, np.ndarray]:
    """float32 values for named shapes, in order, from PCG64(``seed``): matrices N(0, std),
    norm gains 1 + N(0, 0.1), ``logits`` (the HMM) N(0, std), other vectors N(0, 0.05)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in named:
        norm = any(k in name for k in ("ln", "norm")) and name.endswith("weight")
        if len(shape) > 1 or name.endswith("logits"):
            values = rng.normal(0.0, std, size=shape)
        elif norm:
            values = 1.0 + rng.normal(0.0, 0.1, size=shape)
        else:
            values = rng.normal(0.0, 0.05, size=shape)
        out[name] = values.astype(np.float32)
    return out


def build(family: str, weights: str = "f32") -> torch.nn.Module:
    """A fresh model of ``family`` (eval mode), its weights in ``weights``."""
    from attnlm.models.registry import build as build_table
    from attnlm.quant.layers import quantize_weights

    torch.manual_seed(SEEDS[family])
    model, _, _ = build_table(TABLES[family])
    params = list(model.named_parameters())
    values = draw([(n, tuple(p.shape)) for n, p in params], SEEDS[family], STD[family])
    with torch.no_grad():
        for name, p in params:
            p.copy_(torch.from_numpy(values[name]))
    return quantize_weights(model.eval(), weights)


def gguf_state(c: SimpleNamespace) -> dict[str, np.ndarray]:
    """Hugging Face Llama weights (names, rotate-half order) drawn as :func:`draw` does."""
    n, f = c.hidden_size, c.intermediate_size
    kv = c.num_key_value_heads * n // c.num_attention_heads
    named = [("model.embed_tokens.weight", (c.vocab_size, n)), ("model.norm.weight", (n,))]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        named += [
            (p + "input_layernorm.weight", (n,)), (p + "post_attention_layernorm.weight", (n,)),
            (p + "self_attn.q_proj.weight", (n, n)), (p + "self_attn.k_proj.weight", (kv, n)),
            (p + "self_attn.v_proj.weight", (kv, n)), (p + "self_attn.o_proj.weight", (n, n)),
            (p + "mlp.gate_proj.weight", (f, n)), (p + "mlp.up_proj.weight", (f, n)),
            (p + "mlp.down_proj.weight", (n, f)),
        ]  # fmt: skip
    return draw(named, SEEDS["llama-gguf"], STD["llama-gguf"])


def write_gguf(folder: Path, weights: str) -> Path:
    """``folder/llama-{weights}.gguf``: a tiny Llama (2 layers, width 64, 4 heads, 2 key/value
    heads, SwiGLU 96, tied embeddings, 300 tokens, window 128) in the ggml types of
    :data:`GGUF_TYPES`, written by ``gguf.GGUFWriter`` as llama.cpp's converter lays it out."""
    from gguf_support import write_llama

    c = SimpleNamespace(
        vocab_size=V_GGUF, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
    )  # fmt: skip
    state = {k: torch.from_numpy(v) for k, v in gguf_state(c).items()}
    hf = SimpleNamespace(config=c, state_dict=lambda: state)
    path = Path(folder) / f"llama-{weights}.gguf"
    if not path.exists():
        write_llama(path, hf, types=GGUF_TYPES[weights], seed=SEEDS["llama-gguf"])
    return path


def load_gguf(path: Path) -> torch.nn.Module:
    """The GGUF file as a PyTorch model, through the resolver (``attnlm --model FILE``)."""
    from attnlm.loading.sources import resolve

    return resolve(str(path), "cpu").model.eval()


def source(row: Row, folder: Path) -> torch.nn.Module | Path:
    """What a row decodes: a fresh model, or the path of the GGUF file (written in ``folder``
    once)."""
    if row.family == "llama-gguf":
        return write_gguf(folder, row.weights)
    return build(row.family, row.weights)


# -- the calls -------------------------------------------------------------------------------


def run_case(model: torch.nn.Module, case: Case, compile: bool = False, process=None,
             runner=None) -> list:  # fmt: skip
    """``case`` through the PyTorch decoders' public API: the new ids of each row (translation:
    each output from the start token on, as :func:`translate_ids` returns it); ``runner``: the
    backend of a language model's decode (None: the planner's choice)."""
    from attnlm.generate import decode
    from attnlm.generate.translate import translate_ids

    prompts = [list(p) for p in case.prompts]
    if case.kind == "decode":
        options = DecodeOptions(lookahead=case.lookahead, compile=compile, runner=runner)
        return decode(model, prompts, case.sampling(), options, process=process)
    if case.kind == "beam":
        return translate_ids(model, prompts, num_beams=3, max_new_tokens=case.max_new_tokens)
    sampling = case.sampling()
    return translate_ids(model, prompts, sampling=sampling, max_new_tokens=case.max_new_tokens,
                         compile=compile)  # fmt: skip


def asked_weights(path: Path) -> str | None:
    """The ``--weights`` that holds a table's GGUF file (``llama-{weights}.gguf``) in the
    format its rows name on every backend: ``q8`` is asked for (by default the C engine keeps
    an all-Q8_0 file in its blocks and rounds the activations as llama.cpp does: other
    numbers than the PyTorch path's q8 layers), ``q4`` is the default."""
    return "q8" if Path(path).stem == "llama-q8" else None


def run_cli(path: Path, case: Case, backend: list | None = None) -> dict:
    """``attnlm generate --model FILE --prompt "Hello there" --json`` in this process (the
    command picks the engine or PyTorch itself; ``--weights`` per :func:`asked_weights`): the
    texts and the number of new tokens; ``backend`` (a list) receives the backend ``--json``
    names."""
    from attnlm.cli import main

    weights = asked_weights(path)
    argv = ["generate", "--model", str(path), "--prompt", CLI_PROMPT, "--json",
            "--threads", "1", "--device", "cpu", "--max-new-tokens", str(case.max_new_tokens),
            *(["--weights", weights] if weights else []), *case.args]  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    assert code == 0, f"attnlm {' '.join(argv)} exited {code}"
    record = json.loads(out.getvalue().strip().splitlines()[-1])
    if backend is not None:
        backend.append(record.get("backend"))
    return {"texts": record["texts"], "new_tokens": record["new_tokens"]}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, restored afterwards."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_table(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
