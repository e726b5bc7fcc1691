"""An agent's prompt: its task prompt, its inputs section, its history region.

IR v2 lists every input by name, type, size and path and inlines a value only
when it is at most INLINE_VALUE_MAX bytes and the inlined total stays at most
INLINE_TOTAL_MAX bytes. IR v1 renders the whole inputs object as pretty JSON, as
before (agents never receive params). In both, history sits in its marked
region. Normative text: docs/spec/inputs.md, "Agent prompts".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.errors import InputRefused, ParseError
from crucible.stage._inputs import INDEX_NAME, V1_FILE, VALUES_DIR, stage_inputs
from crucible.stage._plan import view
from crucible.stage._records import check_key

__all__ = [
    "HISTORY_BEGIN",
    "HISTORY_END",
    "INLINE_TOTAL_MAX",
    "INLINE_VALUE_MAX",
    "PROMPT_ENV_MAX",
    "render_prompt",
]

PROMPT_ENV_MAX = 65536
INLINE_VALUE_MAX = 2048
INLINE_TOTAL_MAX = 32768
HISTORY_BEGIN = "<<<crucible:history>>>"
HISTORY_END = "<<<crucible:end-history>>>"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _history_region(history: Any) -> str:
    return f"{HISTORY_BEGIN}\n{_pretty(history)}\n{HISTORY_END}\n"


def _load(path: Path) -> Any:
    try:
        return canon.loads(path.read_bytes())
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=str(path)) from None


def _v2_section(workspace: Path, index: dict[str, Any]) -> tuple[str, Any]:
    lines = [
        "## Inputs",
        "",
        f"Your inputs are files under inputs/{VALUES_DIR}/ (index: inputs/{VALUES_DIR}/{INDEX_NAME}).",
        "Small values are shown here; read the others from their files.",
        "",
    ]
    inlined = 0
    history: Any = None
    has_history = False
    for entry in index["inputs"]:
        name, size, path = entry["name"], entry["size"], entry["path"]
        source = f", from {entry['producer']}.{entry['field']}" if entry["producer"] else ""
        kind = f"fold of {len(entry['entries'])} entries, " if entry["fold"] else ""
        where = f"{path}/" if entry["fold"] and path else (path or "not staged")
        size_text = "no value" if size is None else f"{size} bytes"
        lines.append(f"- {name} ({entry['type']}, {kind}{size_text}, {where}{source})")
        if entry["status"] != "passed":
            note = f": {entry['note']}" if entry["note"] else ""
            lines.append(f"  producer {entry['status']}{note}")
        if name == "history" and entry["kind"] == "reserved":
            has_history = True
            history = _load(workspace / path)
            lines.append("  shown in the history region below")
            continue
        if not entry["value_staged"] or entry["fold"]:
            if entry["fold"] and path:
                lines.append("  not inlined: one file per instance, listed in the index")
            continue
        if size <= INLINE_VALUE_MAX and inlined + size <= INLINE_TOTAL_MAX:
            inlined += size
            text = (workspace / path).read_bytes().decode("utf-8")
            lines.append(f"  value: {text}")
        else:
            lines.append("  not inlined: read the file")
    return "\n".join(lines) + "\n", (history if has_history else _NO_HISTORY)


_NO_HISTORY = object()


def render_prompt(
    plan: Any, state: Path, task: str, workspace: Path, *, key: str | None = None
) -> str:
    """The prompt of agent ``task``, from the inputs staged in ``workspace``
    (staged first when they are not there yet)."""
    pv = view(plan)
    t = pv.task(task)
    check_key(plan, task, key)
    if t.kind != "agent":
        raise InputRefused(f"task {task!r} is a {t.kind} task, not an agent; it has no prompt")
    workspace = Path(workspace).absolute()
    inputs = workspace / "inputs"
    marker = inputs / (f"{VALUES_DIR}/{INDEX_NAME}" if pv.version >= 2 else V1_FILE)
    if not marker.exists():
        stage_inputs(plan, Path(state), task, workspace, key=key)
    head = (t.prompt or "").rstrip("\n") + "\n\n"
    history: Any = _NO_HISTORY
    if pv.version >= 2:
        index = _load(marker)
        if not isinstance(index, dict) or index.get("task") != task or index.get("key") != key:
            raise InputRefused(
                "the staged inputs belong to another task or instance (stage them again)",
                where=str(marker),
            )
        body, history = _v2_section(workspace, index)
    else:
        obj = _load(marker)
        if not isinstance(obj, dict):
            raise ParseError("the staged inputs are not a JSON object", where=str(marker))
        obj.pop("params", None)  # never reaches an agent, whatever was staged
        if "history" in obj:
            history = obj.pop("history")
        body = "## Inputs\n\n```json\n" + _pretty(obj) + "\n```\n"
    text = head + body
    if history is not _NO_HISTORY:
        text += "\n" + _history_region(history)
    return text
