"""SLURM's client commands, as ``--executor slurm`` calls them.

Every call is one subprocess with a bounded wait; what goes wrong is one line
naming the command: missing from PATH is a usage error (exit 2), a controller
that does not answer (or any other failure of the command) an operational one
(exit 3). Parsing reads only the fields asked for with ``-o``/``--parsable``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence

from crucible.core.errors import OperationalError, UsageError
from crucible.core.structs import dataclass

__all__ = [
    "FORBIDDEN_EXTRA",
    "Partition",
    "SlurmCommands",
    "extra_args",
]

#: how long one SLURM command may take (a controller that does not answer
#: makes them retry for MessageTimeout, 10 s by default)
COMMAND_TIMEOUT = 60.0

#: sbatch options the executor sets itself: --slurm-extra may not override them
FORBIDDEN_EXTRA = ("--output", "-o", "--error", "-e", "--wrap", "--array", "-a",
                   "--parsable", "--job-name", "-J", "--chdir", "-D")  # fmt: skip


def extra_args(text: str | None) -> list[str]:
    """``--slurm-extra "ARGS"`` split as a shell would; a usage error for one
    that overrides what the executor sets (FORBIDDEN_EXTRA)."""
    if not text:
        return []
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--slurm-extra: {exc}") from None
    for arg in args:
        name = arg.split("=", 1)[0]
        short = name[:2] if name.startswith("-") and not name.startswith("--") else name
        if name in FORBIDDEN_EXTRA or short in FORBIDDEN_EXTRA:
            raise UsageError(
                f"--slurm-extra may not set {name}: the executor sets it (docs/spec/run.md, SLURM)"
            )
    return args


@dataclass(frozen=True)
class Partition:
    """One line of ``sinfo -e``: a partition's nodes of one configuration."""

    name: str
    default: bool
    cpus: int
    #: memory per node, MiB
    memory_mib: int
    gpus: int


def _gpus(gres: str) -> int:
    """The GPU count of a ``%G`` field (``gpu:2``, ``gpu:a100:4(S:0)``, ``(null)``)."""
    count = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            count = max(count, int(parts[-1]))
    return count


class SlurmCommands:
    """sbatch, squeue, scontrol, scancel and sinfo (see module doc)."""

    def run(self, argv: Sequence[str], *, check: bool = True) -> str:
        program = argv[0]
        if shutil.which(program) is None:
            raise UsageError(
                f"--executor slurm: {program} not found on PATH (SLURM's client commands)"
            )
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise OperationalError(
                f"--executor slurm: {program} did not answer within {COMMAND_TIMEOUT:.0f} s"
            ) from None
        except OSError as exc:
            raise OperationalError(
                f"--executor slurm: cannot run {program}: {exc.strerror}"
            ) from None
        if check and done.returncode != 0:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            why = lines[-1] if lines else f"exit status {done.returncode}"
            raise OperationalError(f"--executor slurm: {program}: {why}")
        return done.stdout

    def partitions(self) -> list[Partition]:
        """Every partition's node configurations (``sinfo -e``); answers that
        the controller is up."""
        out = self.run(["sinfo", "-h", "-e", "-o", "%P|%c|%m|%G"])
        found = []
        for line in out.splitlines():
            fields = line.strip().split("|")
            if len(fields) != 4:
                continue
            name, cpus, memory, gres = fields
            found.append(
                Partition(
                    name=name.rstrip("*"),
                    default=name.endswith("*"),
                    cpus=int(cpus.rstrip("+")) if cpus.rstrip("+").isdigit() else 0,
                    memory_mib=int(memory.rstrip("+")) if memory.rstrip("+").isdigit() else 0,
                    gpus=_gpus(gres),
                )
            )
        return found

    def sbatch(self, args: Sequence[str]) -> str:
        """The job id ``sbatch --parsable`` printed (``ID`` or ``ID;CLUSTER``)."""
        out = self.run(["sbatch", "--parsable", *args]).strip()
        job = out.split(";", 1)[0]
        if not job.isdigit():
            raise OperationalError(f"--executor slurm: sbatch printed {out!r}, not a job id")
        return job

    def squeue(self, name: str) -> dict[str, tuple[str, str]]:
        """Every queued or running element of the jobs named ``name``:
        ``{"JOB_INDEX" or "JOB": (state, reason)}`` (one call for the whole run)."""
        out = self.run(["squeue", "-h", "-r", "--name", name, "-o", "%i|%T|%r"])
        found: dict[str, tuple[str, str]] = {}
        for line in out.splitlines():
            fields = line.strip().split("|")
            if len(fields) == 3:
                found[fields[0]] = (fields[1], fields[2])
        return found

    def show_job(self, element: str) -> tuple[str, str] | None:
        """(JobState, Reason) of a job that just ended (``scontrol show job``:
        no ``sacct`` without accounting; known for MinJobAge after its end), or
        None once the controller forgot it."""
        out = self.run(["scontrol", "-o", "show", "job", element], check=False)
        for line in out.splitlines():
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            if "JobState" in fields:
                return fields["JobState"], fields.get("Reason", "None")
        return None

    def scancel(self, jobs: Sequence[str], *, kill: bool = False) -> None:
        """Cancel these jobs (SIGTERM to every process of theirs, SIGKILL after
        KillWait), or with ``kill`` SIGKILL them now."""
        if jobs:
            signal = ["--full", "--signal", "KILL"] if kill else []
            self.run(["scancel", *signal, *jobs], check=False)

    def stop(self, jobs: Sequence[str]) -> None:
        """The run stops: SIGTERM to the running elements' unit runners only
        (``--batch``: the runner stops its task as a local stop does, and the
        task is not killed under it), and the pending ones cancelled."""
        if jobs:
            self.run(
                ["scancel", "--batch", "--signal", "TERM", "--state", "RUNNING", *jobs], check=False
            )
            self.run(["scancel", "--state", "PENDING", *jobs], check=False)
