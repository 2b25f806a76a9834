"""Model families. :mod:`.gpt` (decoder-only transformer) and :mod:`.hf` (Hugging Face
GPT-2 weight import/export)."""
