"""``attnlm serve --api``: an OpenAI-compatible HTTP server with continuous batching
(:mod:`attnlm.api.app` the routes, :mod:`attnlm.api.scheduler` the slots and the batched
step, :mod:`attnlm.api.grammar` constrained decoding by llguidance)."""
