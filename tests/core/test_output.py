"""core.output: all of the output or a failure; never rename over a device,
a FIFO or a link's place, never block on a FIFO (issue 12 items 3 and 4).

Devices, FIFOs and links are made inside tmp_path; no test touches /dev."""

from __future__ import annotations

import io
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from crucible.core.errors import OperationalError, UsageError
from crucible.core.output import write_output, write_stream

BIN = Path(sys.executable).parent
PACK = 'edition = 3\n[workflow]\nname = "w"\n[[workflow.task]]\nname = "a"\nrun = "true"\n'


def _device(path: Path, minor: int) -> Path:
    """A character device of the mem driver (3 null, 7 full) inside tmp_path."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    return path


def test_regular_file_is_replaced_and_identical_untouched(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert write_output(str(out), b"abc")
    assert out.read_bytes() == b"abc"
    before = out.stat()
    assert not write_output(str(out), b"abc", if_changed=True)
    assert out.stat().st_ino == before.st_ino and out.stat().st_mtime_ns == before.st_mtime_ns
    assert write_output(str(out), b"abcd", if_changed=True)
    assert out.read_bytes() == b"abcd"


def test_symlink_to_a_file_stays_a_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"old")
    link = tmp_path / "link"
    link.symlink_to(target)
    write_output(str(link), b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"


def test_dangling_link_and_directory_are_refused(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="dangling"):
        write_output(str(link), b"x")
    assert not (tmp_path / "nowhere").exists() and link.is_symlink()
    with pytest.raises(UsageError, match="directory"):
        write_output(str(tmp_path), b"x")


def test_device_is_written_through_never_renamed_over(tmp_path: Path) -> None:
    null = _device(tmp_path / "null", 3)
    assert write_output(str(null), b"x" * 100_000, if_changed=True)
    assert stat.S_ISCHR(null.lstat().st_mode)
    full = _device(tmp_path / "full", 7)
    with pytest.raises(OperationalError, match="No space left"):
        write_output(str(full), b"x")
    assert stat.S_ISCHR(full.lstat().st_mode)
    link = tmp_path / "stdout"  # as /dev/stdout: a link to a device
    link.symlink_to(null)
    write_output(str(link), b"y")
    assert link.is_symlink() and stat.S_ISCHR(null.lstat().st_mode)


def test_fifo_without_a_reader_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="no reader"):
        write_output(str(fifo), b"x", if_changed=True)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_fifo_with_a_reader_gets_every_byte(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)

    data = os.urandom(300_000)  # more than a pipe holds: the writer must block, then finish

    def read() -> None:
        # A read before any writer opened the FIFO sees EOF: keep reading until
        # every byte came (the descriptor stays open, so a reader always exists).
        chunks: list[bytes] = []
        deadline = time.monotonic() + 10
        while sum(map(len, chunks)) < len(data) and time.monotonic() < deadline:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                time.sleep(0.001)
            chunks.append(chunk)
        got.append(b"".join(chunks))

    reader = threading.Thread(target=read)
    reader.start()
    write_output(str(fifo), data, if_changed=True)
    reader.join(10)
    os.close(fd)
    assert got == [data] and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_write_stream_in_memory_and_short_write() -> None:
    buf = io.BytesIO()
    write_stream(buf, b"abc")
    assert buf.getvalue() == b"abc"

    class Short(io.BytesIO):
        def write(self, data: object) -> int:
            return 1

    with pytest.raises(OperationalError, match="<stdout>"):
        write_stream(Short(), b"abc")


def _limit_file_size() -> None:
    # a file that can grow to 40 KiB: writes past it fail as on a full disk
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40960, 40960))


def test_compile_to_stdout_on_a_full_disk_is_exit_3_not_truncated(tmp_path: Path) -> None:
    tasks = "".join(
        f'[[workflow.task]]\nname = "t{i}"\nrun = "echo {"x" * 200}"\n' for i in range(400)
    )
    pack = tmp_path / "big.toml"
    pack.write_text('edition = 3\n[workflow]\nname = "w"\n' + tasks)
    out = tmp_path / "plan.json"
    with out.open("wb") as f:
        proc = subprocess.run(
            [BIN / "crucible-compile", pack],
            stdout=f,
            stderr=subprocess.PIPE,
            preexec_fn=_limit_file_size,
            timeout=60,
        )
    assert out.stat().st_size == 40960  # the payload is larger than the limit
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith("crucible-compile: error: <stdout>: I/O error:")


def _compile_to(tmp_path: Path, target: Path) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK)
    return subprocess.run(
        [BIN / "crucible-compile", pack, "-o", target], capture_output=True, text=True, timeout=20
    )


def test_compile_o_fifo_without_reader_is_exit_2_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = _compile_to(tmp_path, fifo)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert str(fifo) in line and "no reader" in line
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_compile_o_device_and_link_to_pipe_stay_what_they_are(tmp_path: Path) -> None:
    null = _device(tmp_path / "null", 3)
    proc = _compile_to(tmp_path, null)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(null.lstat().st_mode)
    full = _device(tmp_path / "full", 7)
    proc = _compile_to(tmp_path, full)
    assert proc.returncode == 3 and "No space left" in proc.stderr
    assert stat.S_ISCHR(full.lstat().st_mode)
    # -o /dev/stdout on a pipe: a link to the process's fd 1 (here: to a pipe)
    pack = tmp_path / "pack.toml"
    script = f"ln -s /proc/self/fd/1 {tmp_path}/so; exec {BIN}/crucible-compile {pack} -o {tmp_path}/so | wc -c"
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0 and (tmp_path / "so").is_symlink()


def test_report_html_to_a_fifo_or_device_is_never_renamed_over(tmp_path: Path) -> None:
    # issue 12 item 3: report --html X renamed over a device and hung on a FIFO
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK)
    state = tmp_path / "state"
    ran = subprocess.run(
        [BIN / "crucible-dispatch", pack, "--state", state],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    report: list[str | Path] = [BIN / "crucible-dispatch", "report", state, "--html"]
    done = subprocess.run([*report, fifo], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no reader" in done.stderr, done.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    null = _device(tmp_path / "null", 3)
    done = subprocess.run([*report, null], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(null.lstat().st_mode)
