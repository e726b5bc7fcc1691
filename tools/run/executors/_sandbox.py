"""Running a task sandboxed (docs/spec/cache.md, "The sandbox").

A sandboxed task reads only the system directories (:data:`SYSTEM_READ`), the
run's published files, its workspace and its declared ``reads``; writes only
its workspace (which is also its ``TMPDIR``) and its output's
directory; has no TCP unless ``network = true``.

**Landlock** (kernel >= 5.13; ABI >= 4 so that TCP is restricted too) is the
first choice. A Landlock domain is enforced on the calling *thread* and
inherited by every process it starts, so the dispatcher's worker builds the
ruleset, then starts a short-lived thread that sets ``no_new_privs``,
enforces the ruleset on itself and starts the task with ``posix_spawn``
(``clone(CLONE_VFORK)``, no copy of the interpreter), then ends, dropping its
restrictions with it. No fork of the interpreter, no helper program: a
sandboxed start costs a thread, a ruleset and one rule per path.

**bubblewrap** (``bwrap``) is the fallback where Landlock is missing: the
task's argv is run under ``bwrap`` with a read-only root of the same paths,
its workspace and output directory bound writable, and ``--unshare-net``.

Which one: ``CRUCIBLE_SANDBOX`` = ``landlock`` | ``bwrap`` forces one (the
tests force the fallback so); unset, Landlock when the kernel has it, else
bwrap when found on PATH. Neither: a sandboxed run is refused up front.
"""

from __future__ import annotations

import ctypes
import os
import re
import stat as stat_mod
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crucible.core.plan import Task
from crucible.core.structs import dataclass, field

__all__ = [
    "SYSTEM_READ",
    "SandboxSpec",
    "SandboxUnavailable",
    "UnitSandbox",
    "choose",
    "denied_note",
    "landlock_abi",
    "sandboxed",
]

#: what every sandboxed task may read (and execute), when it exists
SYSTEM_READ: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/proc",
    "/sys/devices/system/cpu",
    "/dev/null",
    "/dev/zero",
    "/dev/random",
    "/dev/urandom",
    "/dev/full",
)
#: system paths a task may also write (the bit buckets)
SYSTEM_WRITE: tuple[str, ...] = ("/dev/null", "/dev/zero", "/dev/full")

ENV_SWITCH = "CRUCIBLE_SANDBOX"


class SandboxUnavailable(Exception):
    """Neither Landlock nor bubblewrap can be used here."""


# ----------------------------------------------------------------- Landlock

_SYS_CREATE_RULESET = 444  # the same number on every architecture (new syscalls)
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_PR_SET_NO_NEW_PRIVS = 38
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_TRUNCATE = 1 << 14
_FS_IOCTL_DEV = 1 << 15
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX = 1 << 0
_SCOPE_SIGNAL = 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none, or disabled)."""
    try:
        version = int(_lib().syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def _fs_all(abi: int) -> int:
    """Every filesystem right this ABI handles."""
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM (ABI 1)
    if abi >= 2:
        rights |= 1 << 13  # REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV


# ---------------------------------------------------------------- the spec


@dataclass
class SandboxSpec:
    """What one sandboxed unit may touch."""

    mechanism: str  # "landlock" or "bwrap"
    read: list[str] = field(default_factory=list)  # files or trees, read + execute
    list_dirs: list[str] = field(default_factory=list)  # directories it may list
    write: list[str] = field(default_factory=list)  # trees, every right
    network: bool = False
    bwrap: str = "bwrap"

    def allowed_read(self, path: str) -> bool:
        return any(
            path == p or path.startswith(p.rstrip("/") + "/") for p in self.read + self.write
        )


def choose(environ: Mapping[str, str]) -> tuple[str, str]:
    """(mechanism, bwrap's path) for this host; SandboxUnavailable (one line)
    when neither can be used."""
    # lazy: core.fsio is not loaded with this module; only choose() needs it
    from crucible.core.fsio import which

    forced = environ.get(ENV_SWITCH, "")
    if forced not in ("", "landlock", "bwrap"):
        raise SandboxUnavailable(f"{ENV_SWITCH}={forced!r}: use landlock or bwrap")
    if forced in ("", "landlock"):
        abi = landlock_abi()
        if abi >= 4:
            return "landlock", ""
        if forced:
            raise SandboxUnavailable(
                f"{ENV_SWITCH}=landlock but the kernel's Landlock ABI is {abi} (4 or later needed)"
            )
    found = which("bwrap", environ.get("PATH", os.defpath))
    if found is None:
        if forced:
            raise SandboxUnavailable(f"{ENV_SWITCH}=bwrap but bwrap is not on PATH")
        raise SandboxUnavailable(
            "neither Landlock (kernel ABI 4 or later) nor bubblewrap (bwrap on PATH) is available"
        )
    return "bwrap", found


def _existing(paths: Sequence[str]) -> list[str]:
    return [p for p in paths if os.path.lexists(p)]


# ------------------------------------------------------------ spawning


#: path -> (its O_PATH descriptor, is a directory), or None where it does not
#: exist: the system paths are opened once per process, not once per task
_OPENED: dict[str, tuple[int, bool] | None] = {}


def _opened(path: str) -> tuple[int, bool] | None:
    if path in _OPENED:
        return _OPENED[path]
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        found = None
    else:
        found = (fd, stat_mod.S_ISDIR(os.fstat(fd).st_mode))
    _OPENED[path] = found  # only ever the system paths: a fixed few
    return found


def _landlock_ruleset(spec: SandboxSpec, abi: int) -> int:
    libc = _lib()
    handled_fs = _fs_all(abi)
    file_rights = _FILE_RIGHTS & handled_fs
    attr = _RulesetAttr(handled_fs, 0 if spec.network else _NET_BIND_TCP | _NET_CONNECT_TCP, 0)
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    fd = int(libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        read = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
        rules: list[tuple[str, int]] = [(p, read) for p in spec.read]
        rules += [(p, _FS_READ_DIR) for p in spec.list_dirs]
        rules += [(p, handled_fs) for p in spec.write]
        rules += [(p, read | _FS_WRITE_FILE | _FS_TRUNCATE) for p in SYSTEM_WRITE]
        rule = _PathBeneath()
        for path, rights in rules:
            kept = path in _SYSTEM
            found = _opened(path) if kept else _open_once(path)
            if found is None:
                continue  # what does not exist cannot be read either
            pfd, is_dir = found
            try:
                rule.allowed_access = (rights if is_dir else rights & file_rights) & handled_fs
                rule.parent_fd = pfd
                if libc.syscall(_SYS_ADD_RULE, fd, _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    err = ctypes.get_errno()
                    raise OSError(err, f"landlock_add_rule {path}: {os.strerror(err)}")
            finally:
                if not kept:
                    os.close(pfd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_once(path: str) -> tuple[int, bool] | None:
    """A unit's own path (its workspace, a declared read): opened for one rule."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return fd, stat_mod.S_ISDIR(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        return None


_SYSTEM = frozenset(SYSTEM_READ) | frozenset(SYSTEM_WRITE)
_ABI: int | None = None


def _landlocked(spawn: Callable[[], int], spec: SandboxSpec) -> int:
    """``spawn()`` called on a new thread restricted by the unit's ruleset:
    the process it starts inherits the thread's domain; the thread ends."""
    global _ABI
    if _ABI is None:
        _ABI = landlock_abi()
    ruleset = _landlock_ruleset(spec, _ABI)
    outcome: list[Any] = []

    def restricted() -> None:
        try:
            libc = _lib()
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
                err = ctypes.get_errno()
                raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
            if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0):
                err = ctypes.get_errno()
                raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
            outcome.append(spawn())
        except BaseException as exc:
            outcome.append(exc)

    try:
        thread = threading.Thread(target=restricted, name="crucible-sandboxed-spawn")
        thread.start()
        thread.join()
    finally:
        os.close(ruleset)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return int(outcome[0])


def bwrap_argv(spec: SandboxSpec, argv: Sequence[str], cwd: str) -> list[str]:
    """``argv`` under bubblewrap: a read-only root holding only the allowed paths."""
    # no --new-session: the task stays in the session spawn made, which is
    # what kill_group reaches
    out = [spec.bwrap]
    for p in _existing(SYSTEM_READ):
        if p.startswith("/dev/"):
            continue
        if p == "/proc":
            out += ["--proc", "/proc"]
        else:
            out += ["--ro-bind", p, p]
    out += ["--dev", "/dev"]
    for p in _existing(spec.read):
        if p not in SYSTEM_READ:
            out += ["--ro-bind", p, p]
    for p in _existing(spec.write):
        out += ["--bind", p, p]
    if not spec.network:
        out.append("--unshare-net")
    out += ["--remount-ro", "/", "--chdir", cwd, "--", *argv]
    return out


def sandboxed(
    spec: SandboxSpec | None,
    argv: Sequence[str],
    cwd: str,
    spawn: Callable[[Sequence[str]], int],
) -> int:
    """Start ``argv`` (through ``spawn``, which takes the argv to exec) under
    ``spec``, or as is when ``spec`` is None."""
    if spec is None:
        return spawn(argv)
    if spec.mechanism == "bwrap":
        return spawn(bwrap_argv(spec, argv, cwd))
    return _landlocked(lambda: spawn(argv), spec)


# ------------------------------------------------------------ failure notes

_DENIED = re.compile(r"(?:Permission denied|No such file or directory|Read-only file system)")
_PATH = re.compile(r"(/[^\s:'\"`,;()]+)")
_NO_NETWORK = re.compile(r"Network is unreachable|Cannot assign requested address")
#: said when the output shows a refusal but no path the sandbox hid
GENERIC_NOTE = (
    "sandbox: the task ran sandboxed and hit a permission error (it reads only system "
    "dirs, its inputs and its reads, writes only its workspace, and has no network "
    "unless network = true)"
)


def denied_note(tail: str, spec: SandboxSpec) -> str | None:
    """The failure note of a sandboxed attempt whose output says a path was
    refused: ``sandbox: permission denied reading P (not in reads)`` for a
    host file the sandbox hid, ``... writing P (outside the workspace)`` for a
    write it refused, else that it ran sandboxed and hit a permission error
    (None when its output shows no refusal at all)."""
    for line in reversed(tail.splitlines()):
        # under bwrap the task has a network namespace of its own: a loopback
        # with no listener, so a connection is refused rather than denied
        refused = spec.mechanism == "bwrap" and "Connection refused" in line
        if (refused or _NO_NETWORK.search(line)) and not spec.network:
            return "sandbox: no network (network = true allows it)"
        if not _DENIED.search(line):
            continue
        missing = "No such file or directory" in line
        for path in _PATH.findall(line):
            path = os.path.normpath(path)
            if os.path.exists(path) and not spec.allowed_read(path):
                return f"sandbox: permission denied reading {path} (not in reads)"
            if missing or not os.path.isdir(os.path.dirname(path)):
                continue  # really absent, or no path at all: not the sandbox's doing
            if not any(path.startswith(w.rstrip("/") + "/") for w in spec.write):
                return f"sandbox: permission denied writing {path} (outside the workspace)"
        if not missing:
            return GENERIC_NOTE
    return None


class UnitSandbox:
    """A worker's sandbox: the mechanism (chosen at the first sandboxed unit)
    and what each unit may touch. Each distinct ``reads`` list is matched once
    per worker."""

    def __init__(self, environ: Mapping[str, str], state: str, pack_dir: str) -> None:
        self.environ = environ
        #: the run's published files: staged inputs may be links to them
        self.shared = [os.path.join(state, "shared"), os.path.join(state, "files")]
        self.pack_dir = pack_dir or os.getcwd()
        self._mechanism: tuple[str, str] | None = None
        self._reads: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}

    def spec(self, task: Task, workspace: str, output_dir: str, stdin: str) -> SandboxSpec:
        """What this unit may touch; SandboxUnavailable when nothing can sandbox it."""
        if self._mechanism is None:
            self._mechanism = choose(self.environ)
        mechanism, bwrap = self._mechanism
        reads = task.reads
        found = self._reads.get(reads)
        if found is None:
            found = self._reads[reads] = self._reads_paths(reads)
        files, dirs = found
        return SandboxSpec(
            mechanism,
            read=[*SYSTEM_READ, *self.shared, *files, stdin],
            list_dirs=dirs,
            write=[workspace, output_dir],
            network=task.network,
            bwrap=bwrap,
        )

    def _reads_paths(self, reads: tuple[str, ...]) -> tuple[list[str], list[str]]:
        """(files and trees it may read, directories it may list): each entry's
        matches, and the directory a glob is matched under."""
        # lazy: run.cache._reads is not loaded with this module; only _reads_paths() needs it
        from crucible.run.cache._reads import match_files, split_entry

        files: list[str] = []
        dirs: list[str] = []
        for entry in reads:
            base, globs, _ = split_entry(entry, self.pack_dir)
            if globs == ("**",):  # every file beneath: one rule for the tree
                files.append(base)
            elif globs:
                dirs.append(base)
                files += [full for _, full in match_files(entry, self.pack_dir)]
            else:
                files.append(base)  # a file, or a tree read whole
        return files, dirs

    def note(self, task: Task, workspace: str, output_dir: str, tail: str, note: str) -> str:
        """A failed sandboxed attempt's note, led by what the sandbox refused
        (when its output says)."""
        said = denied_note(tail, self.spec(task, workspace, output_dir, os.devnull))
        return f"{said}; {note}" if said and note else said or note
