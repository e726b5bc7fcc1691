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
from crucible.stage._inputs import INDEX_NAME, V1_FILE, V1_HISTORY, VALUES_DIR, stage_inputs
from crucible.stage._plan import PlanView
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


def _shown_history(history: Any, budget: int) -> tuple[Any, int]:
    """What of ``history`` the prompt shows within ``budget`` inline bytes, and
    how many records it leaves to the file. A list keeps its newest suffix in
    which every record is at most INLINE_VALUE_MAX bytes of canonical JSON and
    the records together at most ``budget`` (the oldest go first, as the loop's
    own budget drops them); any other value is shown whole or not at all."""
    if not isinstance(history, list):
        return (history, 0) if len(canon.dumps(history)) <= budget else (_NO_HISTORY, 1)
    used = 0
    keep = 0
    for record in reversed(history):
        size = len(canon.dumps(record))
        if size > INLINE_VALUE_MAX or used + size > budget:
            break
        used += size
        keep += 1
    return history[len(history) - keep :], len(history) - keep


def _history_text(history: Any, budget: int | None, dropped: int, path: str) -> str:
    """The history's marked region (v2: under the inline budget left by the
    other inputs; v1: whole), after a line saying what is not in it."""
    shown, omitted = (history, 0) if budget is None else _shown_history(history, budget)
    notes = []
    if omitted:
        what = f"the {omitted} oldest records are" if isinstance(history, list) else "it is"
        notes.append(f"{what} not shown here (over the inline budget): read {path}")
    if dropped:
        notes.append(f"the {dropped} oldest revisions were dropped by the loop's history budget")
    head = f"History: {'; '.join(notes)}.\n" if notes else ""
    if shown is _NO_HISTORY:
        return f"{head}{HISTORY_BEGIN}\n{HISTORY_END}\n"
    return head + _history_region(shown)


def _load(path: Path) -> Any:
    try:
        return canon.loads(path.read_bytes())
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=str(path)) from None


def _v2_section(workspace: Path, index: dict[str, Any]) -> tuple[str, str | None]:
    lines = [
        "## Inputs",
        "",
        f"Your inputs are files under inputs/{VALUES_DIR}/ (index: inputs/{VALUES_DIR}/{INDEX_NAME}).",
        "Small values are shown here; read the others from their files.",
        "",
    ]
    inlined = 0
    history: dict[str, Any] | None = None
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
        for kf in entry.get("kept_files", ()) if entry["kind"] == "reserved" else ():
            # the kept revision's files: the agent's starting point (copy, never edit in place)
            lines.append(
                f"  files: {kf['path']}/ ({kf['producer']} of revision {kf['key'][4:]}, read-only)"
            )
        if name == "history" and entry["kind"] == "reserved":
            history = entry  # rendered last, in what the inline budget has left
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
    region = None
    if history is not None:
        region = _history_text(
            _load(workspace / history["path"]),
            INLINE_TOTAL_MAX - inlined,
            int(history.get("dropped", 0)),
            history["path"],
        )
    return "\n".join(lines) + "\n", region


_NO_HISTORY = object()


def render_prompt(
    pv: PlanView, state: Path, task: str, workspace: Path, *, key: str | None = None
) -> str:
    """The prompt of agent ``task``, from the inputs staged in ``workspace``
    (staged first when they are not there yet)."""
    t = pv.task(task)
    check_key(pv, task, key)
    if t.kind != "agent":
        raise InputRefused(f"task {task!r} is a {t.kind} task, not an agent; it has no prompt")
    workspace = Path(workspace).absolute()
    inputs = workspace / "inputs"
    marker = inputs / (f"{VALUES_DIR}/{INDEX_NAME}" if pv.version >= 2 else V1_FILE)
    if not marker.exists():
        stage_inputs(pv, Path(state), task, workspace, key=key)
    head = (t.prompt or "").rstrip("\n") + "\n\n"
    region: str | None = None
    if pv.version >= 2:
        index = _load(marker)
        if not isinstance(index, dict) or index.get("task") != task or index.get("key") != key:
            raise InputRefused(
                "the staged inputs belong to another task or instance (stage them again)",
                where=str(marker),
            )
        body, region = _v2_section(workspace, index)
    else:
        obj = _load(marker)
        if not isinstance(obj, dict):
            raise ParseError("the staged inputs are not a JSON object", where=str(marker))
        obj.pop("params", None)  # never reaches an agent, whatever was staged
        meta = obj.pop(V1_HISTORY, None)
        if "history" in obj:
            dropped = meta.get("dropped", 0) if isinstance(meta, dict) else 0
            path = f"inputs/{V1_FILE}"
            region = _history_text(obj.pop("history"), None, int(dropped), path)
        body = "## Inputs\n\n```json\n" + _pretty(obj) + "\n```\n"
    text = head + body
    if region is not None:
        text += "\n" + region
    return text
