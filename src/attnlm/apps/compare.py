"""``attnlm compare``: every model family on one text, one tokenizer, one split, one budget.

The story of the lectures as one measurement: counts (a modified Kneser-Ney n-gram model),
a hidden Markov model (K hidden states, trained on the exact likelihood of the forward
algorithm), a feed-forward network over a fixed window (Bengio et al. 2003), recurrent
networks that carry a state (Elman RNN, LSTM, GRU), then attention (GPT, and Llama: GPT's
decoder with RMSNorm, SwiGLU, rotary positions and grouped-query attention).

What is shared:

* **data**: the tokenizer is built once (``char``, or ``bpe`` trained on the training split)
  and the corpus split once into ``OUT/data/``; every neural run folder starts from copies of
  those files, so all models see the same token ids;
* **budget**: each neural model trains for the same wall-clock ``budget`` (the trainer's
  ``time_budget``: the learning-rate schedule follows it); the n-gram model spends it on
  counting orders 2, 3, ... and keeps the order with the lowest validation bits per
  character (it stops when the budget is spent or a higher order stops helping);
* **score**: the first ``val_chars`` characters of the validation split, tokenized once.
  Every model predicts the same targets (every token of that text after the first) and the
  total nats are divided by the same number of characters (the targets' share of the text's
  characters, as :mod:`attnlm.loading.evaluation` counts them), so bits per character are comparable
  across tokenizers. The n-gram model is trained on the same token ids (each id is a "word")
  as one stream, with KenLM's sentence markers only around the whole text; the prediction of
  the first token and of the end marker are left out, so it is scored on exactly the targets
  and characters of the neural models. Neural models are evaluated exactly
  (:func:`attnlm.loading.evaluation.evaluate_ids`: causal windows for GPT, Llama, the feed-forward
  model and the HMM, contiguous streams with carried state for the recurrent ones).

Outputs in ``OUT``: one folder per model (run folder with checkpoint and ``metrics.jsonl``,
plus ``result.json`` once the model is done), ``compare.json`` (``{"rows": [{"model",
"params", "train_seconds", "tokens_per_second", "val_bpc", "ppl"}, ...]}`` plus the settings)
and ``compare.png`` (validation bits per character against training seconds: the trainer's
periodic estimates on random validation windows as a line, the exact final score as a star;
for the n-gram model one point per order). A model whose ``result.json`` matches the
settings is not trained again (resume); an interrupted neural run continues from its last
checkpoint.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnlm.apps.compare_report import write_outputs
from attnlm.base.errors import AttnlmError, ConfigError, InputError
from attnlm.base.fileio import atomic_path, atomic_write_text, output_lock

# model name in --models -> preset it trains (None: the n-gram baseline)
MODELS: dict[str, str | None] = {
    "ngram": None,
    "hmm": "hmm-char",
    "ffnn": "ffnn-char",
    "rnn": "rnn-char",
    "lstm": "lstm-char",
    "gru": "gru-char",
    "gpt": "shakespeare-char",
    "llama": "llama-char",
}
INIT_FROM = "init-from:"  # a --models entry "init-from:SPEC": SPEC fine-tuned on the text
DATA_FILES = ("tokenizer.json", "train.bin", "train.json", "val.bin", "val.json", "data.json")
RESULT_FILE = "result.json"
STARTED_FILE = "started.json"  # the signature a family's training was started with
MAX_ORDER = 10


@dataclass(frozen=True)
class CompareConfig:
    """Settings of one comparison (see the module docstring). ``budget``: wall-clock
    training time per model (``90s``, ``2m``); ``val_chars``: characters of the validation
    split every model is scored on; ``eval_interval``/``eval_iters``: the trainer's periodic
    validation estimates (the curves)."""

    text: str | None = None
    tokenizer: str = "char"
    budget: str = "90s"
    models: tuple[str, ...] = tuple(MODELS)
    out: str = "runs/compare"
    val_chars: int = 100_000
    bpe_vocab_size: int = 512
    device: str = "auto"
    threads: int = 1  # torch threads per model (0: torch's default); see docs/compare.md
    eval_interval: int = 100
    eval_iters: int = 10
    batch_size: int = 16  # evaluation batch size
    progress: bool = True
    max_order: int = MAX_ORDER
    overrides: dict[str, list[str]] = field(default_factory=dict)  # model -> --set overrides

    def __post_init__(self) -> None:
        from attnlm.train.config import parse_duration

        if self.tokenizer not in ("char", "bpe"):
            raise ConfigError(f"--tokenizer must be char or bpe, got {self.tokenizer!r}")
        unknown = [m for m in self.models if m not in MODELS and not init_spec(m)]
        if unknown or not self.models:
            raise ConfigError(
                f"unknown model(s) {', '.join(unknown) or '(none given)'} in --models "
                f"(known: {','.join(MODELS)}, and {INIT_FROM}SPEC for a pretrained model)"
            )
        if len(set(self.models)) != len(self.models):
            raise ConfigError("--models lists a model twice")
        parse_duration(self.budget)
        if self.val_chars < 2:
            raise ConfigError(f"--val-chars must be at least 2, got {self.val_chars}")
        if self.max_order < 2:
            raise ConfigError(f"--max-order must be at least 2, got {self.max_order}")

    @property
    def budget_s(self) -> float:
        from attnlm.train.config import parse_duration

        return parse_duration(self.budget)

    def signature(self, name: str | None = None) -> dict[str, Any]:
        """What model ``name``'s finished result depends on (resume reuses it only if equal):
        the shared settings and that model's own ``--set`` overrides (all of them without
        ``name``), so changing one model's preset value trains that model again, and only it."""
        overrides = self.overrides if name is None else {name: self.overrides.get(name, [])}
        return {
            "text": self.text,
            "tokenizer": self.tokenizer,
            "bpe_vocab_size": self.bpe_vocab_size,
            "budget_s": self.budget_s,
            "val_chars": self.val_chars,
            "max_order": self.max_order,
            "threads": self.threads,
            "eval_interval": self.eval_interval,
            "eval_iters": self.eval_iters,
            "overrides": {k: list(v) for k, v in sorted(overrides.items())},
        }


def init_spec(name: str) -> str | None:
    """The SPEC of a ``init-from:SPEC`` entry of ``--models`` (None for a family name)."""
    if name.startswith(INIT_FROM) and name[len(INIT_FROM) :].strip():
        return name[len(INIT_FROM) :].strip()
    return None


def model_folder(name: str) -> str:
    """The folder of a model in ``OUT`` (``init-from:org/name`` -> ``init-from-org-name``)."""
    return re.sub(r"[^\w.-]+", "-", name).strip("-")


@dataclass
class ModelResult:
    """One row of the table and its validation curve (``(seconds, bits/char)`` points)."""

    model: str
    params: int
    train_seconds: float
    tokens_per_second: float
    val_bpc: float
    ppl: float
    curve: list[tuple[float, float]] = field(default_factory=list)
    detail: str = ""

    def row(self) -> dict[str, Any]:
        keys = ("model", "params", "train_seconds", "tokens_per_second", "val_bpc", "ppl")
        return {k: getattr(self, k) for k in keys}


@dataclass
class SharedData:
    """The tokenizer, the prepared data folder and the scoring text's ids."""

    folder: Path
    tokenizer: Any
    val_ids: Any  # np.ndarray (N,)
    val_chars: int
    n_train_tokens: int
    val_text: str = ""  # the scored characters (a pretrained model encodes them itself)

    @property
    def n_targets(self) -> int:
        return len(self.val_ids) - 1

    @property
    def target_chars(self) -> int:
        """Characters the targets stand for, as :class:`attnlm.loading.evaluation.Sums` counts
        them."""
        return round(self.n_targets * self.val_chars / len(self.val_ids))


def prepare_shared(cfg: CompareConfig) -> SharedData:
    """Tokenize the corpus once into ``OUT/data`` and encode the scoring text."""
    import numpy as np

    from attnlm.data.corpus import DEFAULT_VAL_FRACTION, load_text, split_text
    from attnlm.tokenizers import encode_text
    from attnlm.train.config import TrainConfig
    from attnlm.train.data import prepare

    folder = Path(cfg.out) / "data"
    tc = TrainConfig(text=cfg.text, tokenizer=cfg.tokenizer, bpe_vocab_size=cfg.bpe_vocab_size)
    data = prepare(folder, tc)
    _, val_text = split_text(load_text(cfg.text), DEFAULT_VAL_FRACTION)
    val_text = val_text[: cfg.val_chars]
    ids = np.asarray(encode_text(data.tokenizer, val_text, "validation text"), dtype=np.int64)
    if len(ids) < 2:
        raise ConfigError("the validation text is too short to score (need 2 tokens)")
    return SharedData(folder, data.tokenizer, ids, len(val_text), data.train.n_tokens, val_text)


# -- the n-gram baseline ------------------------------------------------------------------------


def run_ngram(cfg: CompareConfig, shared: SharedData, log: Callable[..., Any]) -> ModelResult:
    """Modified Kneser-Ney on the training ids, order chosen on the scoring text."""
    import warnings

    import numpy as np

    from attnlm.data.windows import read_token_file
    from attnlm.ngram import DiscountWarning
    from attnlm.ngram import train as train_ngram

    train_ids = np.asarray(read_token_file(shared.folder / "train.bin").open())
    words = [[str(i) for i in train_ids.tolist()]]
    val = [[str(i) for i in shared.val_ids.tolist()]]
    budget, t0 = cfg.budget_s, time.perf_counter()
    best: tuple[float, int, int, float] | None = None  # (bits/char, order, n-grams, nats)
    curve, last_cost, orders = [], 0.0, 0
    for order in range(2, cfg.max_order + 1):
        spent = time.perf_counter() - t0
        if orders and spent + 1.2 * last_cost > budget:
            break
        t1 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DiscountWarning)  # tiny texts: fixed discounts
            model = train_ngram(words, order)
        log10p, _ = model.sentence_logprobs(val)
        nats = -float(log10p[1:-1].sum()) * math.log(10)  # the same targets as the networks
        bpc = nats / shared.target_chars / math.log(2)
        last_cost = time.perf_counter() - t1
        orders += 1
        curve.append((time.perf_counter() - t0, bpc))
        log(f"ngram: order {order}: {bpc:.4f} bits/char ({last_cost:.1f}s)")
        if best is None or bpc < best[0]:
            best = (bpc, order, int(sum(model.counts())), nats)
        elif bpc > best[0]:
            break  # a higher order stopped helping
    assert best is not None
    seconds = time.perf_counter() - t0
    bpc, order, ngrams, nats = best
    return ModelResult(
        model="ngram",
        params=ngrams,
        train_seconds=round(seconds, 2),
        tokens_per_second=round(shared.n_train_tokens * orders / max(seconds, 1e-9), 1),
        val_bpc=round(bpc, 4),
        ppl=round(math.exp(nats / shared.n_targets), 4),
        curve=[(round(t, 2), round(b, 4)) for t, b in curve],
        detail=f"modified Kneser-Ney, order {order} (chosen on validation), n-grams = params",
    )


# -- neural models ------------------------------------------------------------------------------


def _run_spec(cfg: CompareConfig, name: str) -> Any:
    import dataclasses

    from attnlm.train.config import load_spec

    source = init_spec(name)
    if source is not None:  # a pretrained model, fine-tuned with its own tokenizer
        from attnlm.train.config import RunSpec, TrainConfig
        from attnlm.train.finetune import FINETUNE_TRAIN

        train0 = TrainConfig(**FINETUNE_TRAIN, init_from=source)  # type: ignore[arg-type]
        spec = RunSpec(model={}, train=train0, preset=name)
    else:
        preset = MODELS[name]
        assert preset is not None
        spec = load_spec(preset, cfg.overrides.get(name))
    train = dataclasses.replace(
        spec.train,
        text=cfg.text,
        tokenizer=cfg.tokenizer if source is None else spec.train.tokenizer,
        bpe_vocab_size=cfg.bpe_vocab_size,
        time_budget=f"{cfg.budget_s}s",
        max_iters=10**9,
        eval_interval=cfg.eval_interval,
        eval_iters=cfg.eval_iters,
        early_stop=0,
        progress=cfg.progress,
        device=cfg.device,
        threads=cfg.threads or spec.train.threads,
    )
    return dataclasses.replace(spec, train=train)


def _start_over(run_dir: Path, shared: SharedData, pretrained: bool, sig_text: str) -> None:
    """Empty ``run_dir`` for a new run: copies of the shared tokenizer and split (a pretrained
    model brings its own) and ``sig_text``, the settings it is started with."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    for f in DATA_FILES if not pretrained else ():  # the shared tokenizer and split
        with atomic_path(run_dir / f) as tmp:
            shutil.copy2(shared.folder / f, tmp)
    atomic_write_text(run_dir / STARTED_FILE, sig_text)


def _score(cfg: CompareConfig, ck: Any, shared: SharedData, device: Any, pretrained: bool) -> Any:
    """The exact evaluation of a trained checkpoint on the shared validation text (a pretrained
    model's in its own tokens and training window)."""
    from attnlm.loading.evaluation import evaluate_ids
    from attnlm.loading.objectives import make_objective

    objective = make_objective(ck.family.objective, ck.tokenizer, ck.model_config)
    val_ids, window = shared.val_ids, int(ck.model_config.block_size)
    if pretrained:  # the same characters, in the model's own tokens and training window
        import numpy as np

        from attnlm.tokenizers import encode_text

        val_ids = np.asarray(encode_text(ck.tokenizer, shared.val_text, "validation text"))
        window = int(ck.train_config.get("block_size") or window)
    return evaluate_ids(
        ck.model, val_ids, shared.val_chars, window, cfg.batch_size, device, objective=objective
    )


def run_neural(
    cfg: CompareConfig,
    name: str,
    shared: SharedData,
    log: Callable[..., Any],
    signature: dict[str, Any] | None = None,
) -> ModelResult:
    """Train one family for the budget in ``OUT/name`` and score it on the shared text."""
    from attnlm.base.device import resolve_device
    from attnlm.loading.checkpoint import CHECKPOINT_DIR, load_checkpoint
    from attnlm.models.base import count_params
    from attnlm.train.run import METRICS_FILE, train_run

    run_dir = Path(cfg.out) / model_folder(name)
    spec = _run_spec(cfg, name)
    pretrained = init_spec(name) is not None
    # a checkpoint is continued only if it was started with these settings on this content
    started = run_dir / STARTED_FILE
    sig = signature if signature is not None else cfg.signature(name)
    sig_text = json.dumps(sig, sort_keys=True)
    resume = (run_dir / CHECKPOINT_DIR).is_dir() and _read_or_none(started) == sig_text
    if not resume:
        _start_over(run_dir, shared, pretrained, sig_text)
    result = train_run(spec, run_dir, resume=resume, log=log)
    device = resolve_device(cfg.device)
    ck = load_checkpoint(run_dir, device)
    ev = _score(cfg, ck, shared, device, pretrained)
    records = []
    for line in (run_dir / METRICS_FILE).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # a line cut by a kill (fileio.append_line): skipped
            continue
    curve = [(r["elapsed"], r["val_bpc"]) for r in records if r.get("val_bpc") is not None]
    what = ck.family.describe(ck.model_config) if ck.family.describe else ck.family.type
    return ModelResult(
        model=name,
        params=count_params(ck.model),
        train_seconds=round(result.elapsed, 2),
        tokens_per_second=round(result.tokens_per_s, 1),
        val_bpc=round(float(ev.bpc), 4),
        ppl=round(ev.ppl, 4),
        curve=[(round(t, 2), round(b, 4)) for t, b in curve],
        detail=f"{what}; {result.step} steps",
    )


# -- the whole comparison -----------------------------------------------------------------------


def _read_or_none(path: Path) -> str | None:
    """The text of ``path`` (read by the bounded reader: ``/dev/zero`` costs one block), None
    when it is missing, ``""`` when it is not text (both: a result to compute again)."""
    from attnlm.base.fileio import read_file_text

    if not path.exists():
        return None
    try:
        return read_file_text(path, empty_ok=True)
    except AttnlmError:
        return ""


def _load_done(
    path: Path, signature: dict[str, Any], log: Callable[..., Any] = print
) -> ModelResult | None:
    """A family's finished result when it was made with ``signature``; None (run it again)
    when missing, made with other settings or content, or not a valid result (one line)."""
    text = _read_or_none(path)
    if text is None:
        return None
    try:
        data = json.loads(text, parse_constant=_no_constant)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("signature") != signature:
            return None
        res = dict(data["result"])
        res["curve"] = [(float(t), float(b)) for t, b in res.get("curve", [])]
        done = ModelResult(**res)
        numbers = [done.val_bpc, done.ppl, done.train_seconds, done.tokens_per_second]
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in numbers):
            raise ValueError("a number is not finite")
        return done
    except (ValueError, TypeError, KeyError) as e:
        log(f"{path}: not a valid result ({e}); running this model again")
        return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def corpus_content(cfg: CompareConfig) -> list[dict[str, Any]]:
    """Name, size and SHA-256 of every corpus file: a result is reused for the same content
    (a file rewritten with the same bytes included), never for other content at that path."""
    from attnlm.train.config import TrainConfig
    from attnlm.train.data import _corpus, corpus_fingerprint

    files = corpus_fingerprint(_corpus(TrainConfig(text=cfg.text)), content=True)
    return [{k: v for k, v in f.items() if k != "mtime_ns"} for f in files]  # content only


def run_compare(cfg: CompareConfig, log: Callable[..., Any] = print) -> list[ModelResult]:
    """Run (or resume) the comparison; writes ``compare.json`` and ``compare.png``. A
    family's earlier result is reused only when it was made with the same settings on the same
    corpus content (SHA-256); the folder is locked against a second writer."""
    out = Path(cfg.out)
    if str(cfg.out) == "":
        raise InputError("--out is empty: name the comparison's folder")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: is a file, expected the comparison's folder")
    with output_lock(out):
        return _run_compare_locked(cfg, out, log)


def _run_compare_locked(
    cfg: CompareConfig, out: Path, log: Callable[..., Any]
) -> list[ModelResult]:
    from tqdm.auto import tqdm

    corpus = corpus_content(cfg)
    signature = {n: {**cfg.signature(n), "corpus": corpus} for n in cfg.models}
    done = {
        n: _load_done(out / model_folder(n) / RESULT_FILE, signature[n], log) for n in cfg.models
    }
    # the corpus is read (and refused, one line) before any output or progress bar
    shared = prepare_shared(cfg) if None in done.values() else None
    results: list[ModelResult] = []
    bar = tqdm(total=len(cfg.models), desc="compare", disable=not cfg.progress, unit="model")
    say = bar.write if cfg.progress else log
    try:
        for name in cfg.models:
            done_file = out / model_folder(name) / RESULT_FILE
            res = done[name]
            if res is not None:
                say(f"{name}: already done in {done_file.parent} (val {res.val_bpc} bits/char)")
            else:
                bar.set_description(f"compare: {name}")
                assert shared is not None
                if name == "ngram":
                    res = run_ngram(cfg, shared, say)
                else:
                    res = run_neural(cfg, name, shared, say, signature[name])
                done_file.parent.mkdir(parents=True, exist_ok=True)
                payload = {"signature": signature[name], "result": asdict(res)}
                atomic_write_text(done_file, json.dumps(payload, indent=1))
                say(f"{name}: {res.val_bpc:.4f} bits/char in {res.train_seconds:.0f}s")
            results.append(res)
            bar.update(1)
    finally:
        bar.close()
    write_outputs(cfg, results)
    return results
