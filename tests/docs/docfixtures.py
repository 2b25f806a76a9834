"""Files a doc page says the user already has, made small for the doc tests (``given`` markers
import this module)."""

from __future__ import annotations

from pathlib import Path


def smollm2_folder(folder: str, vocab_size: int = 400) -> None:
    """A Hugging Face Llama folder shaped like SmolLM2-135M's, tiny: ``config.json`` and
    weights of a random 1-layer Llama, and a byte-level BPE ``tokenizer.json`` trained by the
    ``tokenizers`` library on the built-in corpus with SmolLM2's pre-tokenizer (NFC, single
    digits, ByteLevel)."""
    from attnlm.data.corpus import load_text
    from attnlm.models import save_hf
    from attnlm.models.llama import Llama, LlamaConfig
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    config = LlamaConfig(vocab_size=vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16)
    save_hf(Llama(config), folder)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel()]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([load_text(None)[:20_000]], trainer)
    tok.save(str(Path(folder) / "tokenizer.json"))
