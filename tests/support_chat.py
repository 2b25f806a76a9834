"""A tiny random chat model as Hugging Face writes it: a ``LlamaForCausalLM`` folder saved by
``transformers`` with a byte-level BPE ``tokenizer.json`` (ChatML special tokens) and a ChatML
template in ``tokenizer_config.json``. Used by the resolver, chat and lens tests."""

from __future__ import annotations

import json
from pathlib import Path

# SmolLM2-Instruct's template (ChatML with a default system prompt)
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = "the capital of France is Paris. You are a helpful assistant. system user hello\n"


def tiny_chat_llama(folder: Path, template: str | None = CHATML, seed: int = 0,
                    specials: list[str] = SPECIALS) -> Path:  # fmt: skip
    """Write the model folder (see the module docstring) into ``folder``; returns it."""
    import torch
    import transformers

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, show_progress=False, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator([TEXT] * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>",
    )  # fmt: skip
    hf_tok.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    config_file.write_text(json.dumps(config, indent=1))
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


#: OpenAI's harmony markers (gpt-oss's chat format) and a template that writes them
HARMONY = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]
HARMONY_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def tiny_harmony_llama(folder: Path) -> Path:
    """:func:`tiny_chat_llama` with the harmony markers as special tokens and a harmony-style
    template (the reply's end: ``<|return|>``)."""
    tiny_chat_llama(folder, HARMONY_TEMPLATE, specials=SPECIALS + HARMONY)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token"] = "<|return|>"
    config_file.write_text(json.dumps(config, indent=1))
    return folder
