"""The C step on 64-bit ARM (Apple Silicon, Graviton, a Raspberry Pi 4 or 5). Its target flag
there is ``-mcpu=native``: clang before version 15, Apple's among them, refuses
``-march=native`` for ARM, and the step would have fallen back to PyTorch's path. An ARM
build made by ``attnlm.native``'s own build code, with clang for ``aarch64-linux-gnu`` (no
OpenMP, as Apple's clang: POSIX threads) and with GCC's cross compiler (OpenMP), runs under
qemu-user in an aarch64 Python with numpy (``arm_child.py``, the engine without PyTorch):
every ggml product equals this CPU's build's within 1e-6 (integer sums in another order round
once differently), and every GGUF fixture's prompt logits equal this CPU's build's within 1e-6
of the range (no code of the activations flips), and llama.cpp's (recorded) as closely as the
AVX2 build's test asks. Needs ``ATTNLM_ARM_PYTHON`` (the command line of that Python:
.ci/arm_python.sh makes one) and the cross compilers; skipped without them."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_avx2_products import product
from test_build_matrix import AVX2_FIXTURES, FIXTURES, fake_cc, fresh  # noqa: F401 (fixture)

from attnlm import native
from attnlm.base.ggufio import GGUFFile
from attnlm.native import structs
from attnlm.runtime.engine_gguf import open_engine
from gguf_support import block_size, encode_tensor

HERE = Path(__file__).resolve().parent
SRC = Path(native.__file__).resolve().parents[2]
TYPES = ["F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K",
         "IQ4_NL", "IQ4_XS", "MXFP4"]  # fmt: skip
#: the cross compilers, and the target each is given (GCC's cross compiler has no ARM CPU to
#: read ``native`` from: an ARMv8.2 with the dot product and float16 instructions)
CROSS = {"clang": ("clang --target=aarch64-linux-gnu", None),
         "gcc": ("aarch64-linux-gnu-gcc", "armv8.2-a+dotprod+fp16")}  # fmt: skip


def arm_python() -> list[str]:
    return shlex.split(os.environ.get("ATTNLM_ARM_PYTHON", ""))


@pytest.fixture()
def arm(monkeypatch, tmp_path):
    """This process seen as an ARM one by the build code, with its own cache folder."""
    monkeypatch.setenv("ATTNLM_CACHE", str(tmp_path / "cache"))
    for name in (native.MARCH_ENV, native.CFLAGS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(native.platform, "machine", lambda: "aarch64")
    return monkeypatch


@pytest.mark.parametrize(("system", "machine", "want"), [
    ("linux", "aarch64", "-mcpu=native"), ("linux", "x86_64", "-march=native"),
    ("darwin", "arm64", None),  # Apple's clang: its own default, the M1 class
    ("darwin", "x86_64", "-march=native")])  # fmt: skip
def test_the_target_flag_on_arm_is_mcpu_native(monkeypatch, system, machine, want):
    monkeypatch.delenv(native.MARCH_ENV, raising=False)
    monkeypatch.setattr(native.sys, "platform", system)
    monkeypatch.setattr(native.platform, "machine", lambda: machine)
    targets = [f for f in native.build_flags() if f.startswith(("-march", "-mcpu"))]
    assert targets == ([want] if want else []) and native.target_flag() == (want or "")
    tag = native._cached("cc", native.build_flags()).name
    assert tag.startswith("decode_step-native-" if want else "decode_step-default-"), tag
    monkeypatch.setenv(native.MARCH_ENV, "armv8.2-a+dotprod")  # a target named: -march
    assert native.build_flags()[1] == "-march=armv8.2-a+dotprod"


def test_arm_prefers_clang_where_it_is_installed(monkeypatch, tmp_path):
    """GCC's aarch64 build of the step runs at about half clang's speed (bench_arm_qemu.py):
    on ARM, without ``CC``, clang is taken where it is on the PATH, else cc; elsewhere cc."""
    for name in ("cc", "clang"):
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native.platform, "machine", lambda: "aarch64")
    assert native._compiler() == str(tmp_path / "clang")
    monkeypatch.setenv("CC", "gcc-13")  # named: kept
    assert native._compiler() == "gcc-13"
    monkeypatch.delenv("CC")
    monkeypatch.setattr(native.platform, "machine", lambda: "x86_64")
    assert native._compiler() == str(tmp_path / "cc")
    (tmp_path / "clang").unlink()
    monkeypatch.setattr(native.platform, "machine", lambda: "arm64")
    assert native._compiler() == str(tmp_path / "cc")


@pytest.mark.slow  # a real build (.ci/run runs this file whole)
@pytest.mark.usefixtures("fresh")  # a process that has not tried the library yet
def test_a_clang_that_fails_on_arm_falls_back_to_cc(arm, tmp_path):
    """ARM's preferred clang (``CC`` unset) failing to build the step: the system's cc builds
    it; a compiler named by ``CC`` gets no such second try."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc)")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fake_cc(bin_, "")  # bin/cc: the real one
    (bin_ / "clang").write_text('#!/bin/sh\necho "clang: error: broken" >&2\nexit 1\n')
    (bin_ / "clang").chmod(0o755)
    arm.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    arm.setenv(native.MARCH_ENV, "native")  # this CPU's target (the machine is faked)
    assert native._compilers() == [str(bin_ / "clang"), str(bin_ / "cc")]
    assert native.library() is not None, native.why_not
    arm.setattr(native, "_TRIED", False)
    arm.setenv("CC", str(bin_ / "clang"))
    assert native.library() is None and "clang: error: broken" in native.why_not


def generic_where_clang_cannot_name_this_cpu(arm) -> None:
    """clang takes ``-mcpu=native`` for aarch64 from the host's CPU name: on an x86 host
    whose core it names (``znver3``: no ARM core) it refuses the flag, where a VM's generic
    CPU passes. There, ``-mcpu=generic`` follows the build's ``-mcpu=native`` (the last one
    wins), so the cross build still takes every other flag the ARM build code gives."""
    probe = subprocess.run(["clang", "--target=aarch64-linux-gnu", "-mcpu=native", "-x", "c",
                            "-c", "-", "-o", os.devnull], input="int x;", capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    if probe.returncode != 0:
        arm.setenv(native.CFLAGS_ENV, "-mcpu=generic")


def _clang_major() -> int:
    done = subprocess.run(["clang", "-dumpversion"], capture_output=True, text=True)
    return int(done.stdout.split(".")[0])


@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang")
@pytest.mark.skipif(not Path("/usr/aarch64-linux-gnu/include/stdio.h").is_file(),
                    reason="no aarch64 C headers (Debian's libc6-dev-arm64-cross)")  # fmt: skip
def test_clang_builds_for_arm_where_march_native_fails(arm, tmp_path):
    cc = CROSS["clang"][0]
    if _clang_major() < 15:  # the refusal the ARM flag avoids
        flags = ["-O3", "-march=native", "-std=gnu11", "-shared", "-fPIC"]
        with pytest.raises(OSError, match="does not support '-march=native'"):
            native._compile(cc, flags, tmp_path / "refused.so")
    generic_where_clang_cannot_name_this_cpu(arm)
    path = native._build(cc)  # -mcpu=native; no aarch64 OpenMP here: POSIX threads
    assert path.is_file() and path.name.startswith("decode_step-native-")
    assert b"\xb7\x00" == path.read_bytes()[18:20]  # ELF e_machine 183: AArch64


@pytest.fixture(scope="module")
def reference() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """This CPU's build's numbers, made before a test fakes an ARM machine (module scope:
    first), which would make this CPU's build one for ``-mcpu=native``."""
    return _cases()


def _cases() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inputs of every product (``case/...``) and of every fixture's prompt (``prompt/...``),
    and what this CPU's build gives for each."""
    lib = native.library()
    assert lib is not None, native.why_not
    cases, want = {}, {}
    for qtype in TYPES:
        for n, k in [(37, 512), (8, 608), (16, 256)]:
            if k % block_size(qtype):
                continue
            rng = np.random.default_rng(n + k)
            data, _ = encode_tensor(rng.normal(size=(n, k)).astype(np.float32), qtype, rng)
            raw = np.ascontiguousarray(np.ascontiguousarray(data).view(np.uint8).reshape(n, -1))
            for act in (structs.ACT_FLOAT, structs.ACT_INT):
                for m in (1, 3, 9):
                    key = f"case/{qtype}-{n}-{k}-{act}-{m}"
                    x = rng.normal(size=(m, k)).astype(np.float32)
                    meta = np.array([structs.GGML_FORMATS[qtype], n, k, act])
                    cases |= {key + "/raw": raw, key + "/x": x, key + "/meta": meta}
                    want[key] = product(lib, raw, qtype, n, k, x, 2, act)
    doc = json.loads((FIXTURES / "llamacpp.json").read_text(encoding="utf-8"))
    for arch, kinds in doc["archs"].items():
        for kind, rec in kinds.items():
            path = str(FIXTURES / f"{arch}-{kind}.gguf")
            if not Path(path).is_file():  # f32: llama.cpp's float32 logits, no file kept
                continue
            cases["prompt/" + path] = prompt = np.asarray(rec["prompt"], dtype=np.int64)
            engine = open_engine(GGUFFile(path), None, 2)
            engine.reset(1)
            want["logits/" + path] = engine.feed(prompt[None])[0]
            if (arch, kind) in AVX2_FIXTURES:
                want["llama.cpp/" + path] = np.asarray(rec["logits"], dtype=np.float32)
    return cases, want


@pytest.mark.skipif(not arm_python(), reason="no aarch64 Python (ATTNLM_ARM_PYTHON)")
@pytest.mark.parametrize("compiler", sorted(CROSS))
def test_the_arm_build_gives_this_cpus_numbers(reference, arm, tmp_path, compiler):
    cc, march = CROSS[compiler]
    if shutil.which(shlex.split(cc)[0]) is None:
        pytest.skip(f"no {cc}")
    cases, want = reference
    if march:
        arm.setenv(native.MARCH_ENV, march)
    else:
        generic_where_clang_cannot_name_this_cpu(arm)
    path = native._build(cc)
    np.savez(tmp_path / "in.npz", **cases)
    fixtures = [k.removeprefix("prompt/") for k in cases if k.startswith("prompt/")]
    done = subprocess.run([*arm_python(), str(HERE / "arm_child.py"), str(path), str(SRC),
                           str(tmp_path / "in.npz"), str(tmp_path / "out.npz"), *fixtures],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.load(tmp_path / "out.npz")
    assert got["features"], "the ARM build says it has no fused multiply-add"
    for key, y in want.items():
        if key.startswith("case/"):
            off = np.abs(got[key] - y).max() / np.abs(y).max()
            assert off <= 1e-6, f"{key}: {off:.2e}"
        elif key.startswith("logits/"):
            off = np.abs(got[key] - y).max() / (y.max() - y.min())
            assert off < 1e-6, f"{key}: {off:.2e} of the logit range"
        else:  # llama.cpp's recorded logits
            mine = got["logits/" + key.removeprefix("llama.cpp/")]
            off = np.abs(mine - y).max() / (y.max() - y.min())
            assert off < 1e-5, f"{key}: {off:.2e} of the logit range"
