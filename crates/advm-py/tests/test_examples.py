"""The docs' Python examples (examples/python/*.py) run as they stand; advm's Rust test
`doc_examples` checks that the pages show them as they are."""

import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[3] / "examples" / "python").glob("*.py"))


def test_there_are_examples() -> None:
    assert EXAMPLES, "examples/python is empty"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(example: pathlib.Path) -> None:
    # The process's own store: the example must not depend on a running advmd.
    env = dict(os.environ, ADVM_SOCKET="/nonexistent/advmd.sock")
    out = subprocess.run([sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{example.name} failed:\n{out.stdout}{out.stderr}"
