"""The proof packages have the one package shape (issue 11 item 6): cli.py (click) ->
commands.py (options dataclass, run_<verb>) -> the library, internal modules
_-named, the public names exported by each package and loaded lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import crucible.proof.reader as reader
import crucible.proof.writer as writer

PROOF = Path(__file__).resolve().parents[2] / "tools" / "proof"
PUBLIC = {"__init__.py", "cli.py", "commands.py"}


@pytest.mark.parametrize("side", ["reader", "writer"])
def test_internal_modules_are_underscored(side: str) -> None:
    names = {p.name for p in (PROOF / side).glob("*.py")}
    assert names >= PUBLIC
    assert all(n.startswith("_") for n in names - PUBLIC), sorted(names - PUBLIC)


@pytest.mark.parametrize("package", [reader, writer])
def test_every_exported_name_resolves(package: object) -> None:
    for name in package.__all__:  # type: ignore[attr-defined]
        assert getattr(package, name) is not None, name
    with pytest.raises(AttributeError):
        package.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_reader_exports_verify_bundle_its_options_and_report() -> None:
    from crucible.proof.reader import Report, VerifyOptions, verify_bundle

    assert callable(verify_bundle) and VerifyOptions().expect is None
    assert Report().verdict == "reading"


@pytest.mark.parametrize(
    ("cli", "internal"),
    [
        ("crucible.proof.reader.cli", "crucible.proof.reader._"),
        ("crucible.proof.writer.cli", "crucible.proof.writer._"),
    ],
)
def test_help_loads_no_library_module(cli: str, internal: str) -> None:
    code = (
        f"import sys; from {cli} import command; "
        "from click.testing import CliRunner; CliRunner().invoke(command, ['--help']); "
        f"print(','.join(m for m in sys.modules if m.startswith({internal!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_no_module_aliases_its_siblings() -> None:
    for path in PROOF.rglob("*.py"):
        text = path.read_text()
        assert " as O\n" not in text and "def st(" not in text and "def pc(" not in text, path
        assert "def _phase" not in text, path
