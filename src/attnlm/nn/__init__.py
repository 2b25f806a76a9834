"""Shared neural building blocks: attention (:mod:`.attention`), positional schemes
(:mod:`.positional`) and transformer blocks (:mod:`.blocks`). Every model imports these;
there is no other copy of multi-head attention in the package."""
