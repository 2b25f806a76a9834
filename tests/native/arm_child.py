"""Run by an aarch64 Python (under qemu-user) for test_arm_build.py: numpy and attnlm's
engine without PyTorch, the C step's library given by path. Computes, for every case in the
input ``.npz``, one ggml product (``attnlm_linear``), and for every GGUF fixture named, the
prompt's logits through the engine; writes them to the output ``.npz``.

Arguments: LIBRARY SRC_FOLDER IN_NPZ OUT_NPZ FIXTURE..."""

from __future__ import annotations

import ctypes
import sys


def main(lib_path: str, src: str, cases_path: str, out_path: str, fixtures: list[str]) -> None:
    sys.path.insert(0, src)
    import numpy as np

    from attnlm import native
    from attnlm.base.ggufio import GGUFFile
    from attnlm.native import structs
    from attnlm.runtime.engine_gguf import open_engine

    lib = ctypes.CDLL(lib_path)
    mismatch = structs.configure(lib)
    assert mismatch is None, mismatch
    native._TRIED, native._LIBRARY, native.built = True, lib, lib_path  # the library given
    cases, out = np.load(cases_path), {"features": np.asarray(native.features() >= {"fma"})}
    for key in sorted({n.rsplit("/", 1)[0] for n in cases.files if n.startswith("case/")}):
        raw, x = cases[key + "/raw"], cases[key + "/x"]
        fmt, n, k, act = (int(v) for v in cases[key + "/meta"])
        layer = structs.Linear(fmt, n, k, n, raw.ctypes.data, None, None, act)
        y = np.full((x.shape[0], n), np.nan, np.float32)
        part = np.empty(2 * y.size, np.float32)
        lib.attnlm_linear(ctypes.byref(layer), x.ctypes.data, x.shape[0], y.ctypes.data,
                          part.ctypes.data, 2)  # fmt: skip
        out[key] = y
    for path in fixtures:
        engine = open_engine(GGUFFile(path), None, 2)
        engine.reset(1)
        out["logits/" + path] = engine.feed(cases["prompt/" + path][None])[0]
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:5], sys.argv[5:])
