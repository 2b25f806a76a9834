"""Evaluation for every objective: nats and bits per target token, perplexity, accuracy, and
bits per character where characters are defined.

Everything is computed from summed losses: each batch's ``loss_sum`` and ``n_targets`` (from
the model's output) are added up, so batches with different numbers of targets (masked LM,
sentence pairs) weigh every target equally. Bits per character = total nats / characters /
ln 2, which puts character-level, word-level and BPE models (and the n-gram baselines) on one
scale; for a causal LM the characters counted are those of the predicted tokens.

:func:`evaluate` walks a split so every target is predicted exactly once; :func:`estimate`
averages a fixed set of random batches (the quick check during training).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from attnlm.base.device import autocast, eval_mode
from attnlm.base.errors import InputError
from attnlm.data.corpus import DEFAULT_VAL_FRACTION
from attnlm.data.windows import bits_per_char
from attnlm.loading.objectives import BatchSource, make_objective
from attnlm.models.base import IGNORE_INDEX


@dataclass(frozen=True)
class EvalResult:
    """Loss in nats per target, perplexity, bits per character (None where characters are
    not defined), bits per target token, accuracy of the argmax, and what was counted."""

    loss: float
    ppl: float
    bpc: float | None
    tokens: int
    chars: int
    bits_per_token: float = 0.0
    accuracy: float | None = None
    # tokens of the text that are <unk> (characters the vocabulary lacks); None: no <unk> id
    unknown: int | None = None

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)

    def format(self) -> str:
        bpc = f"{self.bpc:.4f} bits/char" if self.bpc is not None else "bits/char n/a"
        acc = f" | accuracy {self.accuracy:.2%}" if self.accuracy is not None else ""
        return (
            f"loss {self.loss:.4f} nats/token | perplexity {self.ppl:.3f} | "
            f"{bpc}{acc} ({self.tokens:,} tokens, {self.chars:,} chars)"
        )


def result_from_sums(
    total_nats: float, targets: int, chars: int | None, correct: int | None = None
) -> EvalResult:
    """An :class:`EvalResult` from summed nats over ``targets`` targets and ``chars``
    characters (None: bits per character undefined)."""
    loss = total_nats / max(targets, 1)
    return EvalResult(
        loss=loss,
        ppl=math.exp(min(loss, 700.0)),
        bpc=None if chars is None else bits_per_char(total_nats, chars),
        tokens=targets,
        chars=chars or 0,
        bits_per_token=loss / math.log(2),
        accuracy=None if correct is None else correct / max(targets, 1),
    )


class Sums:
    """Running sums of one evaluation: nats, targets and correct argmax predictions."""

    def __init__(self) -> None:
        self.nats, self.targets, self.correct = 0.0, 0, 0
        self.has_accuracy = True

    def add(self, model: torch.nn.Module, batch: dict, device: torch.device, dtype: str) -> None:
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device, dtype):
            out = model(**batch)
        self.nats += float(out.loss_sum.float())
        self.targets += int(out.n_targets)
        targets = batch["targets"]
        keep = targets != IGNORE_INDEX
        if out.logits is not None and out.logits.shape[:-1] == targets.shape:
            self.correct += int((out.logits.argmax(-1).eq(targets) & keep).sum())
        elif out.logits is not None and out.logits.dim() == 2 and len(out.logits) == out.n_targets:
            # logits only at the counted targets (N, V), in order (e.g. BERT's masked LM)
            self.correct += int(out.logits.argmax(-1).eq(targets[keep]).sum())
        else:
            self.has_accuracy = False

    def result(self, chars_per_target: float | None) -> EvalResult:
        chars = None if chars_per_target is None else round(self.targets * chars_per_target)
        return result_from_sums(
            self.nats, self.targets, chars, self.correct if self.has_accuracy else None
        )


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    source: BatchSource,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    progress: Any = None,
) -> EvalResult:
    """Exact loss over every target of ``source`` (each predicted once)."""
    device = torch.device(device)
    sums = Sums()
    with eval_mode(model):
        for batch in source.sequential(batch_size):
            sums.add(model, batch, device, dtype)
            if progress is not None:
                progress.update(1)
    return sums.result(source.chars_per_target)


@torch.no_grad()
def estimate(
    model: torch.nn.Module,
    source: BatchSource,
    batches: int,
    batch_size: int,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
) -> EvalResult:
    """Loss over ``batches`` random batches, the same batches on every call (fixed seed)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    sums = Sums()
    with eval_mode(model):
        for _ in range(batches):
            sums.add(model, source.sample(batch_size, gen), device, dtype)
    return sums.result(source.chars_per_target)


def evaluate_ids(
    model: torch.nn.Module,
    ids: np.ndarray,
    n_chars: int | None,
    block_size: int,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    objective: Any = None,
    progress: Any = None,
    bos: int | None = None,
) -> EvalResult:
    """Exact evaluation of a model on a token array (``n_chars`` characters of text) under
    its family's objective (causal by default); ``bos``: a causal model's windows each start
    with this token and every token of ``ids`` is predicted (:func:`leading_bos`)."""
    if objective is None:
        from attnlm.models.registry import family_of

        try:
            name = family_of(model).objective
        except Exception:  # noqa: BLE001 - an unregistered module: a plain causal LM
            name = "causal"
        objective = make_objective(name, None, getattr(model, "config", None))
    cpt = None if n_chars is None else n_chars / max(len(ids), 1)
    more = {"bos": bos} if bos is not None and getattr(objective, "name", None) == "causal" else {}
    source = objective.source(np.asarray(ids), cpt, block_size, **more)
    return evaluate(model, source, batch_size, device, dtype, progress)


def bos_windows(objective: Any, tokenizer: Any) -> dict[str, int]:
    """``{"bos": id}`` for a causal objective whose tokenizer puts a BOS before a text
    (:func:`leading_bos`: Gemma, Llama 3), else ``{}``: the keyword arguments of its
    ``source`` that make every window start with it, in training as in evaluation."""
    if getattr(objective, "name", None) != "causal":
        return {}
    bos = leading_bos(tokenizer)
    return {} if bos is None else {"bos": bos}


def leading_bos(tokenizer: Any) -> int | None:
    """The BOS id a tokenizer puts before a text it encodes with its default special tokens
    (:func:`attnlm.tokenizers.base.special_encoder`: a GGUF file's ``add_bos_token``, a
    ``tokenizer.json`` post-processor), else None. Such a model (Gemma) is evaluated as
    llama.cpp's perplexity does: the BOS first in every window."""
    from attnlm.tokenizers.base import special_encoder

    bos = getattr(tokenizer, "bos_id", None)
    if bos is None or getattr(tokenizer, "add_bos", None) is False:
        return None
    probe = "a b"
    try:
        plain, full = list(tokenizer.encode(probe)), special_encoder(tokenizer)(probe)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot say: no BOS
        return None
    return int(bos) if full[:1] == [bos] and plain[:1] != [bos] else None


def _encode_prefix(tokenizer: Any, text: str, what: str, max_tokens: int) -> tuple[Any, int]:
    """The ids of a prefix of ``text`` holding at least ``max_tokens`` tokens (or all of it)
    and its length in characters: the text is encoded in pieces
    (:func:`attnlm.tokenizers.factory.iter_encode_spans`) until enough tokens are there."""
    from attnlm.tokenizers.factory import iter_encode_spans

    chunk = max(4096, 2 * max_tokens)
    ids: list[int] = []
    n_chars = 0
    for begin, stop, piece in iter_encode_spans(tokenizer, text, what, chunk_chars=chunk):
        ids += piece
        n_chars += stop - begin
        if len(ids) >= max_tokens:
            break
    return ids, n_chars


def _eval_data(
    ck: Any, text_path: str | None, split: str | None
) -> tuple[np.ndarray | None, int | None, str | None, str]:
    """``(ids, n_chars, text, what)``: what :func:`evaluate_checkpoint` evaluates on, and its
    description: the run's ``val.bin`` (``ids``, a memmap, and its characters; ``text`` None)
    or a text to encode (``ids`` and ``n_chars`` None)."""
    from attnlm.data.corpus import load_text, split_text
    from attnlm.data.windows import read_token_file

    val_fraction = float(ck.train_config.get("val_fraction", DEFAULT_VAL_FRACTION))
    ids, n_chars, text = None, None, None
    if text_path is None:
        val_bin = ck.path.parent / "val.bin"
        if ck.path.name.startswith("checkpoint") and val_bin.is_file():
            tf = read_token_file(val_bin)
            ids, n_chars = tf.open(), tf.n_chars  # a memmap: only the part used is read
            what = f"validation split of the training text ({val_bin})"
        else:
            source = ck.train_config.get("text")
            _, text = split_text(load_text(source), val_fraction)
            what = f"validation split of {source or 'the default corpus'}"
    else:
        text = load_text(text_path)
        what = str(text_path)
        if split == "val":
            _, text = split_text(text, val_fraction)
            what = f"validation split of {text_path}"
    return ids, n_chars, text, what


def _eval_ids(
    tokenizer: Any,
    ids: np.ndarray | None,
    n_chars: int | None,
    text: str | None,
    what: str,
    max_tokens: int | None,
) -> tuple[np.ndarray, int, str]:
    """``(ids, n_chars, what)``: the ids to evaluate (``text`` encoded when ``ids`` is None),
    cut to the first ``max_tokens``, with their characters and the description saying so."""
    from attnlm.tokenizers import encode_text

    if ids is None:
        _check_alphabet(tokenizer, text if max_tokens is None else text[: max_tokens + 1], what)
    if ids is None and max_tokens is not None:
        ids, n_chars = _encode_prefix(tokenizer, text, what, max_tokens)
    elif ids is None:
        ids = np.asarray(encode_text(tokenizer, text, what), dtype=np.int64)
        n_chars = len(text)
    if max_tokens is not None and max_tokens < len(ids):
        n_chars = round(n_chars * max_tokens / len(ids))
        ids = ids[:max_tokens]
    if max_tokens is not None:
        what += f" (first {min(max_tokens, len(ids)):,} tokens)"
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) < 2:
        raise InputError(f"{what}: too short to evaluate (need at least 2 tokens)")
    return ids, n_chars, what


def evaluate_checkpoint(
    checkpoint: str,
    text_path: str | None = None,
    split: str | None = None,
    batch_size: int = 16,
    max_tokens: int | None = None,
    device: str = "auto",
    model: str | None = None,
    weights: str | None = None,
) -> tuple[EvalResult, str]:
    """Evaluate a checkpoint on text; returns the result and a description of the data.

    With ``text_path``: the whole text (``split="all"``, default) or its validation split.
    Without: the run's validation split (``val.bin`` beside the checkpoint when present,
    otherwise the training text named in the checkpoint's config, split again).
    ``model``: a pretrained name or Hugging Face folder instead of ``checkpoint``
    (:func:`attnlm.loading.sources.load_model_ref`); ``weights``: its weight format
    (:mod:`attnlm.quant`).
    """
    from attnlm.base.device import resolve_device
    from attnlm.loading.sources import load_model_ref

    if max_tokens is not None and max_tokens < 2:
        raise InputError(f"--max-tokens must be at least 2, got {max_tokens}")
    dev = resolve_device(device)
    ck = load_model_ref(checkpoint, model, dev, weights)
    objective = make_objective(ck.family.objective, ck.tokenizer, ck.model_config)
    if getattr(objective, "data", "text") != "text":
        raise InputError(
            f"{ck.path}: a {ck.family.type} model is evaluated on sentence pairs, not text"
        )
    block = int(ck.model_config.block_size)
    ids, n_chars, text, what = _eval_data(ck, text_path, split)
    ids, n_chars, what = _eval_ids(ck.tokenizer, ids, n_chars, text, what, max_tokens)
    bos = leading_bos(ck.tokenizer) if getattr(objective, "name", "") == "causal" else None
    if bos is not None:
        what += f"; BOS (id {bos}) first in every window, every token predicted, as llama.cpp"
    result = evaluate_ids(
        ck.model, ids, n_chars, block, batch_size, dev, objective=objective, bos=bos
    )
    unk_id = getattr(ck.tokenizer, "unk_id", None)
    if unk_id is not None:
        result = replace(result, unknown=int(np.count_nonzero(ids == unk_id)))
    return result, what


def _check_alphabet(tokenizer: Any, text: str, what: str) -> None:
    """A character tokenizer without ``<unk>`` cannot encode characters its corpus lacked:
    say how many the text has, which, and how to train a run that maps them to ``<unk>``."""
    chars = getattr(tokenizer, "chars", None)
    if chars is None or getattr(tokenizer, "unk", True):
        return
    known = set(chars)
    unseen = [c for c in text if c not in known]
    if unseen:
        distinct = sorted(set(unseen))
        shown = " ".join(repr(c) for c in distinct[:10]) + (" ..." if len(distinct) > 10 else "")
        raise InputError(
            f"{what}: {len(unseen):,} characters ({len(distinct)} distinct: {shown}) are not in "
            "the run's character vocabulary; train with --unk (or --set train.unk=true) to "
            "evaluate them as <unk>"
        )


PAIR_SPLITS = ("all", "val", "test")  # --split of a translation checkpoint


def held_out_pairs(
    ck: Any, pairs_path: str | None = None, split: str | None = None
) -> tuple[list, str]:
    """The pairs a sentence-pair checkpoint is evaluated on, and a description.

    ``split`` None: every pair of ``pairs_path`` when one is given, else the run's test split.
    Without ``pairs_path``, ``"test"`` / ``"val"`` are the run folder's stored splits
    (``pairs/test.tsv``, ``pairs/valid.tsv`` beside the checkpoint; when the checkpoint has no
    run folder, the split of the pairs it was trained on under its split settings) and
    ``"all"`` is every pair of the file the run trained on. With ``pairs_path``, ``"all"`` is
    every pair of it and ``"test"`` / ``"val"`` its split under the run's split settings."""
    from attnlm.data.pairs import RUN_PAIRS_DIR, RUN_SPLIT_SEED, read_pairs, split_pairs
    from attnlm.data.tasks import load_pairs

    if split is not None and split not in PAIR_SPLITS:
        raise InputError(f"--split must be one of {', '.join(PAIR_SPLITS)}, got {split!r}")
    split = split or ("all" if pairs_path is not None else "test")
    name = {"val": "valid", "test": "test"}.get(split, "")
    stored = ck.path.parent / RUN_PAIRS_DIR / f"{name}.tsv"
    source = pairs_path if pairs_path is not None else ck.train_config.get("pairs")
    label = source or "the built-in task"
    if split == "all":
        pairs, _ = load_pairs(source)
        what = f"every pair of {label}"
    elif pairs_path is None and ck.path.name.startswith("checkpoint") and stored.is_file():
        pairs = read_pairs(stored, header=False)[0] if stored.stat().st_size else []
        what = f"{'validation' if split == 'val' else 'test'} split of the run ({stored})"
    else:
        every, _ = load_pairs(source)
        parts = split_pairs(
            every,
            valid=float(ck.train_config.get("val_fraction", DEFAULT_VAL_FRACTION)),
            test=float(ck.train_config.get("test_fraction", 0.1)),
            seed=RUN_SPLIT_SEED,
        )
        pairs = parts.valid if split == "val" else parts.test
        what = f"{'validation' if split == 'val' else 'test'} split of {label}"
    if not pairs:
        hint = " (is train.test_fraction 0? give --pairs FILE)" if split == "test" else ""
        raise InputError(f"{what}: no pairs to evaluate{hint}")
    return pairs, what


def evaluate_translation(
    checkpoint: str,
    pairs_path: str | None = None,
    num_beams: int = 1,
    batch_size: int = 64,
    max_new_tokens: int | None = None,
    device: str = "auto",
    limit: int | None = None,
    split: str | None = None,
) -> tuple[dict[str, Any], str]:
    """Translate with a sentence-pair checkpoint and score it: corpus BLEU and chrF
    (sacrebleu, :mod:`attnlm.loading.scores`; several references per source when the pairs have
    them) and the teacher-forced loss per target token, on every pair of ``pairs_path`` or
    the run's test split (``split`` as :func:`held_out_pairs`); ``limit``: the first ``limit``
    distinct sources only. Returns ``(scores, description)``."""
    from attnlm.base.device import resolve_device
    from attnlm.data.pairs import PairTokenizers, group_references
    from attnlm.generate.translate import translate
    from attnlm.loading.scores import translation_scores

    if limit is not None and limit < 1:
        raise InputError(f"--limit must be >= 1, got {limit}")
    dev = resolve_device(device)
    from attnlm.loading.sources import load_as_checkpoint  # a LoRA run too: its base + adapters

    ck = load_as_checkpoint(checkpoint, dev)
    if "translate" not in ck.family.capabilities:
        raise InputError(f"{ck.path}: a {ck.family.type} model does not translate")
    tok = ck.pair_tokenizers or PairTokenizers.from_tokenizers(ck.tokenizer)
    pairs, what = held_out_pairs(ck, pairs_path, split)
    sources, references = group_references(pairs)
    if limit is not None and limit < len(sources):
        keep = set(sources[:limit])
        sources, references = sources[:limit], references[:limit]
        pairs = [p for p in pairs if p.source in keep]
        what += f" (first {limit} sources)"
    hyps = translate(
        ck.model,
        tok,
        sources,
        num_beams=num_beams,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
    )
    scores = translation_scores(hyps, references)
    objective = make_objective(ck.family.objective, tok, ck.model_config)
    encoded = [(tok.encode_source(s), tok.tokens(t, "target")) for s, t in pairs]
    loss = evaluate(
        ck.model, objective.source(encoded, sum(len(t) + 1 for _, t in pairs)), batch_size, dev
    )
    scores.update(
        loss=loss.loss, ppl=loss.ppl, beams=num_beams, pairs=len(pairs),
        examples=[{"source": s, "hypothesis": h, "references": r}
                  for s, h, r in list(zip(sources, hyps, references))[:3]],
    )  # fmt: skip
    return scores, what
