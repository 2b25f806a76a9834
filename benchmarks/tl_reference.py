"""Check the TransformerLens 4 reference (``tests/support_tl.py``, where the code and its table
of every hook's meaning live) against its by-hand recomputation from the weights.

    .venv/bin/python benchmarks/tl_reference.py            # two tiny random models (tmp dir)
    .venv/bin/python benchmarks/tl_reference.py FOLDER...  # your own GPT2/Llama folders

Per folder: the bridge's logits against ``transformers``' eager model, and every classic hook
of the bridge's cache against ``support_tl.reference_from_hf``; exits 1 when a hook differs
by more than ``--tol``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

# Offline before huggingface_hub/transformers are imported (they read it at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import support_tl as tl  # noqa: E402  (tests/support_tl.py: the reference)


def _demo(folder: str, seed: int = 1) -> float:
    from transformers import AutoModelForCausalLM

    bridge = tl.boot(folder)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, bridge.cfg.d_vocab, (2, 7), generator=g)
    got = tl.cache(bridge, ids)
    with_result = tl.cache(bridge, ids, attn_result=True)
    ref = tl.reference_from_hf(folder, ids)
    hf = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        hf_logits = hf(ids).logits.numpy()
    lg = tl.logits(bridge, ids)
    print(
        f"\n{folder}: {type(bridge.adapter).__name__}, {bridge.cfg.n_layers} layers, "
        f"H={bridge.cfg.n_heads}, Hkv={getattr(bridge.cfg, 'n_key_value_heads', None)}"
    )
    print(
        f"  logits vs HF eager: max diff {np.abs(lg - hf_logits).max():.2e}"
        f" (bit-identical: {np.array_equal(lg, hf_logits)})"
    )
    worst = 0.0
    for name in tl.classic_hook_names(bridge.cfg.n_layers):
        arr = got.get(name, with_result.get(name))
        first = not name.startswith("blocks.") or name.startswith("blocks.0.")
        if arr is None:
            state = "in hook_dict, never fires" if name in bridge.hook_dict else "absent"
            if first:
                print(f"  {name:32s} -- {state}")
            continue
        diff = float(np.abs(arr - ref[name]).max())
        worst = max(worst, diff)
        if first or diff > 1e-6:
            print(f"  {name:32s} {str(arr.shape):16s} max diff {diff:.1e}")
    print(f"  worst over all layers' hooks: {worst:.1e}")
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", help="GPT2LMHeadModel / LlamaForCausalLM folders")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        folders = args.folders or list(tl.make_tiny_models(tmp).values())
        worst = max(_demo(f) for f in folders)
    print(f"\nworst hook diff {worst:.1e} (tolerance {args.tol:g})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
