"""Applications on top of the library: the demo and ``attnlm compare``."""

from __future__ import annotations
