#!/usr/bin/env bash
# An aarch64 Python with numpy, run by qemu-user, for tests/native/test_arm_build.py (the C step
# built for 64-bit ARM). Usage: .ci/arm_python.sh DIR; prints the path of DIR/python, a command
# that runs that Python. Installs Debian's cross compilers (GCC's and clang) and qemu-user;
# Debian's arm64 Python is unpacked into DIR/root (nothing is installed for arm64), numpy's
# aarch64 wheel from PyPI into DIR/site. Needs apt-get and root; exits non-zero when it cannot.
set -euo pipefail
dir="$(realpath -m "${1:?usage: .ci/arm_python.sh DIR}")"
cd "$(dirname "$0")/.."
if [ -x "$dir/python" ] && "$dir/python" -c "import numpy" >/dev/null 2>&1; then
  echo "$dir/python"
  exit 0
fi
{
  dpkg --add-architecture arm64
  apt-get update
  apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
    qemu-user clang
  # the Python of this Debian release (the package names carry its version)
  ver="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  rm -rf "$dir" && mkdir -p "$dir/debs" "$dir/root"
  (cd "$dir/debs" && apt-get download "python$ver-minimal:arm64" "libpython$ver-minimal:arm64" \
    "libpython$ver-stdlib:arm64" libc6:arm64 libffi8:arm64 zlib1g:arm64 libexpat1:arm64 \
    libssl3:arm64 libbz2-1.0:arm64 liblzma5:arm64 libgomp1:arm64 libstdc++6:arm64 \
    libgcc-s1:arm64 libsqlite3-0:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 \
    libuuid1:arm64 libcrypt1:arm64 libdb5.3:arm64 libgdbm6:arm64)
  for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root"; done
  .venv/bin/python -m pip install -q --target "$dir/site" --only-binary=:all: \
    --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
    --python-version "$ver" --implementation cp numpy
  printf '#!/bin/sh\nexec qemu-aarch64 -L "%s" -E PYTHONPATH="%s" "%s" "$@"\n' \
    "$dir/root" "$dir/site" "$dir/root/usr/bin/python$ver" > "$dir/python"
  chmod +x "$dir/python"
  "$dir/python" -c "import numpy, platform; assert platform.machine() == 'aarch64'"
} >&2
echo "$dir/python"
