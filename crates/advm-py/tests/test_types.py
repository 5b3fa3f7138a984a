"""The package's type hints, checked as a user's type checker sees them: `mypy --strict`
on these tests and on a small program (skipped when mypy is not installed)."""

import pathlib
import subprocess
import sys

import pytest

USER_PROGRAM = '''
import os

import numpy as np
import numpy.typing as npt

import advm


def serve(weights: npt.NDArray[np.float32], workers: list[int]) -> int:
    s: advm.MergeStats = advm.merge(weights)
    copy = advm.vcopy(weights)
    reveal_type(copy)
    together = advm.stat([os.getpid(), *workers])["physical_bytes"]
    version: str = advm.__version__
    return s["merged"] + s["added"] + int(copy.sum()) + int(together) + len(version)
'''


def test_the_tests_and_a_user_program_pass_mypy_strict(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (make deps-python installs it)")
    program = tmp_path / "serve.py"
    program.write_text(USER_PROGRAM)
    here = pathlib.Path(__file__).resolve().parent
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
         str(program), *map(str, sorted(here.glob("*.py")))],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0 and "Success: no issues found" in out.stdout, out.stdout + out.stderr
    # vcopy keeps its argument's type (it returned a bare ndarray, whose dtype is Any)
    revealed = next(line for line in out.stdout.splitlines() if "Revealed type" in line)
    assert "float32" in revealed or "32Bit" in revealed, revealed
