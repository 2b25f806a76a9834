"""TransformerLens 4 reference activations for GPT-2- and Llama-style Hugging Face folders.

A parity oracle for activation tracing (``tests/inspect/test_tl_parity.py``,
``benchmarks/bench_interp.py``, ``benchmarks/tl_reference.py``): boots ``transformer_lens``
4.3's ``TransformerBridge`` on a LOCAL ``transformers`` folder (no download, raw numerics) and
returns the classic TransformerLens hooks (:func:`cache`); TransformerLens's activation
patching (:func:`tl_patching`, ``run_with_hooks``, one forward per patch) and direct logit
attribution (:func:`tl_attribution`, from its cache); an independent by-hand recomputation of
the same tensors from the folder's weights (:func:`reference_from_hf`); random tiny GPT-2 and
Llama folders with a byte-level BPE tokenizer (:func:`random_folder`). No attnlm imports, on
purpose: it is the reference.

Needs ``transformer-lens>=4.3`` (the ``parity`` extra; 4.3.0 pulls no torch/transformers
change on torch 2.13 / transformers 5.24).

The boot call (raw numerics is the DEFAULT: no ``enable_compatibility_mode``, so no fold_ln,
no weight centering, no value-bias folding; weights are HF's own)::

    TransformerBridge.boot_transformers(folder, device="cpu", dtype=torch.float32,
                                        tokenizer=None or a stub)

``boot_transformers`` always loads a tokenizer: a folder with tokenizer files is fine; a
GPT-2 folder without them silently gets an empty GPT2Tokenizer (1 token); a Llama folder
without them fails (``Couldn't instantiate the backend tokenizer``), so ``boot`` passes an
in-memory WordLevel stub (``tokenizer=``) whenever the folder has no tokenizer files. A local
folder needs no network (nor ``HF_HUB_OFFLINE``: this module sets no environment variable). The
tokenizer plays no part when token ids are passed as a tensor: no BOS is prepended and no
attention mask is derived from pad ids (that only happens for lists of strings).

Verified hooks (B batch, T positions, d d_model, H heads, Hkv key/value heads, D d_head,
F d_mlp; L the layer). Checked against ``reference_from_hf`` (float32, by hand from the
folder's weights) on randomised tiny models (all weights, norm gains and biases random, so
before/after-affine alternatives differ by O(1)): GPT-2 n_layer 2, n_head 4, n_embd 32; Llama
2 layers, hidden 32, heads 4, kv heads 2, intermediate 48; B=2, T=7. Every hook below was
BIT-IDENTICAL (max diff 0) for both models, except hook_result (note *). A recomputation
with another operation order (e.g. /sqrt(D) instead of *D**-0.5) differs at <= 8e-6 (GPT-2).
``benchmarks/tl_reference.py`` re-checks it on :func:`make_tiny_models` (width 64, the
weights of :func:`randomise`): every hook within 1.4e-6 (2026-11-29).

hook                            shape       GPT-2 / Llama: exact meaning
------------------------------  ----------  ---------------------------------------------------
hook_embed                      B,T,d       W_E[ids] (wte / embed_tokens rows)
hook_pos_embed                  B,T,d       GPT-2: W_pos[arange(T)], broadcast over the batch.
                                            Llama: ABSENT from the cache - it is in hook_dict (an
                                            alias of rotary_emb.hook_out) but never fires, the
                                            rotary module returns a tuple. The RoPE tables are
                                            rotary_emb.hook_cos / hook_sin, (1,T,D) (extras=True)
blocks.L.hook_resid_pre         B,T,d       residual entering block L (embed + pos at L=0)
blocks.L.ln1.hook_scale         B,T,1       sqrt(mean(xc**2) + eps): xc = x - mean(x) (LayerNorm),
                                            xc = x (RMSNorm, no centring); eps from the HF config
blocks.L.ln1.hook_normalized    B,T,d       xc / scale (GPT-2), x * rsqrt(mean(x**2) + eps)
                                            (Llama): BEFORE the norm's weight (and bias)
blocks.L.attn.hook_q            B,T,H,D     q projection of the ln1 output (+ bias for GPT-2),
                                            split into heads, BEFORE rotary
blocks.L.attn.hook_k            B,T,Hkv,D   k projection, before rotary; GQA: NOT expanded
blocks.L.attn.hook_v            B,T,Hkv,D   v projection; GQA: NOT expanded
blocks.L.attn.hook_rot_q        B,T,H,D     Llama only: q after RoPE (HF rotate-half)
blocks.L.attn.hook_rot_k        B,T,Hkv,D   Llama only: k after RoPE, before repeat_kv
blocks.L.attn.hook_attn_scores  B,H,Tq,Tk   q.k^T * D**-0.5 (Llama: rot_q . repeat_kv(rot_k)),
                                            pre-softmax, causal mask APPLIED: future positions
                                            hold torch.finfo(float32).min (-3.4028e38), not -inf
                                            (-inf only after enable_compatibility_mode)
blocks.L.attn.hook_pattern      B,H,Tq,Tk   softmax(scores, -1): rows sum to 1, exact 0 above
                                            the diagonal
blocks.L.attn.hook_z            B,T,H,D     pattern @ v (v repeated to H heads for GQA): the
                                            per-head output BEFORE the output projection (it is
                                            the o_proj / c_proj input, reshaped)
blocks.L.attn.hook_result       B,T,H,d     only with cache(..., attn_result=True), i.e.
                                            bridge.set_use_attn_result(True): z_h @ W_O[h] per
                                            head, WITHOUT b_O; sum over heads + b_O ==
                                            hook_attn_out. Otherwise never fires. (*)
blocks.L.hook_attn_out          B,T,d       o_proj(z), incl. b_O for GPT-2
blocks.L.hook_resid_mid         B,T,d       resid_pre + attn_out
blocks.L.ln2.hook_scale         B,T,1       as ln1, on resid_mid
blocks.L.ln2.hook_normalized    B,T,d       as ln1, before weight / bias
blocks.L.mlp.hook_pre           B,T,F       GPT-2: c_fc(ln2 out) incl. bias, BEFORE gelu_new.
                                            Llama: gate_proj(ln2 out), BEFORE SiLU
blocks.L.mlp.hook_pre_linear    B,T,F       Llama only: up_proj(ln2 out)
blocks.L.mlp.hook_post          B,T,F       GPT-2: gelu_new(pre). Llama: silu(gate) * up; both
                                            the down_proj / c_proj input
blocks.L.hook_mlp_out           B,T,d       c_proj / down_proj output (incl. bias for GPT-2)
blocks.L.hook_resid_post        B,T,d       resid_mid + mlp_out
ln_final.hook_scale             B,T,1       as ln1, on the last resid_post
ln_final.hook_normalized        B,T,d       as ln1, before weight / bias; logits = unembed of
                                            normalized * w (+ b)

(*) hook_result: diff 0 at layer 0; ~1e-5 at later layers against a reference run without it,
because turning it on sums the heads in another order upstream (logits move ~3e-6).

Logits: Llama's bridge logits are bit-identical to ``LlamaForCausalLM`` with
``attn_implementation="eager"`` (RMSNorm runs HF's own module). GPT-2's differ at float32
rounding (3e-6 on the random model, 1e-7 on a default-init one): the bridge's LayerNorm is a
from-scratch (x-mean)/sqrt(var+eps)*w+b, not ``F.layer_norm``, and attention is re-implemented.
Against HF's default SDPA attention expect ~1e-6..1e-3 fp32 drift. Enabling hook_result
changes logits by ~3e-6 (per-head summation order). Batch composition also moves values at
1e-6 (BLAS blocking).

Patching: ``bridge.run_with_hooks(ids, fwd_hooks=[(name, fn)])`` with
``fn(tensor, hook) -> tensor | None`` works on every hook above, in the layouts above; per-head
``hook_z`` patches (``z[:, :, h] = clean_z[:, :, h]``) propagate exactly (attn_out ==
patched_z @ W_O + b_O, checked). Inside ``fn``, ``hook.name`` is the CANONICAL name
(``blocks.0.attn.o.hook_in`` for hook_z, ``blocks.0.attn.hook_out`` for hook_attn_out), not
the alias. Editing a Llama ln hook_scale/hook_normalized warns and recomputes the norm from the
hooked value.

Time (tiny models, 8x64 tokens, 1 thread, median): bridge forward ~1.35x HF eager,
run_with_cache ~2-3x (Python hook overhead); the cache holds ~90-105 tensors for these
2-layer models.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Per-layer classic hooks, in forward order. Some do not exist for a given architecture.
LAYER_HOOKS = (
    "hook_resid_pre",
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_rot_q",
    "attn.hook_rot_k",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "attn.hook_z",
    "attn.hook_result",
    "hook_attn_out",
    "hook_resid_mid",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "mlp.hook_pre",
    "mlp.hook_pre_linear",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
)
TOP_HOOKS = ("hook_embed", "hook_pos_embed")
FINAL_HOOKS = ("ln_final.hook_scale", "ln_final.hook_normalized")
# Not classic, but what a rotary model has instead of hook_pos_embed (1, T, D).
ROTARY_EXTRAS = ("rotary_emb.hook_cos", "rotary_emb.hook_sin")

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
)


def classic_hook_names(n_layers: int) -> list[str]:
    """Every classic hook name, in forward order, for ``n_layers`` blocks."""
    names = list(TOP_HOOKS)
    for layer in range(n_layers):
        names += [f"blocks.{layer}.{h}" for h in LAYER_HOOKS]
    return names + list(FINAL_HOOKS)


def stub_tokenizer(vocab_size: int) -> Any:
    """A whitespace WordLevel tokenizer over ``t0..t{V-1}`` (id 0 is BOS/EOS): enough for boot."""
    from transformers import PreTrainedTokenizerFast

    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {("<s>" if i == 0 else f"t{i}"): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<s>", unk_token="t1"
    )


def boot(folder: str | os.PathLike, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """``TransformerBridge`` on a local HF folder: raw numerics, eval mode, offline.

    Raw numerics is boot_transformers' default (no compatibility mode, so no fold_ln /
    centering / value-bias folding, finfo.min causal mask). Attention is forced to "eager"
    by the bridge. A folder without tokenizer files gets ``stub_tokenizer``.
    """
    from transformer_lens.model_bridge import TransformerBridge

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a local Hugging Face model folder")
    if any((path / f).is_file() for f in _TOKENIZER_FILES):
        bridge = TransformerBridge.boot_transformers(
            str(path.resolve()), device=device, dtype=dtype
        )
    else:
        # The bridge re-loads a passed tokenizer by its name_or_path (to turn on
        # add_bos_token), so an in-memory one must come from a folder that still exists.
        from transformers import AutoConfig, AutoTokenizer

        with tempfile.TemporaryDirectory() as tok_dir:
            stub_tokenizer(AutoConfig.from_pretrained(path).vocab_size).save_pretrained(tok_dir)
            bridge = TransformerBridge.boot_transformers(
                str(path.resolve()),
                device=device,
                dtype=dtype,
                tokenizer=AutoTokenizer.from_pretrained(tok_dir),
            )
    bridge.eval()
    return bridge


def _as_ids(ids: Any) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(ids), dtype=torch.long)
    return t.unsqueeze(0) if t.ndim == 1 else t


def cache(
    bridge: Any, ids: Any, *, attn_result: bool = False, extras: bool = False
) -> dict[str, np.ndarray]:
    """Run ``ids`` (B, T) or (T,) and return every classic hook that fires, as numpy arrays.

    ``attn_result`` turns on per-head ``attn.hook_result`` for this call (it changes logits
    by float rounding); ``extras`` adds the rotary cos/sin tables for rotary models.
    """
    ids_t = _as_ids(ids).to(bridge.cfg.device)
    wanted = classic_hook_names(bridge.cfg.n_layers) + (list(ROTARY_EXTRAS) if extras else [])
    wanted = [n for n in wanted if n in bridge.hook_dict]
    if not attn_result:  # gated off: the bridge would warn that it never fires
        wanted = [n for n in wanted if not n.endswith("attn.hook_result")]
    if attn_result:
        bridge.set_use_attn_result(True)
    try:
        with torch.no_grad():
            _, act = bridge.run_with_cache(ids_t, names_filter=wanted)
    finally:
        if attn_result:
            bridge.set_use_attn_result(False)
    return {n: act[n].detach().float().cpu().numpy() for n in wanted if n in act}


def logits(bridge: Any, ids: Any) -> np.ndarray:
    """Bridge logits (B, T, vocab) as numpy."""
    with torch.no_grad():
        return bridge(_as_ids(ids).to(bridge.cfg.device)).float().cpu().numpy()


def reference_from_hf(folder: str | os.PathLike, ids: Any) -> dict[str, np.ndarray]:
    """The same hooks recomputed by hand in float32 from the folder's weights.

    Independent of transformer_lens: what each hook means, written out. GPT2LMHeadModel
    (standard scaling, no reorder/upcast) and LlamaForCausalLM (default RoPE) only.
    Includes ``attn.hook_result`` and the ``logits`` under key "logits".
    """
    from transformers import AutoModelForCausalLM
    from transformers.activations import ACT2FN

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    cfg = hf.config
    sd = {k: v.detach().float() for k, v in hf.state_dict().items()}
    ids_t = _as_ids(ids)
    B, T = ids_t.shape
    out: dict[str, torch.Tensor] = {}
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    neg = torch.finfo(torch.float32).min

    def attention(layer, q, k, v, wo, bo, n_heads, d_head):
        # q (B,T,H,D); k, v (B,T,Hkv,D) -> expand to H heads (repeat_kv order)
        rep = n_heads // k.shape[2]
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * d_head**-0.5
        scores = scores.masked_fill(~causal, neg)
        pattern = scores.softmax(-1)
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        result = torch.einsum("bthd,hdm->bthm", z, wo.reshape(n_heads, d_head, -1))
        attn_out = z.reshape(B, T, -1) @ wo + (bo if bo is not None else 0)
        p = f"blocks.{layer}.attn."
        out.update(
            {
                p + "hook_attn_scores": scores,
                p + "hook_pattern": pattern,
                p + "hook_z": z,
                p + "hook_result": result,
            }
        )
        return attn_out

    if cfg.model_type == "gpt2":
        assert not cfg.scale_attn_by_inverse_layer_idx and not cfg.reorder_and_upcast_attn
        H, d = cfg.n_head, cfg.n_embd
        D, eps, act = d // H, cfg.layer_norm_epsilon, ACT2FN[cfg.activation_function]

        def norm(name, x, w, b):
            xc = x - x.mean(-1, keepdim=True)
            scale = (xc.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            out[name + ".hook_scale"], out[name + ".hook_normalized"] = scale, xc / scale
            return xc / scale * w + b

        out["hook_embed"] = sd["transformer.wte.weight"][ids_t]
        out["hook_pos_embed"] = sd["transformer.wpe.weight"][:T].expand(B, T, d)
        x = out["hook_embed"] + out["hook_pos_embed"]
        for L in range(cfg.n_layer):
            p, b = f"transformer.h.{L}.", f"blocks.{L}."
            out[b + "hook_resid_pre"] = x
            y = norm(b + "ln1", x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"])
            qkv = y @ sd[p + "attn.c_attn.weight"] + sd[p + "attn.c_attn.bias"]
            q, k, v = (t.reshape(B, T, H, D) for t in qkv.split(d, -1))
            out.update({b + "attn.hook_q": q, b + "attn.hook_k": k, b + "attn.hook_v": v})
            ao = attention(
                L, q, k, v, sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"], H, D
            )
            out[b + "hook_attn_out"] = ao
            x = out[b + "hook_resid_mid"] = x + ao
            y = norm(b + "ln2", x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"])
            pre = out[b + "mlp.hook_pre"] = y @ sd[p + "mlp.c_fc.weight"] + sd[p + "mlp.c_fc.bias"]
            post = out[b + "mlp.hook_post"] = act(pre)
            mo = out[b + "hook_mlp_out"] = (
                post @ sd[p + "mlp.c_proj.weight"] + sd[p + "mlp.c_proj.bias"]
            )
            x = out[b + "hook_resid_post"] = x + mo
        y = norm("ln_final", x, sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"])
        out["logits"] = y @ sd.get("lm_head.weight", sd["transformer.wte.weight"]).T
    elif cfg.model_type == "llama":
        rope = getattr(cfg, "rope_parameters", None) or {}
        assert rope.get("rope_type", "default") == "default", "only default RoPE"
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        H, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
        D = getattr(cfg, "head_dim", None) or d // H
        eps, act = cfg.rms_norm_eps, ACT2FN[cfg.hidden_act]

        def norm(name, x, w):
            var = x.pow(2).mean(-1, keepdim=True)
            out[name + ".hook_scale"] = (var + eps).sqrt()
            n = out[name + ".hook_normalized"] = x * torch.rsqrt(var + eps)
            return w * n

        def lin(x, key):
            return x @ sd[key + ".weight"].T + sd.get(key + ".bias", 0)

        inv = 1.0 / theta ** (torch.arange(0, D, 2).float() / D)
        freqs = torch.arange(T).float()[:, None] * inv[None]
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

        def rotate(t):  # HF rotate_half convention, t (B,T,h,D)
            return t * cos + torch.cat([-t[..., D // 2 :], t[..., : D // 2]], -1) * sin

        x = out["hook_embed"] = sd["model.embed_tokens.weight"][ids_t]
        for L in range(cfg.num_hidden_layers):
            p, b = f"model.layers.{L}.", f"blocks.{L}."
            out[b + "hook_resid_pre"] = x
            y = norm(b + "ln1", x, sd[p + "input_layernorm.weight"])
            q = lin(y, p + "self_attn.q_proj").reshape(B, T, H, D)
            k = lin(y, p + "self_attn.k_proj").reshape(B, T, Hkv, D)
            v = lin(y, p + "self_attn.v_proj").reshape(B, T, Hkv, D)
            rq, rk = rotate(q), rotate(k)
            out.update(
                {
                    b + "attn.hook_q": q,
                    b + "attn.hook_k": k,
                    b + "attn.hook_v": v,
                    b + "attn.hook_rot_q": rq,
                    b + "attn.hook_rot_k": rk,
                }
            )
            ao = attention(
                L,
                rq,
                rk,
                v,
                sd[p + "self_attn.o_proj.weight"].T,
                sd.get(p + "self_attn.o_proj.bias"),
                H,
                D,
            )
            out[b + "hook_attn_out"] = ao
            x = out[b + "hook_resid_mid"] = x + ao
            y = norm(b + "ln2", x, sd[p + "post_attention_layernorm.weight"])
            g = out[b + "mlp.hook_pre"] = lin(y, p + "mlp.gate_proj")
            u = out[b + "mlp.hook_pre_linear"] = lin(y, p + "mlp.up_proj")
            post = out[b + "mlp.hook_post"] = act(g) * u
            mo = out[b + "hook_mlp_out"] = lin(post, p + "mlp.down_proj")
            x = out[b + "hook_resid_post"] = x + mo
        y = norm("ln_final", x, sd["model.norm.weight"])
        out["logits"] = y @ sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).T
    else:
        raise ValueError(f"reference_from_hf handles gpt2 and llama, not {cfg.model_type}")
    return {k: v.numpy() for k, v in out.items()}


#: the text :func:`bpe_tokenizer` learns its merges from (the patching tests' words are in it)
BPE_TEXT = (
    "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is "
    "Madrid. When Mary and John went to the store, John gave a drink to Mary. "
) * 8


def bpe_tokenizer(vocab_size: int = 300) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` (GPT-2's pre-tokenizer and decoder) of at
    most ``vocab_size`` tokens, its merges learnt from :data:`BPE_TEXT`: deterministic and
    offline, and read by both attnlm and the bridge."""
    from transformers import PreTrainedTokenizerFast

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator([BPE_TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def randomise(model: Any, seed: int = 0, std: float = 0.1) -> Any:
    """Every parameter of ``model`` drawn again: norm gains ``1 + 0.2 N(0, 1)``, norm biases
    ``0.1 N(0, 1)`` (default init, gain 1 and bias 0, cannot tell pre- from post-affine
    hooks), other weights ``std N(0, 1)`` and biases ``std / 2 N(0, 1)`` (large enough that
    attention patterns are far from uniform and a patch moves the logits by O(1))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            is_norm = "ln" in name or "norm" in name
            if is_norm:
                value = 1.0 + 0.2 * noise if name.endswith("weight") else 0.1 * noise
            else:
                value = (std if name.endswith("weight") else std / 2) * noise
            p.copy_(value.to(p.dtype))
    return model.eval()


def random_folder(
    kind: str, folder: str | os.PathLike, seed: int = 0, std: float = 0.1, **config: Any
) -> Path:
    """A random ``gpt2`` (``GPT2LMHeadModel``) or ``llama`` (``LlamaForCausalLM``, GQA) saved as
    a Hugging Face folder with :func:`bpe_tokenizer`'s files; ``config`` overrides the small
    defaults (GPT-2: 2 layers, width 64, 4 heads, vocabulary 300, 64 positions; Llama: 2
    layers, hidden 64, 4 heads, 2 key/value heads, intermediate 96)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if kind == "gpt2":
        base = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=64)
        model = GPT2LMHeadModel(GPT2Config(**{**base, "bos_token_id": None,
                                              "eos_token_id": None, **config}))  # fmt: skip
    elif kind == "llama":
        base = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=96, vocab_size=300,
                    max_position_embeddings=64)  # fmt: skip
        model = LlamaForCausalLM(LlamaConfig(**{**base, "bos_token_id": None,
                                                "eos_token_id": None, **config}))  # fmt: skip
    else:
        raise ValueError(f"random_folder makes gpt2 or llama, not {kind!r}")
    path = Path(folder)
    randomise(model, seed, std).save_pretrained(path)
    vocab = model.config.vocab_size
    bpe_tokenizer(min(vocab, 300)).save_pretrained(path)
    return path


def make_tiny_models(root: str | os.PathLike, seed: int = 0) -> dict[str, str]:
    """:func:`random_folder`'s GPT-2 and Llama at their defaults, ``{"gpt2": path, "llama":
    path}``: what ``benchmarks/tl_reference.py`` checks when given no folder."""
    return {kind: str(random_folder(kind, Path(root) / kind, seed)) for kind in ("gpt2", "llama")}


# -- TransformerLens's experiments ------------------------------------------------------------


def _logit_diff(logits: torch.Tensor, answer: int, wrong: int) -> float:
    last = logits[0, -1].float()
    return float(last[answer] - last[wrong])


def tl_patching(
    bridge: Any,
    clean: Any,
    corrupt: Any,
    answer: int,
    wrong: int,
    *,
    heads: bool = True,
    layers: int | None = None,
) -> dict[str, Any]:
    """Activation patching as TransformerLens users write it: the clean run's
    ``run_with_cache``, then one ``run_with_hooks`` of the corrupt ids per patch, a hook
    putting the clean activation in: ``blocks.L.hook_resid_pre`` at one position (``resid``,
    layers x positions) and ``blocks.L.attn.hook_z`` of one head at every position
    (``heads``, layers x heads; skipped without ``heads``); the metric is the last position's
    logit difference ``answer - wrong`` as the fraction recovered, ``(patched - corrupt) /
    (clean - corrupt)``. ``layers``: the first ``layers`` layers only."""
    clean_t, corrupt_t = _as_ids(clean), _as_ids(corrupt)
    L = bridge.cfg.n_layers if layers is None else layers
    T, H = clean_t.shape[1], bridge.cfg.n_heads
    resid = [f"blocks.{i}.hook_resid_pre" for i in range(L)]
    z = [f"blocks.{i}.attn.hook_z" for i in range(L)] if heads else []
    with torch.no_grad():
        clean_logits, clean_cache = bridge.run_with_cache(clean_t, names_filter=resid + z)
        corrupt_d = _logit_diff(bridge(corrupt_t), answer, wrong)
    clean_d = _logit_diff(clean_logits, answer, wrong)
    span = clean_d - corrupt_d

    def sweep(name: str, n: int, put) -> list[list[float]]:
        out = []
        for layer in range(L):
            row = []
            source = clean_cache[name.format(layer)]
            for j in range(n):

                def fn(act, hook, j=j, source=source):
                    act = act.clone()
                    put(act, j, source)
                    return act

                with torch.no_grad():
                    patched = bridge.run_with_hooks(corrupt_t, fwd_hooks=[(name.format(layer), fn)])
                row.append((_logit_diff(patched, answer, wrong) - corrupt_d) / span)
            out.append(row)
        return out

    def put_position(act, j, source):
        act[:, j] = source[:, j]

    def put_head(act, j, source):
        act[:, :, j] = source[:, :, j]

    out = {"clean_logit_diff": clean_d, "corrupt_logit_diff": corrupt_d,
           "resid": sweep("blocks.{}.hook_resid_pre", T, put_position)}  # fmt: skip
    if heads:
        out["heads"] = sweep("blocks.{}.attn.hook_z", H, put_head)
    return out


def _bridge_param(module: Any, name: str) -> torch.Tensor | None:
    """A norm's / projection's ``weight`` or ``bias`` through the bridge's wrapper."""
    inner = getattr(module, "original_component", None) or module
    value = getattr(inner, name, None)
    return None if value is None else value.detach()


def tl_attribution(bridge: Any, ids: Any, answer: int) -> dict[str, Any]:
    """Direct logit attribution of token ``answer`` at the last position from the bridge's
    cache (``attn_result`` on): each component's write into the residual stream
    (``hook_embed`` + ``hook_pos_embed``, every head's ``attn.hook_result``, every
    ``hook_mlp_out``, the attention output biases ``b_O``) centred (LayerNorm; not RMSNorm),
    divided by ``ln_final.hook_scale`` and dotted with ``ln_final``'s weight times
    ``W_U[:, answer]``; ``bias`` is ``ln_final``'s bias through ``W_U`` plus ``b_U``. In
    float64; ``total`` adds them up and ``logit`` is the bridge's own."""
    ids_t = _as_ids(ids)
    L = bridge.cfg.n_layers
    names = ["hook_embed", "hook_pos_embed", "ln_final.hook_scale"]
    names += [f"blocks.{i}.attn.hook_result" for i in range(L)]
    names += [f"blocks.{i}.hook_mlp_out" for i in range(L)]
    names = [n for n in names if n in bridge.hook_dict]
    bridge.set_use_attn_result(True)
    try:
        with torch.no_grad():
            logits_, act = bridge.run_with_cache(ids_t, names_filter=names)
    finally:
        bridge.set_use_attn_result(False)
    rms = "rms" in str(bridge.cfg.normalization_type).lower()
    w_final = _bridge_param(bridge.ln_final, "weight")
    b_final = _bridge_param(bridge.ln_final, "bias")
    row = bridge.W_U[:, answer].detach().double()
    direction = row if w_final is None else row * w_final.double()
    scale = act["ln_final.hook_scale"][0, -1].double()

    def through(x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        if not rms:
            x = x - x.mean(-1, keepdim=True)
        return (x / scale) @ direction

    embed = through(act["hook_embed"][0, -1])
    if "hook_pos_embed" in act:
        embed = embed + through(act["hook_pos_embed"][0, -1])
    heads = [through(act[f"blocks.{i}.attn.hook_result"][0, -1]).tolist() for i in range(L)]
    b_o = [_bridge_param(bridge.blocks[i].attn.o, "bias") for i in range(L)]
    attn_bias = sum(float(through(b)) for b in b_o if b is not None)
    mlps = [float(through(act[f"blocks.{i}.hook_mlp_out"][0, -1])) for i in range(L)]
    bias = 0.0 if b_final is None else float(b_final.double() @ row)
    b_u = _bridge_param(bridge.unembed, "bias")
    bias += 0.0 if b_u is None else float(b_u[answer])
    total = float(embed) + sum(map(sum, heads)) + attn_bias + sum(mlps) + bias
    return {"logit": float(logits_[0, -1, answer]), "embed": float(embed), "heads": heads,
            "attn_bias": attn_bias, "mlps": mlps, "bias": bias, "total": total}  # fmt: skip
