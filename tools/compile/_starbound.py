"""Bounds on a Starlark source before and while it is evaluated.

starlark-pyo3 parses and evaluates recursively on the native stack and has no
memory limit: a 6 KB source nested 3,000 deep, or 50,000 unary signs in a row,
ends the process with SIGSEGV, and ``x = x + x`` forty times grows one string
until the machine runs out of memory (a Rust panic when the length overflows).

Two bounds, both documented in docs/spec/manifest.md:

- :func:`nesting_problem` scans the text (a small lexer: strings and comments
  skipped) for an estimate of the expression depth the parser would reach:
  brackets open, plus the operators chained in the element being read at each
  bracket level, plus indented blocks. Over :data:`MAX_NESTING` the source is
  refused before evaluation, at the line and column where the bound was passed.
  The estimate is an upper bound for chains (``1+1+…`` nests one level per
  ``+``), which is what the native stack pays for.
- :func:`crucible.compile._star.evaluate_source` evaluates in a forked child
  whose data segment is limited to :data:`MAX_EVAL_MEMORY` more than it started
  with: whatever the evaluator does (a panic, an abort on a failed allocation, a
  crash this scan did not foresee) becomes a diagnostic of the parent.
"""

from __future__ import annotations

import contextlib
import re

from crucible.core.errors import Location

__all__ = ["MAX_EVAL_MEMORY", "MAX_NESTING", "limit_memory", "nesting_problem"]

#: our choice: real packs nest a few levels; the evaluator's native stack gave
#: out near 1,600 chained calls and 2,300 nested lists on an 8 MiB stack
MAX_NESTING = 200
#: memory an evaluation may allocate beyond what the process held at its start
MAX_EVAL_MEMORY = 1 << 30

_TOKEN = re.compile(
    r"""
    (?P<string>[rRbB]{0,2}(?:'{3}(?:[^\\]|\\.)*?(?:'{3}|\Z)|"{3}(?:[^\\]|\\.)*?(?:"{3}|\Z)
               |'(?:[^\\'\n]|\\.)*'?|"(?:[^\\"\n]|\\.)*"?))
    |(?P<comment>\#[^\n]*)
    |(?P<newline>\n[ \t]*)
    |(?P<cont>\\\n)
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<number>[0-9][0-9A-Za-z_.]*)
    |(?P<open>[(\[{])
    |(?P<close>[)\]}])
    |(?P<sep>[,;:])
    |(?P<op>\*\*=?|//=?|<<=?|>>=?|[=!<>]=|[-+*/%&|^]=|[-+*/%~&|^<>.=!])
    """,
    re.VERBOSE | re.DOTALL,
)
_KEYWORDS = frozenset({"not", "and", "or", "if", "else", "in", "lambda", "for"})


def nesting_problem(text: str) -> tuple[Location, str] | None:
    """(location, message) where ``text`` first nests deeper than MAX_NESTING."""
    levels: list[int] = [0]  # operators chained in the current element, per bracket level
    chained = 0  # sum(levels)
    indents: list[int] = [0]
    line, line_start = 1, 0
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "newline":
            line, line_start = line + 1, m.start() + 1
            if len(levels) == 1:
                rest = text[m.end() : m.end() + 1]
                if rest and rest not in "\n\r#":  # a blank or comment line sets no indent
                    width = m.end() - m.start() - 1
                    if width > indents[-1]:
                        indents.append(width)
                    while width < indents[-1]:
                        indents.pop()
                chained, levels[0] = 0, 0
            continue
        if kind == "string" or kind == "cont":
            newlines = m.group().count("\n")
            if newlines:
                line, line_start = line + newlines, m.start() + m.group().rindex("\n") + 1
            continue
        if kind == "open":
            levels.append(0)
        elif kind == "close":
            if len(levels) > 1:
                chained -= levels.pop()
            # a call, an index or a bracketed atom: a postfix chain (f(1)(2), y[0][0])
            # nests one level per bracket pair
            levels[-1] += 1
            chained += 1
        elif kind == "sep":
            chained -= levels[-1]
            levels[-1] = 0
        elif kind == "op" or (kind == "name" and m.group() in _KEYWORDS):
            levels[-1] += 1
            chained += 1
        else:
            continue
        if len(levels) - 1 + chained + len(indents) - 1 > MAX_NESTING:
            return (
                Location(None, line, m.start() - line_start + 1),
                f"Starlark source nested deeper than {MAX_NESTING} levels "
                "(brackets, chained operators and indented blocks)",
            )
    return None


def limit_memory(extra: int = MAX_EVAL_MEMORY) -> None:
    """Cap this process's data segment at what it holds now plus ``extra`` bytes."""
    # lazy: not loaded with this module; only limit_memory() needs it
    import resource

    try:
        with open("/proc/self/status", encoding="ascii") as f:
            data_kib = next(int(line.split()[1]) for line in f if line.startswith("VmData:"))
    except (OSError, StopIteration, ValueError):
        return
    limit = data_kib * 1024 + extra
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
