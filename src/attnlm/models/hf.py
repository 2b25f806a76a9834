"""Hugging Face GPT-2 interop: load a checkpoint directory in the ``transformers`` layout into
:class:`~attnlm.models.gpt.GPT`, and write ours in that layout.

The layout (``GPT2LMHeadModel.save_pretrained``): ``config.json`` (``model_type: "gpt2"``,
``n_embd``, ``n_layer``, ``n_head``, ``n_positions``, ``vocab_size``, ``n_inner``,
``activation_function``, ``layer_norm_epsilon``, ``tie_word_embeddings``) and the weights in
``model.safetensors`` (or sharded with ``model.safetensors.index.json``), or in the older
``pytorch_model.bin`` (a pickled state dict, read here with ``weights_only=True``). Keys are
``transformer.wte.weight``, ``transformer.h.{i}.attn.c_attn.weight``, ... (``transformer.``
may be absent when a bare ``GPT2Model`` was saved). GPT-2's ``Conv1D`` layers store their
weight as ``(in, out)``, the transpose of ``nn.Linear``'s ``(out, in)``; the LM head is tied
to ``wte`` and usually not stored.

This needs neither ``transformers`` nor the network: only ``torch`` and ``safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from attnlm.errors import ConfigError, InputError
from attnlm.models.gpt import GPT, GPTConfig

# GPT-2 activation names -> ours, and back
_ACT_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                "relu": "relu"}  # fmt: skip
_ACT_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}

# Per-block parameters: (our name, HF name, stored transposed in HF)
_BLOCK_KEYS = [
    ("ln_1.weight", "ln_1.weight", False),
    ("ln_1.bias", "ln_1.bias", False),
    ("attn.qkv_proj.weight", "attn.c_attn.weight", True),
    ("attn.qkv_proj.bias", "attn.c_attn.bias", False),
    ("attn.out_proj.weight", "attn.c_proj.weight", True),
    ("attn.out_proj.bias", "attn.c_proj.bias", False),
    ("ln_2.weight", "ln_2.weight", False),
    ("ln_2.bias", "ln_2.bias", False),
    ("mlp.fc.weight", "mlp.c_fc.weight", True),
    ("mlp.fc.bias", "mlp.c_fc.bias", False),
    ("mlp.proj.weight", "mlp.c_proj.weight", True),
    ("mlp.proj.bias", "mlp.c_proj.bias", False),
]
_TOP_KEYS = [
    ("tok_emb.weight", "wte.weight"),
    ("pos_emb.weight", "wpe.weight"),
    ("ln_f.weight", "ln_f.weight"),
    ("ln_f.bias", "ln_f.bias"),
]


def _key_map(n_layer: int) -> list[tuple[str, str, bool]]:
    """All (our key, HF key without the ``transformer.`` prefix, transposed) triples."""
    keys = [(ours, hf, False) for ours, hf in _TOP_KEYS]
    for i in range(n_layer):
        keys += [(f"blocks.{i}.{o}", f"h.{i}.{h}", t) for o, h, t in _BLOCK_KEYS]
    return keys


def config_from_hf(hf: dict, *, where: str = "config.json") -> GPTConfig:
    """Our :class:`GPTConfig` from a GPT-2 ``config.json`` dict."""
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, expected 'gpt2'")
    unsupported = {
        "scale_attn_weights": (True, "unscaled attention"),
        "scale_attn_by_inverse_layer_idx": (False, "per-layer attention scaling"),
        "add_cross_attention": (False, "cross-attention"),
    }
    for key, (expected, what) in unsupported.items():
        if hf.get(key, expected) != expected:
            raise ConfigError(f"{where}: {key}={hf[key]!r} ({what}) is not supported")
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACT_FROM_HF:
        raise ConfigError(f"{where}: activation_function {act!r} is not supported")
    try:
        return GPTConfig(
            vocab_size=hf["vocab_size"],
            block_size=hf.get("n_positions", hf.get("n_ctx")),
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            n_embd=hf["n_embd"],
            positions="learned",
            norm="pre",
            dropout=float(hf.get("resid_pdrop", 0.0)),
            bias=True,
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
            activation=_ACT_FROM_HF[act],
            d_ff=hf.get("n_inner"),
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        )
    except KeyError as e:
        raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None


def config_to_hf(config: GPTConfig) -> dict:
    """A GPT-2 ``config.json`` dict for our config; fields GPT-2 cannot express are errors."""
    needs = {"positions": "learned", "norm": "pre", "bias": True, "attention_score": "scaled_dot"}
    for field, value in needs.items():
        if getattr(config, field) != value:
            raise ConfigError(
                f"model.{field}={getattr(config, field)!r} has no GPT-2 equivalent "
                f"(the Hugging Face GPT-2 layout needs {field}={value!r})"
            )
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": config.d_ff,
        "activation_function": _ACT_TO_HF[config.activation],
        "layer_norm_epsilon": config.layer_norm_eps,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": config.vocab_size - 1,
        "eos_token_id": config.vocab_size - 1,
        "dtype": "float32",
    }


def read_hf_weights(path: str | Path) -> dict[str, Tensor]:
    """The state dict stored in a HF checkpoint directory (safetensors preferred)."""
    path = Path(path)
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file() or index.is_file():
        from safetensors.torch import load_file

        if single.is_file():
            return load_file(single)
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(load_file(path / shard))
        return state
    pickled = path / "pytorch_model.bin"
    if pickled.is_file():
        try:
            return torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure is bad input
            raise InputError(f"{pickled}: cannot read weights safely ({e})") from None
    raise InputError(
        f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    )


def state_from_hf(hf_state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """Map a GPT-2 state dict onto our parameter names (transposing Conv1D weights)."""
    state = {k.removeprefix("transformer."): v for k, v in hf_state.items()}
    out: dict[str, Tensor] = {}
    for ours, hf, transposed in _key_map(config.n_layer):
        if hf not in state:
            raise InputError(f"GPT-2 weights are missing {hf!r}")
        tensor = state.pop(hf)
        out[ours] = tensor.t() if transposed else tensor
    head = state.pop("lm_head.weight", None)
    if not config.tie_embeddings:
        if head is None:
            raise InputError("GPT-2 weights are missing 'lm_head.weight' (untied embeddings)")
        out["lm_head.weight"] = head
    # old checkpoints also store the causal-mask buffers attn.bias / attn.masked_bias
    leftover = [k for k in state if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if leftover:
        raise InputError(f"unexpected GPT-2 weights: {', '.join(sorted(leftover)[:5])}")
    return out


def load_gpt2(path: str | Path) -> GPT:
    """Our :class:`GPT` (in eval mode) from a HF GPT-2 checkpoint directory."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise InputError(f"{path}: no config.json (expected a Hugging Face checkpoint folder)")
    try:
        hf_config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{config_file}: invalid JSON ({e})") from None
    config = config_from_hf(hf_config, where=str(config_file))
    state = state_from_hf(read_hf_weights(path), config)
    model = GPT(config)
    expected = model.state_dict()
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise InputError(
                f"{path}: weight {key!r} has shape {tuple(tensor.shape)}, "
                f"config.json implies {tuple(expected[key].shape)}"
            )
    missing, _ = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_embeddings)]
    if missing:
        raise InputError(f"{path}: weights missing for {', '.join(missing[:5])}")
    return model.eval()


def save_gpt2(model: GPT, path: str | Path) -> None:
    """Write ``model`` as a HF GPT-2 checkpoint folder (``config.json`` +
    ``model.safetensors``) that ``transformers.GPT2LMHeadModel.from_pretrained`` loads."""
    from safetensors.torch import save_file

    hf_config = config_to_hf(model.config)
    ours = model.state_dict()
    state = {}
    for key, hf, transposed in _key_map(model.config.n_layer):
        tensor = ours[key].detach().cpu()
        state[f"transformer.{hf}"] = (tensor.t() if transposed else tensor).contiguous()
    if not model.config.tie_embeddings:
        state["lm_head.weight"] = ours["lm_head.weight"].detach().cpu().contiguous()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
