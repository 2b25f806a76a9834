"""Tasks: what a language model can do, measured the way papers report it (lm-evaluation-harness's
scoring rules) on files the user has or on built-in tasks.

* :mod:`attnlm.tasks.files`: task files (JSON Lines, folders with a train split), checked line
  by line;
* :mod:`attnlm.tasks.builtin`: tasks made from data attnlm ships (``tatoeba-mc``,
  ``shakespeare-cloze``);
* :mod:`attnlm.tasks.prompts`: few-shot prompts as lm-evaluation-harness builds them;
* :mod:`attnlm.tasks.metrics`: ``acc``, ``acc_norm``, ``perplexity``, ``exact_match`` and
  their standard errors;
* :mod:`attnlm.tasks.score`: log-likelihoods of continuations from one KV cache per context;
* :mod:`attnlm.tasks.run`: one model, one task, one number of shots.
"""
