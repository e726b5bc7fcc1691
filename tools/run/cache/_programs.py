"""The programs a task runs, as its cache key sees them (docs/spec/cache.md,
"PATH: the programs, not the string").

The key does not hold ``PATH`` itself: activating a virtualenv or adding
``~/.local/bin`` changes the string without changing what a task runs. It
holds, for each program the task's command line names — ``sh`` for a ``run``
string and every command word of that string (the first word, and each one
after ``|``, ``||``, ``&&``, ``;``, ``&``, ``(``, ``$(`` or a backquote,
past ``NAME=value`` assignments), or ``argv[0]`` of a ``run`` array — the
file that name resolves to on the task's ``PATH`` (resolving symbolic links)
and that file's SHA-256. A different program at the front of ``PATH``, or
the same program changed in place, misses; a ``PATH`` entry that holds none
of them hits.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from crucible.core import digest
from crucible.core.plan import Task

__all__ = ["command_words", "program_components"]

#: shell punctuation after which the next word is a command
_COMMAND_STARTS = frozenset({"|", "||", "&&", ";", "&", "(", "$(", "`", ";;", "|&", "\n"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
#: a word that is a program name (no expansion, quoting or redirection left in it)
_PLAIN = re.compile(r"[A-Za-z0-9_.+/-]+")
#: shell keywords that introduce a command rather than name one
_KEYWORDS = frozenset(
    {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "case",
     "esac", "in", "!", "{", "}", "time", "exec", "command", "nohup", "env"}
)  # fmt: skip

#: (dev, inode, size, mtime_ns, ctime_ns) -> the file's digest, per process
_DIGESTS: dict[tuple[int, ...], str] = {}
#: (PATH, name) -> the resolved path (or None)
_RESOLVED: dict[tuple[str, str], str | None] = {}


def command_words(run: str | Sequence[str]) -> list[str]:
    """The program names a task's ``run`` starts, in order, each once: an
    argv's first word, or what a shell string runs."""
    if not isinstance(run, str):
        return list(run[:1])
    return list(_shell_words(run))


@functools.lru_cache(maxsize=1024)
def _shell_words(run: str) -> tuple[str, ...]:
    """(a plan's tasks often share one run string: parsed once)"""
    words = ["sh"]
    text = run.replace("$(", " $( ").replace("`", " ` ")
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = ""
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: sh reports it; key on sh alone
        return tuple(words)
    expect = True
    for token in tokens:
        if token in _COMMAND_STARTS:
            expect = True
            continue
        if not expect:
            continue
        if _ASSIGNMENT.match(token) or token in _KEYWORDS:
            continue
        expect = False
        if _PLAIN.fullmatch(token) and token not in words:
            words.append(token)
    return tuple(words)


def _resolve(name: str, path_var: str | None) -> str | None:
    if "/" in name:
        # an absolute path is itself; a relative one is the workspace's (staged)
        return os.path.realpath(name) if name.startswith("/") else None
    search = os.defpath if path_var is None else path_var
    ident = (search, name)
    if ident in _RESOLVED:
        return _RESOLVED[ident]
    found: str | None = None
    for entry in search.split(os.pathsep):
        candidate = os.path.join(entry or ".", name)
        if not entry or not entry.startswith("/"):
            continue  # a relative PATH entry names the workspace: not a host program
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            found = os.path.realpath(candidate)
            break
    if len(_RESOLVED) > 4096:
        _RESOLVED.clear()
    _RESOLVED[ident] = found
    return found


def _file_digest(path: str, changed_after: int | None) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if changed_after is not None and st.st_ctime_ns > changed_after:
        return "changed"  # since the run being keyed again started (--reuse)
    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    found = _DIGESTS.get(ident)
    if found is None:
        try:
            found = digest.of_file(path)
        except OSError:
            return None
        _DIGESTS[ident] = found
    return found


def program_components(
    task: Task,
    host_env: Mapping[str, str],
    value_digest: Any,
    changed_after: int | None = None,
    memo: dict[tuple[str, str | None], str] | None = None,
) -> dict[str, str]:
    """``program:<name>`` → the digest of ``{"path", "digest"}`` for each program
    the task's command line names (an agent's: ``sh``, which runs --agent-cmd).
    ``changed_after`` (ns since the epoch): a program file changed since then
    is keyed as changed, whatever its bytes (an earlier run keyed again).
    ``memo``: one run's components by (name, PATH) — a run keys each program
    once, not once per task (the caller's, so a process that keys several runs,
    a Dask worker, stats each program again for each run)."""
    run = task.run
    words = ["sh"] if task.kind == "agent" or run is None else command_words(run)
    path_var = host_env.get("PATH")
    out: dict[str, str] = {}
    for name in words:
        component = None if memo is None else memo.get((name, path_var))
        if component is None:
            resolved = _resolve(name, path_var)
            data = None if resolved is None else _file_digest(resolved, changed_after)
            component = value_digest({"path": resolved, "digest": data})
            if memo is not None:
                memo[(name, path_var)] = component
        out[f"program:{name}"] = component
    return out
