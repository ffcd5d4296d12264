"""Schema adapters: from one declared source row format to one typed payload kind.

Each source declares its adapter (input format + version -> output kind + version). A row that
does not match the declared adapter is quarantined as ``schema.unknown`` (or a kind-specific
``schema.*`` code), never guessed from whichever fields happen to be present. Kinds keep their
structure: ``messages`` keeps ordered turns with tool calls paired to their results, and a
``preference`` is one record (prompt, chosen, rejected), never two unrelated texts.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, get_args

from corpus_assets.core.runtime.config import AdapterName, Source

ROLES = ("system", "user", "assistant", "tool")


class SchemaMismatch(ValueError):
    """The row does not fit the source's declared adapter; ``reason`` is a ``schema.*`` code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Adapter:
    name: str
    input: str
    output: str  # "<kind>.v<n>"
    parse: Callable[[Source, dict[str, Any]], dict[str, Any]]

    @cached_property  # asked several times per row
    def kind(self) -> str:
        return self.output.split(".", 1)[0]


def field(row: dict[str, Any], path: str) -> Any:
    """A (possibly dotted, e.g. ``meta.messages``) field of a row, or None."""
    if "." not in path and isinstance(row, dict):
        return row.get(path)  # the common case, without splitting the path per row
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _string(row: dict[str, Any], path: str, what: str) -> str:
    """A required string field, or ``schema.unknown`` naming what was found instead."""
    value = field(row, path)
    if not isinstance(value, str):
        found = "missing" if value is None else type(value).__name__
        raise SchemaMismatch("schema.unknown", f"{what} field {path!r} is {found}, not a string")
    return value


def _document(source: Source, row: dict[str, Any]) -> dict[str, Any]:
    return {"text": _string(row, source.text_field, "text")}


def _messages(source: Source, row: dict[str, Any]) -> dict[str, Any]:
    """Ordered chat turns; every tool call must be answered and every tool result called."""
    turns = field(row, source.messages_field)
    if not isinstance(turns, list) or not turns:
        raise SchemaMismatch(
            "schema.unknown", f"messages field {source.messages_field!r} is not a non-empty list"
        )
    out, declared, answered = [], set(), set()
    for n, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("content"), str):
            raise SchemaMismatch("schema.messages.turn", f"turn {n} has no string content")
        role = turn.get("role")
        if role not in ROLES:
            raise SchemaMismatch("schema.messages.role", f"turn {n} has role {role!r}")
        entry: dict[str, Any] = {"role": role, "content": turn["content"]}
        calls = turn.get("tool_calls") or []
        if calls:
            if role != "assistant":
                raise SchemaMismatch("schema.messages.tool", f"turn {n}: tool_calls on {role}")
            ids = [c.get("id") for c in calls if isinstance(c, dict)]
            if len(ids) != len(calls) or not all(isinstance(i, str) for i in ids):
                raise SchemaMismatch("schema.messages.tool", f"turn {n}: a tool call has no id")
            declared.update(ids)
            entry["tool_calls"] = [{"id": c["id"], "name": str(c.get("name", ""))} for c in calls]
        if role == "tool":
            call = turn.get("tool_call_id")
            if call not in declared:
                raise SchemaMismatch(
                    "schema.messages.tool", f"turn {n}: tool result {call!r} answers no call"
                )
            answered.add(call)
            entry["tool_call_id"] = call
        out.append(entry)
    if declared - answered:
        raise SchemaMismatch(
            "schema.messages.tool", f"unanswered tool calls {sorted(declared - answered)}"
        )
    if all(t["role"] == "system" for t in out):
        raise SchemaMismatch("schema.messages.empty", "only system turns")
    return {"messages": out}


def _preference(source: Source, row: dict[str, Any]) -> dict[str, Any]:
    """One (prompt, chosen, rejected) record: a pair is only meaningful if the two differ."""
    payload = {
        "prompt": _string(row, source.prompt_field, "prompt"),
        "chosen": _string(row, source.chosen_field, "chosen"),
        "rejected": _string(row, source.rejected_field, "rejected"),
    }
    if payload["chosen"] == payload["rejected"]:
        raise SchemaMismatch("schema.preference.identical", "chosen and rejected are the same")
    return payload


ADAPTERS = {
    a.name: a
    for a in (
        Adapter("jsonl-text.v1", "jsonl {text}", "document.v1", _document),
        Adapter("chat-messages.v1", "jsonl {messages:[{role,content}]}", "messages.v1", _messages),
        Adapter("preference.v1", "jsonl {prompt,chosen,rejected}", "preference.v1", _preference),
        Adapter("debezium-row.v1", "debezium after-image row", "document.v1", _document),
    )
}
if set(ADAPTERS) != set(get_args(AdapterName)):  # the config names them; this implements them
    raise ImportError(f"adapters {sorted(ADAPTERS)} differ from config.AdapterName")


def render(kind: str, payload: dict[str, Any]) -> str:
    """The flattened text later layers dedup, tokenize and pack (structure stays in the payload)."""
    if kind == "document":
        return payload["text"]
    if kind == "messages":
        return "\n".join(f"{t['role']}: {t['content']}" for t in payload["messages"])
    return f"{payload['prompt']}\nchosen: {payload['chosen']}\nrejected: {payload['rejected']}"


def strings(kind: str, payload: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """(path, text) of every free-text field of a payload, for normalisation and redaction."""
    if kind == "messages":
        return [
            (("messages", n, "content"), t["content"]) for n, t in enumerate(payload["messages"])
        ]
    return [((k,), v) for k, v in payload.items() if isinstance(v, str)]


def replace(payload: dict[str, Any], path: tuple[str | int, ...], value: str) -> None:
    """Set the string at a :func:`strings` path, in place (stages rewrite text, not structure)."""
    node: Any = payload
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
