#!/bin/sh
# llama.cpp's shared libraries built for another CPU class than this one, for
# `bench_kquant.py --simulate avx2 --llama-cpp-lib DIR`: the source of the installed
# llama-cpp-python version (its sdist, from PyPI), configured for AVX2 + FMA + F16C without
# AVX-512 (the x86-64-v3 class a laptop without AVX-512 has). Prints the folder to pass.
#
#   benchmarks/build_llama_cpp.sh [BUILD_DIR]     (default: ~/.cache/attnlm/bench/llama.cpp-avx2)
#
# About 2 minutes on 2 cores (only libllama and libggml* are built).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
out=${1:-${ATTNLM_CACHE:-$HOME/.cache/attnlm}/bench/llama.cpp-avx2}
version=$("$py" -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))") || {
  echo "error: llama-cpp-python is not installed (pip install -e '.[llamacpp]')" >&2
  exit 2
}
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
"$py" -m pip download --quiet --no-deps --no-binary :all: "llama_cpp_python==$version" -d "$src"
tar -xzf "$src"/llama_cpp_python-"$version".tar.gz -C "$src"
cmake -S "$src/llama_cpp_python-$version/vendor/llama.cpp" -B "$out" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
  -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF >/dev/null
cmake --build "$out" --target llama -j "$(nproc)" >/dev/null
echo "$out/bin"
