"""A pinned chat template: Jinja2 source named by the sha256 of its bytes, rendered into parts.

A ``messages`` or ``preference`` record is trained on as rendered text, so the text form is an
input like the tokenizer: the template's digest goes into the token cache key and the cache's
descriptor. The shipped default is ChatML (``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per
turn). Tool calls are rendered after the assistant's content, one ``<tool_call>{json}</tool_call>``
per call in their order (``tojson``: keys sorted), and a tool turn's content is wrapped in
``<tool_response>`` with the answered call id on its first line: the same payload always gives the
same characters.

What is a training target is marked in the template itself, with the ``{% generation %}`` block
of Hugging Face chat templates (``return_assistant_tokens_mask``): the default marks each assistant
turn's content, its tool calls and its ``<|im_end|>``; headers, the newline after ``<|im_end|>``
and every other turn are context. Rendering yields ordered parts ``(text, target)`` split at those
blocks, so a tokenizer can encode each part on its own and no token straddles the mask.

The digest covers the template bytes; the environment (sandboxed, strict undefined, no autoescape,
no whitespace trimming) is code, covered by the code identity of whatever imports this module.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from corpus_assets.core.storage.digests import sha256_digest

TEMPLATE_SCHEMA = "corpus.chat-template.v1"
_TRACKER = "__corpus_generation_tracker"  # the render variable the generation tag reports to

CHATML_V1 = (
    "{% for message in messages %}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.role == 'assistant' %}"
    "{% generation %}{{ message.content }}"
    "{% if message.tool_calls is defined %}{% for call in message.tool_calls %}"
    "\n<tool_call>{{ call | tojson }}</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>{% endgeneration %}\n"
    "{% elif message.role == 'tool' %}"
    "<tool_response>{{ message.tool_call_id | tojson }}\n{{ message.content }}</tool_response>"
    "<|im_end|>\n"
    "{% else %}"
    "{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template does not parse or does not render a payload; the message names its digest."""


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja2 chat template; ``digest`` (sha256 of the UTF-8 source) is its name everywhere."""

    name: str
    source: str

    @property
    def digest(self) -> str:
        return sha256_digest(self.source.encode("utf-8"))

    def document(self) -> dict[str, str]:
        """What a layer index or manifest records: the digest, with a name for people."""
        return {"schema": TEMPLATE_SCHEMA, "name": self.name, "digest": self.digest}

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        """The whole rendered text (the parts joined)."""
        return "".join(text for text, _ in self.render_parts(messages, add_generation_prompt))

    def render_parts(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = False
    ) -> list[tuple[str, bool]]:
        """Ordered ``(text, is_target)`` parts, none empty; target parts are the template's
        ``{% generation %}`` blocks."""
        tracker = _Tracker()
        variables = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            _TRACKER: tracker,
        }
        try:
            for chunk in _compiled(self.source).generate(variables):
                tracker.emitted.append(chunk)
                tracker.length += len(chunk)
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template {self.digest}: {error}") from None
        text = "".join(tracker.emitted)
        return _parts(text, tracker.spans, self.digest)


DEFAULT_CHAT_TEMPLATE = ChatTemplate("chatml.v1", CHATML_V1)


class _Tracker:
    """Per render: the characters yielded so far and the [start, end) of each target block."""

    def __init__(self) -> None:
        self.emitted: list[str] = []
        self.length = 0
        self.spans: list[tuple[int, int, str]] = []


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body and reports where it went.

    Jinja yields output as it renders, so when the body is evaluated everything before it has
    been yielded: the tracker's length is the body's start. ``_parts`` checks that it was."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_mark", [nodes.Name(_TRACKER, "load")])
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _mark(self, tracker: Any, caller: Any) -> str:
        body = str(caller())
        if not isinstance(tracker, _Tracker):
            raise jinja2.TemplateRuntimeError("{% generation %} outside a tracked render")
        tracker.spans.append((tracker.length, tracker.length + len(body), body))
        return body


def _parts(text: str, spans: list[tuple[int, int, str]], digest: str) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    at = 0
    for start, end, body in spans:
        if start < at or text[start:end] != body:
            raise ChatTemplateError(
                f"chat template {digest}: a {{% generation %}} block was buffered or nested, "
                "so its place in the text is unknown"
            )
        out += [(text[at:start], False), (body, True)]
        at = end
    out.append((text[at:], False))
    return [(part, target) for part, target in out if part]


_ENVIRONMENT = ImmutableSandboxedEnvironment(
    extensions=[_GenerationTag], undefined=jinja2.StrictUndefined, autoescape=False
)
_COMPILED: dict[str, jinja2.Template] = {}  # source digest -> compiled template, per process


def _compiled(source: str) -> jinja2.Template:
    digest = sha256_digest(source.encode("utf-8"))
    if digest not in _COMPILED:
        try:
            _COMPILED[digest] = _ENVIRONMENT.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ChatTemplateError(f"chat template {digest} does not parse: {error}") from None
    return _COMPILED[digest]
