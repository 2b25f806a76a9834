"""The base layer: errors, configuration and devices, file formats read safely (the
foreign-file boundary, text, atomic writes, GGUF headers) and the one validator per kind of
value. No model code, no argparse."""

from __future__ import annotations
