"""Instruction-tuning data for ``mdsl-run --train DATA``: examples with a loss mask, batched padded or packed.

``DATA`` is a text file (one ``"text"`` example) or a ``.jsonl`` file whose lines are all of one kind:

* ``{"text": "..."}``: the loss on every token (the document followed by EOS, as :mod:`modeldsl.runtime.data`);
* ``{"prompt": "...", "completion": "..."}``: the loss on the completion's tokens and the EOS after it;
* ``{"messages": [{"role": ..., "content": ...}, ...]}`` (and optionally ``"tools"``): the chat rendered with
  the checkpoint's chat template exactly as transformers' ``apply_chat_template`` renders and tokenizes it,
  the loss on the assistant messages' tokens.

Each example becomes ``(ids, mask)``: int64 token ids and a bool mask, True where the token is a target.
:class:`InstructionBatches` cuts rows of ``seq + 1`` tokens from them, one example per row (``padded``) or
several (``packed``, with the segment and position of every token), with labels ``-100`` wherever a token is
no target of the token before it: padding, prompts, and the step from one example into the next.

Problems are coded diagnostics: a missing or unreadable file E028; a line that is not JSON, a field of the
wrong type, a mix of kinds, a chat without a chat template or one the template fails to render E030, with
``file:line:column`` and a caret under the line's field.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span

IGNORE = -100  # the label of a token that is no target
PACKINGS = ("packed", "padded")
# The named special tokens transformers passes to every chat template (PreTrainedTokenizerBase.special_tokens_map)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
CHAT_TEMPLATE_FILE = "chat_template.jinja"
FORMATS_HINT = ('each line of a .jsonl file is one JSON object: {"text": ...}, {"prompt": ..., "completion": ...} '
                'or {"messages": [{"role": ..., "content": ...}, ...]}, all lines of one kind')
NO_TEMPLATE_HINT = ('give the checkpoint its chat template ("chat_template" in tokenizer_config.json, or a '
                    'chat_template.jinja file next to it), or write the data as {"prompt", "completion"} lines')

OffsetEncode = Callable[[str, bool], tuple[list[int], list[tuple[int, int]]]]


def _error(code: str, message: str, hint: str = "", span: Span | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, message, span, hint)])


def _type_name(value) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__)


# --- reading the lines -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One example as the file holds it: its kind (``text``, ``prompt`` or ``messages``), its JSON object
    and the line it stands on (a span over the whole line)."""

    kind: str
    fields: dict
    span: Span
    line: str = ""  # the line's text

    def field_span(self, *path: str | int) -> Span:
        """The span of the value at ``path`` (object keys and list indices) on this record's line."""
        start, end = _value_bounds(self.line, path)
        return Span(self.span.source, self.span.line, start + 1, self.span.line, end + 1)


def read_text(path: str | Path) -> str:
    """The UTF-8 text of ``path`` (a byte-order mark dropped); E028 when it cannot be read, E030 when not UTF-8."""
    path = Path(path)
    hint = 'give a text file or a .jsonl file with "text", "prompt"/"completion" or "messages" lines'
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO or device: reading would block
        raise _error("E028", f"the training data '{path}' is not a regular file (a FIFO, device or socket)", hint)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise _error("E028", f"no such training data file '{path}'", hint) from None
    except IsADirectoryError:
        raise _error("E028", f"the training data '{path}' is a folder, not a file", hint) from None
    except OSError as err:
        raise _error("E028", f"cannot read the training data '{path}': {err.strerror or err}",
                     "give a readable file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise _error("E030", f"{path}:{line}:{column}: the training data is not UTF-8 text (byte "
                     f"0x{raw[err.start]:02x} at offset {err.start})", "convert the file to UTF-8") from None
    return text[1:] if text.startswith("\ufeff") else text


def read_records(path: str | Path) -> list[Record]:
    """The examples of ``path`` as records: a text file is one ``text`` record; a ``.jsonl`` file one record per
    non-blank line, all of one kind (E030 naming the first line that is malformed or of another kind)."""
    path = Path(path)
    text = read_text(path)
    source = Source(str(path), text)
    if path.suffix.lower() != ".jsonl":
        lines = text.split("\n")
        return [Record("text", {"text": text}, Span(source, 1, 1, len(lines), len(lines[-1]) + 1))]
    records: list[Record] = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        record = _record_of_line(source, number, line)
        if records and record.kind != records[0].kind:
            first = records[0]
            raise _error("E030", f"{path}:{number}: a \"{record.kind}\" line among \"{first.kind}\" lines (line "
                         f"{first.span.line} is a \"{first.kind}\" line)", "give all lines of the file one kind: "
                         "text, prompt/completion or messages", record.field_span(record.kind))
        records.append(record)
    return records


def _record_of_line(source: Source, number: int, line: str) -> Record:
    where = f"{source.name}:{number}"
    whole = Span(source, number, 1, number, len(line) + 1)
    try:
        fields = json.loads(line)
    except json.JSONDecodeError as err:
        span = Span(source, number, err.colno, number, err.colno + 1)
        raise _error("E030", f"{where}: not a JSON object: {err.msg}", FORMATS_HINT, span) from None
    if not isinstance(fields, dict):
        raise _error("E030", f"{where}: the line is a JSON {_type_name(fields)}, not an object", FORMATS_HINT, whole)
    record = Record(_kind_of(fields, where, whole), fields, whole, line)
    _check_fields(record, where)
    return record


def _kind_of(fields: dict, where: str, whole: Span) -> str:
    kinds = [kind for kind, keys in (("text", ("text",)), ("prompt", ("prompt", "completion")),
                                     ("messages", ("messages",))) if any(key in fields for key in keys)]
    if not kinds:
        raise _error("E030", f"{where}: the line has no \"text\", \"prompt\"/\"completion\" or \"messages\" field",
                     FORMATS_HINT, whole)
    if len(kinds) > 1:
        names = " and ".join(f'"{kind}"' for kind in kinds)
        raise _error("E030", f"{where}: the line has both {names} fields: which is the example?", FORMATS_HINT, whole)
    return kinds[0]


def _check_fields(record: Record, where: str) -> None:
    fields = record.fields
    if record.kind == "text":
        _check_string(record, where, "text")
    elif record.kind == "prompt":
        for key, other in (("prompt", "completion"), ("completion", "prompt")):
            if key not in fields:
                raise _error("E030", f"{where}: the line has \"{other}\" but no \"{key}\"",
                             'a prompt/completion line holds both: {"prompt": "...", "completion": "..."}',
                             record.field_span(other))
            _check_string(record, where, key)
    else:
        _check_messages(record, where)


def _check_string(record: Record, where: str, key: str) -> None:
    value = record.fields[key]
    if not isinstance(value, str):
        raise _error("E030", f"{where}: \"{key}\" is a {_type_name(value)}, not a string",
                     f"the \"{key}\" field holds its text as a JSON string", record.field_span(key))


def _check_messages(record: Record, where: str) -> None:
    messages = record.fields["messages"]
    shape = 'a chat is {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}'
    if not isinstance(messages, list) or not messages:
        what = "an empty list" if isinstance(messages, list) else f"a {_type_name(messages)}, not a list"
        raise _error("E030", f"{where}: \"messages\" is {what}", shape, record.field_span("messages"))
    for index, message in enumerate(messages):
        _check_message(record, where, index, message, shape)
    if not any(message["role"] == "assistant" for message in messages):
        raise _error("E030", f"{where}: the chat has no \"assistant\" message: no token of it is a target",
                     "the loss is on the assistant messages; give each chat at least one",
                     record.field_span("messages"))
    tools = record.fields.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
        raise _error("E030", f"{where}: \"tools\" is a {_type_name(tools)}, not a list of objects",
                     "\"tools\" lists the chat's tools as JSON schemas, as apply_chat_template takes them",
                     record.field_span("tools"))


def _check_message(record: Record, where: str, index: int, message, shape: str) -> None:
    name = f"message {index + 1}"
    if not isinstance(message, dict):
        raise _error("E030", f"{where}: {name} is a {_type_name(message)}, not an object", shape,
                     record.field_span("messages", index))
    role = message.get("role")
    if not isinstance(role, str) or not role:
        what = "has no \"role\"" if role is None else f"has a \"role\" that is {_describe(role)}"
        span = record.field_span("messages", index, *(("role",) if "role" in message else ()))
        raise _error("E030", f"{where}: {name} {what}, not a role name such as \"user\" or \"assistant\"", shape,
                     span)
    content = message.get("content")
    if content is None and message.get("tool_calls"):
        return  # an assistant message that only calls tools
    if isinstance(content, str) or (isinstance(content, list) and all(isinstance(part, dict) for part in content)):
        return
    what = "has no \"content\"" if "content" not in message else f"has a \"content\" that is {_describe(content)}"
    span = record.field_span("messages", index, *(("content",) if "content" in message else ()))
    raise _error("E030", f"{where}: {name} ({role}) {what}",
                 "a message's \"content\" is a string (or a list of content objects)", span)


def _describe(value) -> str:
    return "an empty string" if value == "" else f"a {_type_name(value)}"


_SPACE = re.compile(r"[ \t\n\r]*")


def _value_bounds(text: str, path: Sequence[str | int]) -> tuple[int, int]:
    """The 0-based ``[start, end)`` of the value at ``path`` in the JSON ``text`` (the last of repeated keys,
    as ``json.loads`` keeps it); the deepest value found where the path goes further than the text."""
    decoder = json.JSONDecoder()
    start = _SPACE.match(text, 0).end()
    for step in path:
        child = _child_start(text, start, step, decoder)
        if child is None:
            break
        start = child
    return start, decoder.raw_decode(text, start)[1]


def _child_start(text: str, start: int, step: str | int, decoder: json.JSONDecoder) -> int | None:
    from json.decoder import scanstring

    if text[start] not in "{[":
        return None
    closer = "}" if text[start] == "{" else "]"
    pos, index, found = _SPACE.match(text, start + 1).end(), 0, None
    while text[pos] != closer:
        if closer == "}":
            key, pos = scanstring(text, pos + 1)
            pos = _SPACE.match(text, _SPACE.match(text, pos).end() + 1).end()  # past the ':'
            hit = key == step
        else:
            hit = index == step
        if hit:
            found = pos
        pos = _SPACE.match(text, decoder.raw_decode(text, pos)[1]).end()
        if text[pos] == ",":
            pos = _SPACE.match(text, pos + 1).end()
        index += 1
    return found


# --- chat templates ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatTemplate:
    """A checkpoint's jinja chat template and the special tokens it sees, rendered as transformers renders it."""

    source: str
    special_tokens: dict[str, str]
    origin: str = "the chat template"  # where it was read, for diagnostics

    @classmethod
    def from_folder(cls, folder: str | Path) -> ChatTemplate | None:
        """The template of the checkpoint in ``folder``, as transformers reads it: ``chat_template.jinja``, else
        ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{"name", "template"}`` of which
        ``default`` is used); None where there is none."""
        folder = Path(folder)
        config = _tokenizer_config(folder)
        special = {name: token for name in SPECIAL_TOKEN_NAMES if (token := _token_text(config.get(name))) is not None}
        path = folder / CHAT_TEMPLATE_FILE
        if path.exists():
            return cls(_read_template_file(path), special, str(path))
        where = str(folder / "tokenizer_config.json")
        template = config.get("chat_template")
        if template is None:
            return None
        if isinstance(template, list):
            template = _default_template(template, where)
        if not isinstance(template, str):
            raise _error("E030", f"{where}: \"chat_template\" is a {_type_name(template)}, not a string",
                         "the chat template is a jinja string, or a list of {\"name\", \"template\"}")
        return cls(template, special, f"{where} (\"chat_template\")")

    @property
    def has_generation_blocks(self) -> bool:
        """Whether the template marks the assistant's text with ``{% generation %}`` blocks."""
        return re.search(r"\{%-?\s*generation\s*-?%\}", self.source) is not None

    def render(self, messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None) -> str:
        """The chat as text, exactly as ``apply_chat_template(messages, tokenize=False)`` renders it."""
        return _compiled(self.source, self.origin).render(**self._variables(messages, add_generation_prompt, tools))

    def render_with_generation_spans(self, messages: list[dict], tools: list[dict] | None = None
                                     ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered chat and the character ranges its ``{% generation %}`` blocks rendered into."""
        template = _compiled(self.source, self.origin)
        pieces: list[str] = []
        spans: list[tuple[int, int]] = []
        token = _GENERATION_TRACKING.set((pieces, spans))
        try:
            for piece in template.generate(**self._variables(messages, False, tools)):
                pieces.append(piece)
        finally:
            _GENERATION_TRACKING.reset(token)
        return "".join(pieces), spans

    def assistant_spans(self, messages: list[dict], tools: list[dict] | None = None
                        ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered chat and the character ranges of its assistant messages: the template's generation blocks
        where it has them, else, for assistant message ``i``, from the end of ``messages[:i]`` rendered with the
        generation prompt to the end of ``messages[:i + 1]`` (:class:`TemplatePrefixError` where those are no
        prefixes of the whole chat)."""
        if self.has_generation_blocks:
            return self.render_with_generation_spans(messages, tools)
        chat = self.render(messages, tools=tools)
        spans = []
        for index, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render(messages[:index], add_generation_prompt=True, tools=tools)
            through = self.render(messages[: index + 1], tools=tools)
            if not (chat.startswith(through) and through.startswith(before)):
                raise TemplatePrefixError(f"it renders the chat up to message {index + 1} otherwise than in the "
                                          "whole chat")
            spans.append((len(before), len(through)))
        return chat, spans

    def _variables(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None) -> dict:
        return {"messages": _template_messages(messages), "tools": tools, "documents": None,
                "add_generation_prompt": add_generation_prompt, **self.special_tokens}


class TemplatePrefixError(ValueError):
    """A template without generation blocks renders the start of a chat otherwise than the whole chat."""


def _tokenizer_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise _error("E030", f"cannot read {path}: {err}", "replace it with the checkpoint's original "
                     "tokenizer_config.json") from None
    if not isinstance(config, dict):
        raise _error("E030", f"{path} is a JSON {_type_name(config)}, not an object",
                     "replace it with the checkpoint's original tokenizer_config.json")
    return config


def _token_text(token) -> str | None:
    """A special token of tokenizer_config.json as text: a string, or an AddedToken's ``{"content": ...}``."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _read_template_file(path: Path) -> str:
    if not path.is_file():
        raise _error("E028", f"the chat template '{path}' is not a regular file",
                     "replace it with the checkpoint's chat_template.jinja, or remove it")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise _error("E028", f"cannot read the chat template '{path}': {err}",
                     "replace it with the checkpoint's chat_template.jinja, or remove it") from None


def _default_template(templates: list, where: str) -> str:
    named = {entry.get("name"): entry.get("template") for entry in templates if isinstance(entry, dict)}
    if "default" not in named:
        raise _error("E030", f"{where}: \"chat_template\" names templates {sorted(map(str, named))} but no "
                     "\"default\"", "name the template for chats \"default\"")
    return named["default"]


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _template_messages(messages: list[dict]) -> list[dict]:
    """The messages as transformers hands them to the template: keys whose value is null dropped, and a message's
    reasoning under ``reasoning_content`` and ``thinking`` wherever it has it under one of their names."""
    prepared = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


_GENERATION_TRACKING: ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = ContextVar(
    "generation_tracking", default=None)


@functools.lru_cache(maxsize=16)
def _compiled(source: str, origin: str):
    """The template compiled in the sandbox (E030 naming ``origin`` when it is no valid jinja)."""
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as err:
        raise _error("E030", f"{origin} is not a valid jinja template: line {err.lineno}: {err.message}",
                     "replace it with the checkpoint's original chat template") from None


@functools.lru_cache(maxsize=1)
def _environment():
    """The sandboxed jinja environment of transformers' chat templates: trimmed blocks, loop controls,
    ``{% generation %}`` blocks, its ``tojson``, ``raise_exception``, ``strftime_now``, a ``dict`` and a
    ``namespace`` that cannot reach Python's internals."""
    from datetime import datetime

    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlocks(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders the body and, while tracking, records where it went."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_record", []), [], [], body).set_lineno(lineno)

        def _record(self, caller):
            text = caller()
            tracking = _GENERATION_TRACKING.get()
            if tracking is not None:
                pieces, spans = tracking
                start = sum(len(piece) for piece in pieces)
                spans.append((start, start + len(text)))
            return text

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attributes = dict(*args, **kwargs)
            for name in attributes:
                TemplateNamespace.check_name(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name, value):
            TemplateNamespace.check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[GenerationBlocks, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                               dict=TemplateDict(), namespace=TemplateNamespace)
    return environment


# --- examples ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One example's tokens (int64) and loss mask (bool, True where the token is a target)."""

    ids: np.ndarray
    mask: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", np.asarray(self.ids, dtype=np.int64))
        object.__setattr__(self, "mask", np.asarray(self.mask, dtype=bool))
        if self.ids.shape != self.mask.shape or self.ids.ndim != 1:
            raise ValueError(f"ids {self.ids.shape} and mask {self.mask.shape} are not one sequence")

    def __len__(self) -> int:
        return len(self.ids)


def offset_encoder(tokenizer) -> OffsetEncode:
    """``encode(text, add_special_tokens) -> (ids, offsets)`` for a :class:`modeldsl.tokenizer.Tokenizer`: the
    tokenizer.json's ids and character offsets, or UTF-8 bytes, each byte at its character's offset."""
    inner = tokenizer.inner
    if inner is None:
        return _byte_encode

    def encode(text: str, add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]]:
        encoding = inner.encode(text, add_special_tokens=add_special_tokens)
        return encoding.ids, encoding.offsets

    return encode


def _byte_encode(text: str, add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]]:
    ids, offsets = [], []
    for index, char in enumerate(text):
        data = char.encode("utf-8", errors="surrogatepass")
        ids += data
        offsets += [(index, index + 1)] * len(data)
    return ids, offsets


def tokens_in_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Which tokens overlap a character span (transformers' rule for ``return_assistant_tokens_mask``)."""
    if not len(offsets):
        return np.zeros(0, dtype=bool)
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(bounds), dtype=bool)
    for start, end in spans:
        mask |= (bounds[:, 1] > start) & (bounds[:, 0] < end)
    return mask


def text_example(text: str, encode: OffsetEncode, eos: int | None) -> Example:
    """A document with the loss on every token, EOS after it (as the plain data pipeline tokenizes it)."""
    ids, _ = encode(text, True)
    ids = list(ids) + ([eos] if eos is not None and (ids or text) else [])
    return Example(ids, np.ones(len(ids), dtype=bool))


def prompt_completion_example(prompt: str, completion: str, encode: OffsetEncode, eos: int | None) -> Example:
    """``prompt + completion`` tokenized together, the loss on the completion's tokens and the EOS after it."""
    ids, offsets = encode(prompt + completion, True)
    mask = tokens_in_spans(offsets, [(len(prompt), len(prompt) + len(completion))])
    if eos is not None:
        ids, mask = list(ids) + [eos], np.append(mask, True)
    return Example(ids, mask)


def chat_example(messages: list[dict], template: ChatTemplate, encode: OffsetEncode,
                 tools: list[dict] | None = None) -> Example:
    """The chat rendered with ``template`` and tokenized without adding special tokens (as
    ``apply_chat_template(messages, tokenize=True)``), the loss on the tokens of its assistant messages."""
    text, spans = template.assistant_spans(messages, tools)
    ids, offsets = encode(text, False)
    return Example(ids, tokens_in_spans(offsets, spans))


def example_of_record(record: Record, encode: OffsetEncode, template: ChatTemplate | None,
                      eos: int | None) -> Example:
    """The example of one record (E030 naming its line where its chat cannot be rendered)."""
    fields = record.fields
    if record.kind == "text":
        return text_example(fields["text"], encode, eos)
    if record.kind == "prompt":
        return prompt_completion_example(fields["prompt"], fields["completion"], encode, eos)
    where = f"{record.span.source.name}:{record.span.line}"
    if template is None:
        raise _error("E030", f"{where}: the checkpoint has no chat template to render the \"messages\" with",
                     NO_TEMPLATE_HINT, record.field_span("messages"))
    try:
        return chat_example(fields["messages"], template, encode, fields.get("tools"))
    except DiagnosticError:
        raise
    except TemplatePrefixError as err:
        raise _error("E030", f"{where}: {template.origin} cannot show where the assistant's text is in this chat: "
                     f"{err}", "wrap the assistant's text in the template in {% generation %}...{% endgeneration %}, "
                     "or write the data as prompt/completion lines", record.field_span("messages")) from None
    except Exception as err:  # noqa: BLE001 - a template can fail in any way (its raise_exception, a TypeError, ...)
        raise _error("E030", f"{where}: {template.origin} fails on this chat: {type(err).__name__}: {err}",
                     "fix the chat (the template may require alternating user/assistant roles), or the template",
                     record.field_span("messages")) from None


def read_examples(path: str | Path, folder: str | Path, tokenizer, eos: int | None) -> list[Example]:
    """Every example of the training data ``path`` for the checkpoint in ``folder`` (its chat template is read only
    for a chat file), tokenized with ``tokenizer`` (a :class:`modeldsl.tokenizer.Tokenizer`), EOS ``eos`` after
    texts and completions; examples without tokens are dropped, data without a single target is E030."""
    records = read_records(path)
    template = ChatTemplate.from_folder(folder) if records and records[0].kind == "messages" else None
    encode = offset_encoder(tokenizer)
    examples = [example for record in records if len(example := example_of_record(record, encode, template, eos))]
    if not any(example.mask[1:].any() for example in examples):
        raise _error("E030", f"the training data '{path}' holds no token to train on",
                     "give texts, completions or assistant messages with some text")
    return examples


def pad_token_id(folder: str | Path, tokenizer, eos: int | None) -> int:
    """The id rows are padded with: tokenizer_config.json's ``pad_token``, else ``eos``, else 0."""
    if tokenizer.inner is not None:
        token = _token_text(_tokenizer_config(Path(folder)).get("pad_token"))
        pad = tokenizer.inner.token_to_id(token) if token is not None else None
        if pad is not None:
            return pad
    return eos if eos is not None else 0


def examples_fingerprint(examples: Sequence[Example]) -> str:
    """The sha256 of the examples' lengths, ids and masks (a resumed run checks it is reading the same data)."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(np.int64(len(example)).astype("<i8").tobytes())
        digest.update(np.ascontiguousarray(example.ids, dtype="<i8").tobytes())
        digest.update(np.packbits(example.mask).tobytes())
    return digest.hexdigest()


# --- batches -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """``[batch, seq]`` int64 arrays: the inputs; their labels (the next token where it is a target of the same
    example, else -100); each token's segment (its example's index within the row, padding one more) and its
    position within its segment."""

    inputs: np.ndarray
    labels: np.ndarray
    segments: np.ndarray
    positions: np.ndarray


def label_count(batch: Batch | np.ndarray) -> int:
    """How many labels of a batch (or of a labels array) are targets, not -100."""
    labels = batch.labels if isinstance(batch, Batch) else np.asarray(batch)
    return int(np.count_nonzero(labels != IGNORE))


def build_row(examples: Sequence[Example], seq: int, pad: int) -> tuple[np.ndarray, ...]:
    """One row of ``seq + 1`` tokens from ``examples`` in order (the last cut where it overflows, padding after):
    ``(inputs, labels, segments, positions)``, each ``[seq]``."""
    size = seq + 1
    tokens = np.full(size, pad, dtype=np.int64)
    targets = np.zeros(size, dtype=bool)
    segments = np.full(size, len(examples), dtype=np.int64)
    starts = np.zeros(size, dtype=np.int64)
    offset = 0
    for index, example in enumerate(examples):
        length = min(len(example), size - offset)
        tokens[offset : offset + length] = example.ids[:length]
        targets[offset : offset + length] = example.mask[:length]
        segments[offset : offset + length] = index
        starts[offset : offset + length] = offset
        offset += length
    starts[offset:] = offset
    same_example = segments[1:] == segments[:-1]
    labels = np.where(targets[1:] & same_example, tokens[1:], IGNORE)
    positions = np.arange(size, dtype=np.int64) - starts
    return tokens[:-1], labels, segments[:-1], positions[:-1]


@dataclass
class InstructionBatches:
    """Rows of ``seq + 1`` tokens from the examples in order, cycling over them and counting epochs: one example
    per row (``padded``) or as many whole examples as fit (``packed``; an example never straddles two rows, one
    longer than a row is cut). ``position`` (the next example) and ``epoch`` are all its state."""

    examples: Sequence[Example]
    seq: int
    packing: str = "packed"
    pad: int = 0
    position: int = 0
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.seq < 1:
            raise ValueError(f"seq must be at least 1, got {self.seq}")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {self.packing!r}")
        self.examples = list(self.examples)
        if not self.examples or any(len(example) == 0 for example in self.examples):
            raise ValueError("there are no examples, or one without tokens")
        self.position, wraps = self.position % len(self.examples), self.position // len(self.examples)
        self.epoch += wraps

    @classmethod
    def from_state(cls, examples: Sequence[Example], seq: int, state: dict, packing: str = "packed",
                   pad: int = 0) -> InstructionBatches:
        """Batches that continue where those whose :meth:`state` was saved stopped."""
        return cls(examples, seq, packing, pad, int(state.get("position", 0)), int(state.get("epoch", 0)))

    @property
    def fingerprint(self) -> str:
        return examples_fingerprint(self.examples)

    @property
    def truncated(self) -> int:
        """How many examples are longer than a row of ``seq + 1`` tokens (their end is never trained on)."""
        return sum(len(example) > self.seq + 1 for example in self.examples)

    def _take(self) -> Example:
        example = self.examples[self.position]
        self.position += 1
        if self.position == len(self.examples):
            self.position, self.epoch = 0, self.epoch + 1
        return example

    def _row_examples(self) -> list[Example]:
        row = [self._take()]
        if self.packing == "packed":
            room = self.seq + 1 - len(row[0])
            while len(self.examples[self.position]) <= room:
                room -= len(self.examples[self.position])
                row.append(self._take())
        return row

    def next_row(self) -> tuple[np.ndarray, ...]:
        """``(inputs, labels, segments, positions)`` of the next row, each ``[seq]`` int64."""
        return build_row(self._row_examples(), self.seq, self.pad)

    def next_batch(self, batch: int) -> Batch:
        rows = [self.next_row() for _ in range(batch)]
        return Batch(*(np.stack(column) for column in zip(*rows)))

    def micro_batches(self, batch: int, count: int) -> list[Batch]:
        """The ``count`` micro-batches of one optimizer step."""
        return [self.next_batch(batch) for _ in range(count)]

    def state(self) -> dict[str, int]:
        return {"position": int(self.position), "epoch": int(self.epoch)}


# --- what the trainer reads --------------------------------------------------------------------------------------


def is_instruction_data(path: str | Path) -> bool:
    """Whether ``path`` is a ``.jsonl`` file of prompt/completion or chat examples (E030 for a malformed one)."""
    if Path(path).suffix.lower() != ".jsonl":
        return False
    records = read_records(path)
    return bool(records) and records[0].kind != "text"


@dataclass
class InstructionData:
    """Instruction-tuning data as the trainer reads it: the examples with a target inside a row
    (one per row, right-padded), and how many were cut or left out."""

    examples: list[Example]
    kind: str  # "prompt/completion" or "chat"
    seq: int
    pad: int
    left_out: int = 0  # examples without a target in their first seq + 1 tokens

    @classmethod
    def read(cls, path: str | Path, folder: str | Path, tokenizer, eos: int | None, seq: int) -> InstructionData:
        records = read_records(path)
        examples = read_examples(path, folder, tokenizer, eos)
        usable = [e for e in examples if e.mask[1:seq + 1].any()]
        if not usable:
            raise _error("E030", f"no example of the training data '{path}' has a token to train on in its first "
                         f"{seq + 1} tokens", "give a longer --seq, or shorter prompts")
        kind = "chat" if records[0].kind == "messages" else "prompt/completion"
        return cls(usable, kind, seq, pad_token_id(folder, tokenizer, eos), len(examples) - len(usable))

    @property
    def tokens(self) -> np.ndarray:
        return np.concatenate([e.ids for e in self.examples])

    def batches(self, state: dict | None = None, packing: str = "padded") -> InstructionBatches:
        return InstructionBatches.from_state(self.examples, self.seq, state or {}, packing, self.pad)

    def notes(self) -> list[str]:
        """What the warning W014 says: examples cut at ``seq + 1`` tokens and examples left out."""
        cut = sum(len(e) > self.seq + 1 for e in self.examples)
        notes = [f"{cut} example{'s are' if cut != 1 else ' is'} longer than --seq {self.seq} + 1 tokens and "
                 "cut there"] if cut else []
        if self.left_out:
            notes.append(f"{self.left_out} example{'s have' if self.left_out != 1 else ' has'} no target token in "
                         f"the first {self.seq + 1} tokens and {'are' if self.left_out != 1 else 'is'} left out")
        return notes
