"""Inside a decoder: ``attnlm trace`` (the named activations), ``patch`` (activation patching),
``attribute`` (direct logit attribution), ``heads`` (induction and other head scores) and
``ablate`` (a head's effect on the next token). Each experiment prints a table, or ``--json``,
and ``--out`` draws it (:mod:`attnlm.inspect.experiments`)."""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.validate import int_in_range, non_empty, output_file, positive_int
from attnlm.cli import common

_OUT = partial(common.option, "--out", default=None, metavar="FILE.png",
               type=common.arg(output_file), help="PNG to write")  # fmt: skip
_RUNTIME = partial(common.add_runtime_arguments, device="cpu")


def register(sub: argparse._SubParsersAction) -> None:
    common.add_command(
        sub, "trace", _trace,
        partial(common.add_literal_text_arguments, what="the text to run (with --hook)"),
        common.add_model_spec_argument,
        common.flag("--names", "list every activation name of the model and exit"),
        common.option("--hook", action="append", default=[], metavar="NAME",
                      type=common.arg(non_empty),
                      help="an activation to capture (repeatable; TransformerLens names)"),
        common.option("--save", default=None, metavar="FILE.npz", type=common.arg(output_file),
                      help="write the captured activations as NumPy arrays"),
        common.add_json_argument, _RUNTIME,
    )  # fmt: skip
    common.add_command(
        sub, "patch", _patch,
        common.add_model_spec_argument,
        common.option("--clean", required=True, type=common.text_value, metavar="TEXT"),
        common.option("--corrupt", required=True, type=common.text_value, metavar="TEXT",
                      help="the same number of tokens as --clean"),
        common.option("--answer", required=True, type=common.text_value, metavar="A",
                      help="the answer (the clean run's; its first token is scored)"),
        common.option("--wrong", required=True, type=common.text_value, metavar="B",
                      help="the corrupt run's answer"),
        common.add_json_argument, _OUT(), _RUNTIME,
    )  # fmt: skip
    common.add_command(
        sub, "attribute", _attribute,
        common.add_literal_text_arguments, common.add_model_spec_argument,
        common.option("--answer", required=True, type=common.text_value, metavar="A",
                      help="the answer (its first token is scored)"),
        common.add_json_argument, _OUT(), _RUNTIME,
    )  # fmt: skip
    common.add_command(
        sub, "heads", _heads,
        common.add_model_spec_argument,
        common.one_of(
            common.flag("--induction", "attention to the token after the earlier occurrence"),
            common.flag("--previous-token", "attention to the token just before"),
            common.flag("--duplicate-token", "attention to the earlier occurrence"),
            required=True,
        ),
        common.option("--length", type=common.arg(int_in_range, lo=2, hi=512), default=20,
                      help="random tokens, repeated once (default 20)"),
        common.option("--sequences", type=common.arg(int_in_range, lo=1, hi=256), default=8,
                      help="random sequences averaged (default 8)"),
        partial(common.add_seed_argument, default=0, help="the random tokens"),
        common.add_json_argument, _OUT(), _RUNTIME,
    )  # fmt: skip
    common.add_command(
        sub, "ablate", _ablate,
        common.add_literal_text_arguments, common.add_model_spec_argument,
        common.option("--head", action="append", required=True, metavar="L.H",
                      type=common.arg(non_empty),
                      help="a head: LAYER.HEAD, ablated (repeatable)"),
        common.flag("--mean", "replace the heads' outputs by their mean over the positions "
                    "(default: zero them)"),
        common.option("--top-k", type=common.arg(positive_int), default=10,
                      help="tokens shown (default 10)"),
        common.add_json_argument, _OUT(), _RUNTIME,
    )  # fmt: skip


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from attnlm.base.device import resolve_device
    from attnlm.loading.sources import resolve

    common.use_threads(args)
    # float32: the activations are the model's own numbers (a GGUF file's blocks dequantized)
    return resolve(args.model, resolve_device(args.device), "f32")


def _wrote(path: Any, as_json: bool) -> None:
    print(f"wrote {path}", file=sys.stderr if as_json else sys.stdout)


def _trace(args: argparse.Namespace) -> int:
    """the named activations of a decoder (TransformerLens names): list them, capture some

    --names lists every name; TEXT with --hook NAME (repeatable) runs the model once and
    prints each activation's shape and statistics (or --json), --save FILE.npz writes them."""
    from attnlm.inspect.trace import hook_names, trace

    model, tok, _ = _load(args)
    if args.names:
        print("\n".join(hook_names(model)))
        return 0
    text = common.literal_or_file(args)
    if not args.hook:
        raise InputError("name the activations to capture with --hook NAME (see --names)")
    result = trace(model, text, names=args.hook, tokenizer=tok)
    stats = {name: {"shape": list(t.shape), "mean": float(t.float().mean()),
                    "std": float(t.float().std()) if t.numel() > 1 else 0.0,
                    "max_abs": float(t.float().abs().max())}
             for name, t in result.items()}  # fmt: skip
    if args.save:
        _save_npz(result, args.save)
    if args.json:
        print(json.dumps({"tokens": [tok.decode([i]) for i in result.tokens[0].tolist()],
                          "activations": stats}, ensure_ascii=False))  # fmt: skip
    else:
        for name, s in stats.items():
            print(f"{name}  shape {tuple(s['shape'])}  mean {s['mean']:.4g}  std {s['std']:.4g}"
                  f"  max |x| {s['max_abs']:.4g}")  # fmt: skip
    if args.save:
        _wrote(args.save, args.json)
    return 0


def _save_npz(result: dict, path: Any) -> None:
    import io

    import numpy as np

    from attnlm.base.fileio import atomic_write_bytes

    buffer = io.BytesIO()
    np.savez(buffer, **{k: v.float().numpy() for k, v in result.items()})
    atomic_write_bytes(path, buffer.getvalue())


def _patch(args: argparse.Namespace) -> int:
    """activation patching: which layers, positions and heads carry the answer

    Runs the clean and the corrupt text (the same number of tokens), then puts the clean run's
    residual stream (each layer's input, at each position) and each head's output (all
    positions) into the corrupt run, one at a time (batched), and reports the fraction of the
    logit difference answer - wrong recovered: 1 = the clean run's, 0 = the corrupt run's."""
    from attnlm.inspect.experiments import patching

    model, tok, _ = _load(args)
    out = patching(model, tok, args.clean, args.corrupt, args.answer, args.wrong)
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(
            f"logit difference {args.answer!r} - {args.wrong!r}: clean "
            f"{out['clean_logit_diff']:.4f}, corrupt {out['corrupt_logit_diff']:.4f}"
        )
        print(
            _table("residual stream (rows: layer; columns: position)", out["resid"], out["tokens"])
        )
        print(_table("heads (rows: layer; columns: head)", out["heads"]))  # fmt: skip
    if args.out:
        _plot_patching(out, args.out)
        _wrote(args.out, args.json)
    return 0


def _plot_patching(out: dict, path: Any) -> None:
    from attnlm.inspect.heatmap import plot_grid

    plot_grid(
        out["resid"],
        path,
        title="residual stream patching: logit difference recovered",
        xlabel="position",
        ylabel="layer",
        xticks=out["tokens"],
        diverging=True,
    )
    heads = path.with_name(path.stem + "-heads" + path.suffix)
    plot_grid(out["heads"], heads, title="head output patching: logit difference recovered",
              xlabel="head", ylabel="layer", diverging=True)  # fmt: skip


def _table(title: str, rows: list[list[float]], columns: list[str] | None = None) -> str:
    from attnlm.inspect.heatmap import token_labels

    heads = token_labels(columns) if columns else [str(j) for j in range(len(rows[0]))]
    width = max(6, *(len(h) for h in heads))
    lines = [title, "      " + " ".join(h[:width].rjust(width) for h in heads)]
    for i, row in enumerate(rows):
        lines.append(f"{i:>5} " + " ".join(f"{v:{width}.2f}" for v in row))
    return "\n".join(lines)


def _attribute(args: argparse.Namespace) -> int:
    """direct logit attribution: each head's and MLP's share of the answer's logit

    Each component's write into the residual stream at the last position, through the final
    norm (its scale frozen at the run's value) and the answer's unembedding: the heads, the
    MLPs, the embeddings and the biases add up to the logit."""
    from attnlm.inspect.experiments import attribution

    text = common.literal_or_file(args)
    model, tok, _ = _load(args)
    out = attribution(model, tok, text, args.answer)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"logit of {args.answer!r} (token {out['answer_token']}): {out['logit']:.4f} = "
            f"embeddings {out['embed']:.4f} + heads {sum(map(sum, out['heads'])):.4f} + "
            f"MLPs {sum(out['mlps']):.4f} + biases {out['bias'] + out['attn_bias']:.4f}"
        )
        print(_table("heads (rows: layer; columns: head)", out["heads"]))
        print(_table("MLPs (rows: layer)", [[v] for v in out["mlps"]], ["mlp"]))  # fmt: skip
    if args.out:
        from attnlm.inspect.heatmap import plot_grid

        grid = [row + [m] for row, m in zip(out["heads"], out["mlps"], strict=True)]
        labels = [f"h{j}" for j in range(len(out["heads"][0]))] + ["MLP"]
        plot_grid(grid, args.out, title=f"direct logit attribution to {args.answer!r}",
                  xlabel="head (last column: the MLP)", ylabel="layer", xticks=labels,
                  diverging=True)  # fmt: skip
        _wrote(args.out, args.json)
    return 0


def _heads(args: argparse.Namespace) -> int:
    """per-head scores on repeated random tokens: induction, previous-token, duplicate-token

    Random token sequences repeated once: an induction head attends from each token of the
    repeat to the token after its earlier occurrence; a previous-token head to the token just
    before; a duplicate-token head to the earlier occurrence. Scores are the mean attention
    there, per layer and head."""
    from attnlm.inspect.experiments import head_scores

    kind = ("induction" if args.induction else "previous-token" if args.previous_token
            else "duplicate-token")  # fmt: skip
    model, _, _ = _load(args)
    out = head_scores(model, kind, length=args.length, batch=args.sequences, seed=args.seed)
    if args.json:
        print(json.dumps(out))
    else:
        print(_table(f"{kind} scores (rows: layer; columns: head)", out["scores"]))
        flat = sorted(((v, i, j) for i, row in enumerate(out["scores"])
                       for j, v in enumerate(row)), reverse=True)  # fmt: skip
        print("top heads: " + ", ".join(f"{i}.{j} {v:.2f}" for v, i, j in flat[:5]))
    if args.out:
        from attnlm.inspect.heatmap import plot_grid

        plot_grid(out["scores"], args.out, title=f"{kind} score per head", xlabel="head",
                  ylabel="layer")  # fmt: skip
        _wrote(args.out, args.json)
    return 0


def _ablate(args: argparse.Namespace) -> int:
    """the next-token distribution with and without some heads

    Each --head L.H has its output (hook_z) zeroed, or replaced by its mean over the positions
    with --mean; prints the top tokens with their probabilities both ways and the KL
    divergence of the ablated distribution from the plain one."""
    from attnlm.inspect.experiments import ablation, parse_heads

    text = common.literal_or_file(args)
    model, tok, _ = _load(args)
    out = ablation(model, tok, text, parse_heads(args.head, model), mean=args.mean,
                   top=args.top_k)  # fmt: skip
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(f"ablated ({out['ablation']}): {', '.join(out['heads'])}   KL {out['kl']:.4f}")
        print(f"{'token':<16}{'p':>9}{'ablated':>10}")
        for row in out["top"]:
            label = repr(row["token"])[:15]
            print(f"{label:<16}{row['p']:>9.4f}{row['p_ablated']:>10.4f}")
    if args.out:
        _plot_ablation(out, args.out)
        _wrote(args.out, args.json)
    return 0


def _plot_ablation(out: dict, path: Any) -> None:
    import numpy as np

    from attnlm.inspect.heatmap import _pyplot, _save, token_labels

    plt = _pyplot()
    rows = out["top"]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(rows) + 1.5))
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r["p"] for r in rows], height=0.4, label="plain")
    ax.barh(y + 0.2, [r["p_ablated"] for r in rows], height=0.4,
            label=f"heads {', '.join(out['heads'])} ablated")  # fmt: skip
    ax.set_yticks(y)
    ax.set_yticklabels(token_labels([r["token"] for r in rows]))
    ax.invert_yaxis()
    ax.set_xlabel("next-token probability")
    ax.set_title(f"ablation ({out['ablation']}), KL {out['kl']:.3f}", fontsize=10)
    ax.legend(fontsize=8)
    _save(plt, fig, path)
