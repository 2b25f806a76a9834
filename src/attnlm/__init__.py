"""attnlm: build, train, evaluate and open up attention-based language models."""

__version__ = "0.1.0"
