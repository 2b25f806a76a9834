"""A LoRA fine-tune's frozen base multiplied by the C step's kernels in the forward, against
PyTorch's float32 products (issue 49: "the C step's kernels where they help the forward").
Ours against ours, in one process, alternating.

    .venv/bin/python benchmarks/bench_finetune_cforward.py --simulate avx512
    .venv/bin/python benchmarks/bench_finetune_cforward.py --activations int
    .venv/bin/python benchmarks/bench_finetune_cforward.py --quick

The model is the one ``attnlm train --init-from smollm2-135m-instruct --lora 8`` trains
(``--model``): loaded in float32 from its GGUF file, LoRA r 8, alpha 16, targets ``all`` (the
2-core defaults), AdamW at 1e-3, one random batch of ``--batch`` x ``--block`` tokens.
The contenders differ in one thing, the forward's ``x Wᵀ + b`` of every adapted layer:

* ``torch``: what training runs (:func:`attnlm.nn.fused.linear`: oneDNN's float32 kernel on
  a CPU MKL is not tuned for, else ``F.linear``), on the float32 weights;
* ``c``: ``attnlm_linear`` of the C library (:mod:`attnlm.native`) over the file's own
  blocks: Q4_0 / Q4_1 in the step's q4 layout (:func:`attnlm.quant.blocks.pack_q4`), the
  other ggml types as stored; activations float32 (``--activations float``: each product
  is the float32 product of the dequantized weights up to the order of its sums) or
  quantized to 8 bits per block as the C step quantizes them (``int``; Q4_0 / Q4_1 then as
  stored, since the q4 layout takes float activations only). The backward's ``dx = dy W``
  stays PyTorch's on the float32 weights in both.

Measured, each as the median of ``--rounds`` alternating rounds, and printed as c / torch:

1. the products of block 0 (q/k/v, output, gate/up, down) at ``batch x block`` rows (each
   sample :data:`REPEAT` calls);
2. the forward of the whole model (autograd recording, no backward);
3. a whole LoRA step (forward, backward, AdamW);
4. the first step's loss on both (the same adapters): their difference.

``--simulate avx512`` / ``avx2`` restricts oneDNN and PyTorch as ``bench_finetune_quality.py``
does (the C library keeps its own build: ``ATTNLM_NATIVE_MARCH`` chooses it).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path
from typing import Any

import harness

#: the q/k/v, output, gate/up and down products of a block: (our layer, target names)
LAYERS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc", "mlp.proj")
REPEAT = 10  # calls of one product per timed sample


class CProduct:
    """``x (N, K) -> x Wᵀ + b (N, O)`` by ``attnlm_linear`` over ``segments``: ``(start,
    stop, Linear, arrays it points into)`` for consecutive output rows."""

    def __init__(self, lib: Any, segments: list[tuple], out: int, bias: Any) -> None:
        self.lib, self.segments, self.out = lib, segments, out
        self.bias = None if bias is None else bias.detach().contiguous()

    def __call__(self, x: Any) -> Any:
        import torch

        x = x.contiguous()
        n, threads = x.shape[0], torch.get_num_threads()
        parts = []
        for start, stop, linear, _ in self.segments:
            y = torch.empty(n, stop - start)
            self.lib.attnlm_linear(ctypes.byref(linear), x.data_ptr(), n, y.data_ptr(), None,
                                   threads)  # fmt: skip
            parts.append(y)
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return y if self.bias is None else y.add_(self.bias)


def _segment(header: Any, mapped: Any, part: Any, start: int, act: str) -> tuple:
    """One file tensor's rows (our row order) as a C product."""
    import numpy as np

    from attnlm.models.gguf.parts import unpermute_rows
    from attnlm.native import structs
    from attnlm.quant.blocks import NATIVE_FORMAT, codes, pack_q4

    info = header.tensors[part.gguf]
    n, k = info.shape
    name = info.type_name
    if NATIVE_FORMAT.get(name) == "q4" and act == "float":  # the step's q4 layout
        found = codes(header.raw(info), name, (n, k))
        if part.heads:
            found = {key: unpermute_rows(v, part.heads) for key, v in found.items()}
        packed, scales = pack_q4(found["u"], found["d"], found["m"])
        lin = structs.Linear(structs.Q4, n, k, packed.shape[0], packed.ctypes.data,
                             scales.ctypes.data, None, 0)  # fmt: skip
        return start, start + n, lin, (packed, scales)
    rows = mapped[info.offset : info.offset + info.nbytes].reshape(n, -1)
    rows = np.ascontiguousarray(unpermute_rows(rows, part.heads) if part.heads else rows)
    how = structs.ACT_FLOAT if act == "float" else structs.ACT_INT
    lin = structs.Linear(structs.GGML_FORMATS[name], n, k, n, rows.ctypes.data, None, None, how)
    return start, start + n, lin, (rows,)


def c_products(model: Any, path: Path, act: str) -> dict[str, CProduct]:
    """A :class:`CProduct` per adapted layer whose weights the GGUF file stores in quantized
    blocks, by the layer's name."""
    import numpy as np

    from attnlm.base.ggufio import GGUFFile
    from attnlm.lora.layers import LoRALinear
    from attnlm.models.gguf.loader import arch_module
    from attnlm.native import library

    lib = library()
    header = GGUFFile(path)
    mapped = np.memmap(header.path, dtype=np.uint8, mode="r")
    by: dict[str, list] = {}
    for part in arch_module(header).parts(model.config, header):
        by.setdefault(part.ours, []).append(part)
    floats = ("F32", "F16", "BF16")
    out = {}
    for name, layer in model.named_modules():
        parts = by.get(f"{name}.weight") if isinstance(layer, LoRALinear) else None
        if not parts or any(header.tensors[p.gguf].type_name in floats for p in parts):
            continue
        parts = sorted(parts, key=lambda p: (p.rows or (0,))[0])
        segs = [_segment(header, mapped, p, (p.rows or (0,))[0], act) for p in parts]
        out[name] = CProduct(lib, segs, layer.out_features, layer.bias)
    return out


class Switch:
    """Stands in for :mod:`attnlm.nn.fused` inside :mod:`attnlm.lora.layers`: its ``linear``
    is the C product of the weight's layer while ``on``, the real one otherwise."""

    def __init__(self, real: Any, by_weight: dict[int, CProduct]) -> None:
        self.real, self.by_weight, self.on = real, by_weight, False

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any:
        prod = self.by_weight.get(weight.data_ptr()) if self.on else None
        if prod is None:
            return self.real.linear(x, weight, bias)
        return prod(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def report(name: str, runs: dict[str, list], **extra: Any) -> None:
    """:func:`harness.report` of c against torch, then the median over rounds of each
    round's c / torch wall-clock ratio (steadier than the ratio of the medians when the load
    changes between rounds; in the JSON line as ``pair_ratio_wall``)."""
    ratios = [c.wall / t.wall for c, t in zip(runs["c"], runs["torch"]) if t.wall]
    value = harness.median(ratios) if ratios else float("nan")
    harness.report(name, runs, ours="c", peer="torch", pair_ratio_wall=round(value, 4), **extra)
    print(f"  {name}: median of the rounds' c / torch ratios {value:.2f}x ({len(ratios)} rounds)")


def profile(step: Any) -> None:
    """Print the operators taking the most of one step's time (self time, summed over the
    step's calls; a custom autograd function's own Python time is its line)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as run

    step()
    with run(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    print("  where a torch step's time goes (self CPU time, all threads' ops):")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
        print(f"    {e.self_cpu_time_total / total:6.1%}  {e.count:5d} calls  {e.key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a GGUF model SPEC")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--activations",
        choices=("float", "int"),
        default="float",
        help="the C products' activations: float32, or 8-bit as the C step",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also: where a torch step's time goes (torch.profiler, by operator)",
    )
    harness.add_simulate_argument(ap)
    args = harness.parse(ap, quick={"rounds": 1, "batch": 1, "block": 32})
    os.environ.update(harness.SIMULATE[args.simulate])  # before torch loads oneDNN
    harness.set_threads(args.threads)
    import torch

    from attnlm.loading import sources
    from attnlm.lora import layers
    from attnlm.lora.layers import apply_lora
    from attnlm.native import library, why_not

    bench = "finetune_cforward"
    harness.header(bench, model=args.model, batch=args.batch, block=args.block,
                   threads=args.threads, simulate=args.simulate,
                   activations=args.activations)  # fmt: skip
    if library() is None:
        harness.skip(bench, "c", why_not)
        return
    torch.manual_seed(0)
    model, _, info = sources.resolve(args.model, "cpu", weights="f32")
    if info.path is None or Path(info.path).suffix != ".gguf":
        harness.skip(bench, "c", f"{args.model} is not a GGUF file")
        return
    apply_lora(model, 8, alpha=16, targets="all")
    model.train()
    prods = c_products(model, Path(info.path), args.activations)
    modules = dict(model.named_modules())
    switch = Switch(layers.fused, {modules[n].weight.data_ptr(): p for n, p in prods.items()})
    layers.fused = switch  # the adapted layers' base products go through the switch
    print(f"  {bench}: {len(prods)} adapted layers on C products ({info.path.name})")

    rows = args.batch * args.block
    runs: dict[str, dict[str, list]] = {}
    for name in LAYERS:
        layer = modules[f"blocks.0.{name}"]
        if f"blocks.0.{name}" not in prods:
            continue
        x = torch.randn(rows, layer.in_features)
        w, b, prod = layer.weight, layer.bias, prods[f"blocks.0.{name}"]
        with torch.no_grad():
            ref, got = switch.real.linear(x, w, b), prod(x)
            err = float((got - ref).norm() / ref.norm())

        def c_call(p: Any = prod, x: Any = x) -> None:
            for _ in range(REPEAT):
                p(x)

        def torch_call(x: Any = x, w: Any = w, b: Any = b) -> None:
            for _ in range(REPEAT):
                switch.real.linear(x, w, b)

        runs[name] = harness.alternate({"c": lambda f=c_call: harness.time_call(f),
                                        "torch": lambda f=torch_call: harness.time_call(f)},
                                       rounds=max(3, args.rounds), swap=True)  # fmt: skip
        report(f"{bench} product {name} {rows}x{layer.in_features}->{layer.out_features}",
               runs[name], rel_err=err)  # fmt: skip

    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (args.batch, args.block + 1), generator=gen)
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=1e-3)

    def step(on: bool) -> float:
        switch.on = on
        loss = model(ids[:, :-1], ids[:, 1:]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def forward(on: bool) -> None:
        switch.on = on
        model(ids[:, :-1], ids[:, 1:]).loss.detach()

    first = {}
    for on in (True, False):  # the same adapters before each: the first loss compared
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        first[on] = step(on)
    fwd = harness.alternate({"c": lambda: harness.time_call(lambda: forward(True)),
                             "torch": lambda: harness.time_call(lambda: forward(False))},
                            rounds=args.rounds, swap=True)  # fmt: skip
    report(f"{bench} forward {args.batch}x{args.block}", fwd)
    steps = harness.alternate({"c": lambda: harness.time_call(lambda: step(True)),
                               "torch": lambda: harness.time_call(lambda: step(False))},
                              rounds=args.rounds, swap=True)  # fmt: skip
    step_s = harness.median(s.wall for s in steps["torch"])
    products = sum(harness.median(s.wall for s in r["torch"]) for r in runs.values()) / REPEAT
    share = products * len(model.blocks) / step_s if step_s else 0.0
    report(f"{bench} lora step {args.batch}x{args.block}", steps, first_loss_c=first[True],
           first_loss_torch=first[False],
           blocks_forward_products_share=round(share, 3))  # fmt: skip
    if args.profile:
        profile(lambda: step(False))
    print(
        f"  {bench}: first loss c {first[True]:.6f}, torch {first[False]:.6f} "
        f"(difference {abs(first[True] - first[False]):.2e}); the blocks' forward products "
        f"take {share:.0%} of a torch step: the most any forward kernel could save"
    )


if __name__ == "__main__":
    sys.exit(main())
