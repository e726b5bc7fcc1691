"""The task DAG as Graphviz DOT or Mermaid text.

Edges point from a dependency to the task that needs it. A fan-out (``map``)
task is drawn as a stacked node labelled ``name[*]`` with a bold ``map field``
edge from its producer; edges into a task that joins ``settled`` are dashed and
labelled ``settled``; agents are rounded, epilogues octagons (they run after
every other task has settled). Control flow (edition 4): a task's ``when`` and
its tolerance are lines of its label; an edge from a need the condition reads
(``needs.P.status``) carries the condition as its label (the trigger). A scored
loop's body is a cluster (DOT) or subgraph (Mermaid) labelled with what it optimizes.
"""

from __future__ import annotations

from typing import Any

from crucible.compile._fanout import describe_source, fanout_producers, is_fanout

__all__ = ["FORMATS", "render"]

FORMATS = ("dot", "mermaid")


def _label(task: dict[str, Any]) -> str:
    label = str(task["name"])
    if "map" in task:
        label += f"[*]\nmap {describe_source(task['map'])}"
        if "key" in task:
            label += f" by {task['key']}"
    elif "matrix" in task:
        axes = task["matrix"]["axes"]
        label += "[*]\nmatrix " + " × ".join(
            f"{a['name']} ({describe_source(a['source'])})" for a in axes
        )
        if not axes:  # an include-only matrix (issue 32): its entries are its instances
            label += "of its include entries"
        for k in ("exclude", "include"):
            if k in task["matrix"]:
                label += f"\n{len(task['matrix'][k])} {k}"
    if "parallelism" in task:
        label += f"\nparallelism {task['parallelism']}"
    if task.get("on_empty") == "skip":
        label += "\n(skipped when empty)"
    if task["kind"] != "command":
        label += f"\n({task['kind']})"
    if task["epilogue"]:
        label += "\n(epilogue)"
    if "when" in task:
        label += f"\nwhen {_short(task['when'])}"
    if "allow_exit" in task:
        label += f"\n(tolerates exit {', '.join(map(str, task['allow_exit']))})"
    elif "on_failure" in task:
        label += f"\n(on failure: {task['on_failure']})"
    return label


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _trigger(task: dict[str, Any], need: str) -> str | None:
    """The condition, when it reads ``needs.<need>``: what makes the edge fire."""
    if "when" not in task:
        return None
    # lazy: compile._conditions is not loaded with this module; only _trigger() needs it
    from crucible.compile._conditions import condition_reads, parse_condition

    tree = parse_condition(task["when"])
    if isinstance(tree, str):
        return None
    if any(r.parts[:2] == ("needs", need) for r in condition_reads(tree)):
        return _short(task["when"], 40)
    return None


def _edges(plan: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(producer, consumer, style) with style in plain | map | settled | map+settled."""
    out = []
    for task in plan["tasks"]:
        mapped = fanout_producers(task)
        for need in task["needs"]:
            style = "map" if need in mapped else "plain"
            if task["join"] == "settled":
                style = "map+settled" if style == "map" else "settled"
            out.append((need, task["name"], style))
    return out


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot(plan: dict[str, Any]) -> str:
    lines = [
        f"digraph {_dot_quote(plan['workflow']['name'])} {{",
        "  rankdir=LR;",
        "  node [shape=box];",
    ]
    for task in plan["tasks"]:
        attrs = [f"label={_dot_quote(_label(task))}"]
        if is_fanout(task):
            attrs.append("shape=box3d")
        elif task["epilogue"]:
            attrs.append("shape=octagon")
        elif task["kind"] == "agent":
            attrs.append('style="rounded"')
        if task["epilogue"] and not is_fanout(task):
            attrs.append("peripheries=2")
        lines.append(f"  {_dot_quote(task['name'])} [{', '.join(attrs)}];")
    if "loop" in plan:  # the scored loop's body: one dashed cluster (docs/spec/loop.md)
        from crucible.compile._loop import describe_loop

        lines.append('  subgraph "cluster_loop" {')
        lines.append(f"    label={_dot_quote(describe_loop(plan['loop']))}; style=dashed;")
        lines.extend(f"    {_dot_quote(name)};" for name in plan["loop"]["body"])
        lines.append("  }")
    by_name = {t["name"]: t for t in plan["tasks"]}
    for src, dst, style in _edges(plan):
        attrs = []
        if style.startswith("map"):
            text = fanout_producers(by_name[dst])[src]
            attrs += [
                "style=bold",
                f"label={_dot_quote(text + (' (settled)' if 'settled' in style else ''))}",
            ]
            if "settled" in style:
                attrs[0] = 'style="bold,dashed"'
        elif style == "settled":
            attrs += ["style=dashed", 'label="settled"']
        if (trigger := _trigger(by_name[dst], src)) is not None:
            old = next((a for a in attrs if a.startswith("label=")), None)
            text = "when " + trigger
            if old is not None:
                attrs.remove(old)
                text = f"{old[7:-1]} · {text}"
            attrs.append(f"label={_dot_quote(text)}")
        suffix = f" [{', '.join(attrs)}]" if attrs else ""
        lines.append(f"  {_dot_quote(src)} -> {_dot_quote(dst)}{suffix};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    return (
        '"'
        # '#' first: the entity codes below start with it, and a literal '#quot;' in
        # a task name must not render as '"'
        + text.replace("#", "#35;")
        .replace("&", "#amp;")
        .replace('"', "#quot;")
        .replace("<", "#lt;")
        .replace(">", "#gt;")
        .replace("\n", "<br/>")
        + '"'
    )


def _mermaid(plan: dict[str, Any]) -> str:
    ids = {t["name"]: f"t{i}" for i, t in enumerate(plan["tasks"])}
    lines = ["flowchart LR"]
    for task in plan["tasks"]:
        label = _mermaid_text(_label(task))
        node = ids[task["name"]]
        if is_fanout(task):
            lines.append(f"  {node}[[{label}]]")
        elif task["epilogue"]:
            lines.append(f"  {node}{{{{{label}}}}}")
        elif task["kind"] == "agent":
            lines.append(f"  {node}({label})")
        else:
            lines.append(f"  {node}[{label}]")
    if "loop" in plan:  # the scored loop's body: one subgraph (docs/spec/loop.md)
        from crucible.compile._loop import describe_loop

        lines.append(f"  subgraph loop_body[{_mermaid_text(describe_loop(plan['loop']))}]")
        lines.extend(f"    {ids[name]}" for name in plan["loop"]["body"])
        lines.append("  end")
    by_name = {t["name"]: t for t in plan["tasks"]}
    for src, dst, style in _edges(plan):
        a, b = ids[src], ids[dst]
        trigger = _trigger(by_name[dst], src)
        if trigger is not None:
            if style.startswith("map"):
                text = fanout_producers(by_name[dst])[src]
                base = text + (" (settled)" if "settled" in style else "") + " · "
                arrow = "-.->" if "settled" in style else "==>"
            else:
                base = "settled · " if "settled" in style else ""
                arrow = "-.->" if "settled" in style else "-->"
            lines.append(f"  {a} {arrow}|{_mermaid_text(base + 'when ' + trigger)}| {b}")
        elif style.startswith("map"):
            arrow = "-.->" if "settled" in style else "==>"
            text = fanout_producers(by_name[dst])[src] + (" (settled)" if "settled" in style else "")
            lines.append(f"  {a} {arrow}|{_mermaid_text(text)}| {b}")
        elif style == "settled":
            lines.append(f"  {a} -.->|settled| {b}")
        else:
            lines.append(f"  {a} --> {b}")
    return "\n".join(lines) + "\n"


def render(plan: dict[str, Any], fmt: str) -> str:
    if fmt == "dot":
        return _dot(plan)
    if fmt == "mermaid":
        return _mermaid(plan)
    raise ValueError(f"unknown graph format {fmt!r}")
