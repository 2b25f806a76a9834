"""Chat templates: the Jinja program a chat model ships to turn a conversation into the one
string it was trained on (ChatML's ``<|im_start|>user ... <|im_end|>``, Llama 3's headers,
Mistral's ``[INST]``).

A template comes with the tokenizer: ``tokenizer.chat_template`` in a GGUF file's metadata,
``chat_template`` in a Hugging Face ``tokenizer_config.json`` (a string, or a list of named
templates of which ``default`` is used), a ``chat_template.jinja`` file next to it, or a file
the user names. It is rendered the way ``transformers``' ``apply_chat_template(...,
tokenize=False)`` renders it, so the strings are identical (tested):

* jinja2's ``ImmutableSandboxedEnvironment`` (templates are untrusted code: no attribute
  access to Python internals, no mutation of the messages) with ``trim_blocks=True`` and
  ``lstrip_blocks=True`` and the ``loopcontrols`` extension (``{% break %}``);
* globals ``raise_exception(message)`` (a template refuses a conversation it cannot render,
  e.g. roles that do not alternate) and ``strftime_now(format)`` (today's date, used by
  Llama 3.1's system header); the ``tojson`` filter is ``json.dumps`` without HTML escaping
  and with ``ensure_ascii=False``;
* the ``{% generation %}`` block (which marks assistant text for training masks) renders its
  body;
* variables ``messages`` (a list of ``{"role", "content"}``, with ``tool_calls``,
  ``tool_call_id`` and ``name`` where a message has them), ``add_generation_prompt``,
  ``tools`` (None, or a list of JSON function schemas: Qwen2.5's template then writes its
  ``# Tools`` system section), ``documents`` (None) and the tokenizer's special token strings
  (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token`` ... where known).

A template that fails to compile or raises while rendering is a one-line
:class:`~attnlm.base.errors.InputError` naming where it came from; so is one that runs too long,
uses too much memory or writes too much (:mod:`attnlm.tokenizers.template_bounds`: a few
seconds, 150 MB, 16 M characters).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from attnlm.base.errors import InputError
from attnlm.base.foreign import load_json
from attnlm.base.foreign import register as _register_reader
from attnlm.tokenizers.template_bounds import (
    TemplateBudgetError,
    bounded_filter,
    bounded_render,
    bounded_sandbox,
)

#: The roles a message may have (others are passed through: templates decide).
ROLES = ("system", "user", "assistant")


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """Jinja's own ``tojson`` escapes ``<``, ``>`` and ``&`` for HTML; chat prompts want the
    plain JSON text."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    """The compiled template (cached by its text: a chat renders it once per turn)."""
    try:
        import jinja2
        from jinja2.ext import Extension
    except ImportError:  # pragma: no cover - jinja2 comes with torch
        raise InputError("chat templates need jinja2: pip install jinja2") from None

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = bounded_sandbox()(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: bounded_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _said(e: Exception) -> str:
    """What an error says, its line breaks and control characters escaped: a template's own
    text (``raise_exception``'s message) stays one printable line (found by
    fuzz/fuzz_chat_template.py)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(e))


def check_messages(messages: Any, where: str = "messages") -> list[dict[str, Any]]:
    """``messages`` as a list of ``{"role": str, "content": str}`` dicts (copies; a message's
    ``tool_calls`` list and ``tool_call_id`` / ``name`` strings are kept, as JSON data), or a
    one-line InputError naming the first bad entry."""
    if not isinstance(messages, (list, tuple)):
        raise InputError(f"{where}: expected a list of {{role, content}} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InputError(f"{where}[{i}]: expected an object with role and content")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise InputError(f"{where}[{i}]: 'role' must be a non-empty string")
        if not isinstance(content, str):
            raise InputError(f"{where}[{i}]: 'content' must be a string")
        msg: dict[str, Any] = {"role": role, "content": content}
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise InputError(f"{where}[{i}]: {key!r} must be a string")
                msg[key] = m[key]
        if m.get("tool_calls") is not None:
            calls = m["tool_calls"]
            if not isinstance(calls, (list, tuple)) or not all(
                isinstance(c, Mapping) for c in calls
            ):
                raise InputError(f"{where}[{i}]: 'tool_calls' must be a list of objects")
            msg["tool_calls"] = _json_data(list(calls), f"{where}[{i}].tool_calls")
        out.append(msg)
    return out


def _json_data(value: Any, where: str) -> Any:
    """A copy of ``value`` made of JSON types only (what a template may see), or a one-line
    InputError."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError, RecursionError) as e:
        raise InputError(f"{where}: not JSON data ({_said(e)})") from None


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """``tools`` (None, or a list of JSON function schemas such as ``{"type": "function",
    "function": {"name": ..., "description": ..., "parameters": {...}}}``) as JSON data."""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
        raise InputError("tools: expected a list of JSON function schemas (objects)")
    return _json_data(list(tools), "tools")


class ChatTemplate:
    """A chat template and the special token strings it may use.

    ``source``: the Jinja text; ``special_tokens``: e.g. ``{"bos_token": "<s>", "eos_token":
    "</s>"}`` (the names ``transformers`` passes: ``bos_token``, ``eos_token``, ``unk_token``,
    ``pad_token``, ...); ``origin``: where it came from, for error messages.
    """

    def __init__(
        self,
        source: str,
        special_tokens: Mapping[str, str | None] | None = None,
        origin: str = "chat template",
    ) -> None:
        if not isinstance(source, str) or not source.strip():
            raise InputError(f"{origin}: the chat template is empty")
        self.source = source
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.origin = origin

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The conversation as the model's prompt text (as ``apply_chat_template(messages,
        add_generation_prompt=..., tools=..., tokenize=False)``); ``tools``: JSON function
        schemas offered to the model (see :func:`check_tools`)."""
        import jinja2

        msgs = check_messages(list(messages))
        schemas = check_tools(tools)
        try:
            template = _compile(self.source)
        except jinja2.TemplateSyntaxError as e:
            where = f"{self.origin}: not a valid template"
            raise InputError(f"{where} (line {e.lineno}: {_said(e)})") from None
        except (SyntaxError, RecursionError) as e:  # jinja2 parsed it, Python refused its code
            # (`{% break %}` outside a loop: found by fuzz/fuzz_chat_template.py), or too deep
            what = f"{type(e).__name__}: {_said(e)}"
            raise InputError(f"{self.origin}: not a valid template ({what})") from None
        extra = 4 * sum(len(m["content"]) for m in msgs)  # a long conversation's own length
        extra += 4 * len(json.dumps(schemas)) if schemas else 0
        try:
            return bounded_render(
                template,
                extra,
                messages=msgs,
                tools=schemas,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except TemplateBudgetError as e:
            raise InputError(f"{self.origin}: the template was stopped: {e}") from None
        except jinja2.TemplateError as e:
            refused = f"{self.origin}: the template refused the conversation: {_said(e)}"
            raise InputError(refused) from None
        except (
            TypeError,
            ValueError,
            KeyError,
            AttributeError,
            IndexError,
            ArithmeticError,
            RecursionError,
        ) as e:  # the sandbox's "Range too big" is an OverflowError
            what = f"{type(e).__name__}: {_said(e)}"
            raise InputError(f"{self.origin}: the template failed ({what})") from None

    def __repr__(self) -> str:
        return f"ChatTemplate(origin={self.origin!r}, {len(self.source)} characters)"


def from_string(
    source: str, bos_token: str | None = None, eos_token: str | None = None, **special: str | None
) -> ChatTemplate:
    """A template from its text and special token strings, wherever it came from (a GGUF
    file's ``tokenizer.chat_template`` and the texts of its BOS/EOS ids, for example)."""
    return ChatTemplate(
        source, {"bos_token": bos_token, "eos_token": eos_token, **special}, origin="chat template"
    )


def _token_text(value: Any) -> str | None:
    """A special token in ``tokenizer_config.json``: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")  # fmt: skip


def hf_folder_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``special_tokens_map.json`` updated by ``tokenizer_config.json`` ({} when neither is
    there); invalid JSON is a one-line InputError."""
    config: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
        p = Path(folder) / name
        if p.is_file():
            doc = load_json(p, name, expect=None)
            if isinstance(doc, dict):
                config.update(doc)
    return config


def hf_special_tokens(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The special token strings a Hugging Face folder's tokenizer config names
    (``bos_token``, ``eos_token``, ...)."""
    config = hf_folder_config(folder)
    found = {k: _token_text(config.get(k)) for k in SPECIAL_NAMES}
    return {k: v for k, v in found.items() if v is not None}


def from_hf_folder(folder: str | os.PathLike[str]) -> ChatTemplate | None:
    """The template of a Hugging Face model folder: ``chat_template.jinja`` if present, else
    ``chat_template`` in ``tokenizer_config.json`` (a string, or a list of ``{name,
    template}`` of which ``default`` is used); special tokens from ``tokenizer_config.json``
    (and ``special_tokens_map.json``). None when the folder has no template."""
    folder = Path(folder)
    config = hf_folder_config(folder)
    special = hf_special_tokens(folder)
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return ChatTemplate(_read(jinja_file), special, origin=str(jinja_file))
    source = config.get("chat_template")
    where = f"{folder / 'tokenizer_config.json'}: chat_template"
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        source = named.get("default")
        if source is None:
            return None
    if source is None:
        return None
    if not isinstance(source, str):
        raise InputError(f"{where} must be a string")
    return ChatTemplate(source, special, origin=where)


def from_file(path: str | os.PathLike[str], special: Mapping[str, str | None] | None = None):
    """A template from a file the user names (``--template FILE``), with the model's special
    token strings."""
    return ChatTemplate(_read(Path(path)), special, origin=str(path))


def _read(path: Path) -> str:
    from attnlm.base.fileio import read_file_text

    return read_file_text(path, "chat template", InputError)


_register_reader("Hugging Face model folder", f"{__name__}.hf_folder_config")


# -- what ends a reply -----------------------------------------------------------------------

#: Tokens that end an assistant turn in popular chat formats (besides the EOS token).
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def stop_ids(tok: Any, special: dict[str, str], folder: Path | None) -> tuple[int, ...]:
    """The ids that end a reply: the EOS token (from the special token strings, or the
    model's ``generation_config.json`` ``eos_token_id``) and the end-of-turn tokens of
    :data:`END_OF_TURN` that the vocabulary has as special tokens (a harmony vocabulary's
    :func:`~attnlm.tokenizers.harmony.harmony_stops`)."""
    from attnlm.tokenizers.harmony import harmony_stops, special_tokens_of

    specials = special_tokens_of(tok)
    out: list[int] = []
    eos = special.get("eos_token")
    if eos in specials:
        out.append(specials[eos])
    if folder is not None and (folder / "generation_config.json").is_file():
        gen = load_json(folder / "generation_config.json", "generation_config.json")
        ids = gen.get("eos_token_id") if isinstance(gen, dict) else None
        ids = [ids] if isinstance(ids, int) else ids if isinstance(ids, list) else []
        out += [i for i in ids if isinstance(i, int)]
    out += [specials[t] for t in END_OF_TURN if t in specials]
    size = getattr(tok, "vocab_size", None)  # a generation_config may name an id not in it
    found = tuple(i for i in dict.fromkeys(out) if size is None or 0 <= i < size)
    return harmony_stops(specials, found)  # (gpt-oss: its reply ends, not <|end|>)


_register_reader("Hugging Face model folder", f"{__name__}.stop_ids")
