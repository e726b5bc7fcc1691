"""The floor a Python engine can reach on bench_dispatch's workload (issue 33).

Not crucible: a plain program that does, per task, the file work crucible's
contract asks of a dispatched unit and nothing else. Two forked workers split
the tasks; each, per task: makes the workspace, starts ``sh -c`` there with
``posix_spawn`` (its own session, the output path in its environment), waits
for it (a pidfd, ``wait4``'s usage), reads and parses the result object,
writes a record (canonically ordered JSON, usage included) by temp file,
``fchmod`` and rename (no fsync), removes the result file and tells the
parent through a pipe. The parent makes each batch's records durable before
their events, as crucible's group commit does (one ``syncfs`` of the
filesystem for a batch of 8 or more, else an fsync per record and one of the
results directory), then appends two event lines per task to a session log
and fsyncs it, at most once per 5 ms (what arrives meanwhile joins the next
commit). No checks of the plan, the inputs or the record's domain, no
reaper, no cache, no retries, no timeouts: bench_dispatch prints its time
beside make's and crucible's, so the part of crucible's cost that is the
work itself, and the part that is crucible, stay visible in every run.

Run: python benchmarks/floor_engine.py ROOT [TASKS]   (ROOT must not exist)
"""

from __future__ import annotations

import ctypes
import os
import select
import sys
import time
import traceback

import orjson

_SORTED = orjson.OPT_SORT_KEYS
_TASK = 'printf "{}" > "$CRUCIBLE_OUTPUT"'
#: crucible.core.syncfs.SYNCFS_MIN_PATHS: from this many records, one syncfs
_SYNCFS_MIN = 8
#: crucible.run.session._log.GROUP_COMMIT_WINDOW: at most one commit per 5 ms
_COMMIT_WINDOW = 0.005
_syncfs = ctypes.CDLL(None, use_errno=True).syncfs


def _worker(root: str, first: int, end: int, reply: int) -> None:
    env = dict(os.environ)
    for i in range(first, end):
        name = f"t{i}"
        workspace = f"{root}/work/{name}"
        output = f"{root}/output/{name}.json"
        os.mkdir(workspace)
        task_env = {**env, "CRUCIBLE_OUTPUT": output, "CRUCIBLE_WORKSPACE": workspace}
        here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        os.chdir(workspace)
        started = time.monotonic()
        try:
            pid = os.posix_spawn("/bin/sh", ["sh", "-c", _TASK], task_env, setsid=True)
        finally:
            os.fchdir(here)
            os.close(here)
        pidfd = os.pidfd_open(pid)
        _, status, usage = os.wait4(pid, 0)
        os.close(pidfd)
        duration = time.monotonic() - started
        fd = os.open(output, os.O_RDONLY | os.O_CLOEXEC)
        try:
            result = orjson.loads(os.read(fd, 1 << 16))
        finally:
            os.close(fd)
        record = {
            "attempt": 1,
            "exit_code": os.waitstatus_to_exitcode(status),
            "files": [],
            "format": "crucible.result/1",
            "note": "",
            "output": result,
            "status": "passed",
            "task": name,
            "usage": {
                "cpu_sys_s": round(usage.ru_stime, 4),
                "cpu_user_s": round(usage.ru_utime, 4),
                "max_rss_kib": usage.ru_maxrss,
            },
        }
        tmp = f"{root}/results/@tmp-{os.getpid()}-{i}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, orjson.dumps(record, option=_SORTED))
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        record_path = f"{root}/results/{name}.json"
        os.replace(tmp, record_path)
        os.unlink(output)
        os.write(reply, orjson.dumps([name, pid, duration, record_path]) + b"\n")


def _log_events(root: str, replies: list[int]) -> None:
    log = os.open(f"{root}/session.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    results = os.open(f"{root}/results", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    poller = select.poll()
    for fd in replies:
        poller.register(fd, select.POLLIN)
    pending = {fd: b"" for fd in replies}
    lines: list[bytes] = []
    records: list[str] = []
    last_commit = -_COMMIT_WINDOW
    while pending or lines:
        wait = last_commit + _COMMIT_WINDOW - time.monotonic()
        if lines and (wait <= 0 or not pending):
            _make_durable(records, results)  # first: the log never says more
            os.write(log, b"".join(lines))
            os.fsync(log)
            lines, records = [], []
            last_commit = time.monotonic()
            continue
        for fd, _ in poller.poll(max(1, int(wait * 1000) + 1) if lines else None):
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                poller.unregister(fd)
                del pending[fd]
                continue
            *whole, pending[fd] = (pending[fd] + chunk).split(b"\n")
            for message in whole:
                name, pid, duration, record_path = orjson.loads(message)
                records.append(record_path)
                at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                started = {"event": "task_started", "pid": pid, "task": name, "time": at}
                finished = {
                    "duration": duration,
                    "event": "task_finished",
                    "task": name,
                    "time": at,
                }
                lines += [
                    orjson.dumps(started, option=_SORTED) + b"\n",
                    orjson.dumps(finished, option=_SORTED) + b"\n",
                ]
    os.close(results)
    os.close(log)


def _make_durable(records: list[str], results: int) -> None:
    """The records before their events: one syncfs, or an fsync each and one of
    their directory (crucible.run.session._log's ``_sync_records``)."""
    if len(records) >= _SYNCFS_MIN:
        if _syncfs(results) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return
    for path in records:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.fsync(results)


def main() -> int:
    root = sys.argv[1]
    tasks = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    try:
        for sub in ("work", "output", "results"):
            os.makedirs(f"{root}/{sub}")
    except OSError as exc:
        print(f"floor_engine: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    replies: list[int] = []
    children: list[int] = []
    for k in range(2):
        r, w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r)
                _worker(root, k * tasks // 2, (k + 1) * tasks // 2, w)
            except BaseException:
                traceback.print_exc()  # a failed floor says why
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        replies.append(r)
        children.append(pid)
    _log_events(root, replies)
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
