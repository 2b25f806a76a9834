"""``attnlm generate`` on each GGUF file named, in this one process (run by
``test_sanitizers.py`` under AddressSanitizer): one line ``EXIT <code> <backend> <file>`` per
file (the backend ``--json`` names, ``-`` when the command refused the file)."""

from __future__ import annotations

import contextlib
import io
import json
import sys

from attnlm.cli import main

ARGS = ["--prompt", "Hello there", "--max-new-tokens", "4", "--temperature", "0", "--json"]

for path in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["generate", "--model", path, *ARGS])
    lines = out.getvalue().strip().splitlines()
    backend = json.loads(lines[-1]).get("backend", "?") if code == 0 and lines else "-"
    print(f"EXIT {code} {backend} {path}", flush=True)
