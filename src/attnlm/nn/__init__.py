"""Shared neural building blocks: attention (:mod:`.attention`, with its score functions
(:mod:`.score_functions`), masks (:mod:`.masks`), KV cache (:mod:`.cache`) and packed-token
layout (:mod:`.packing`)), positional schemes (:mod:`.positional`) and transformer blocks
(:mod:`.blocks`). Every model imports these; there is no other copy of multi-head attention
in the package."""
