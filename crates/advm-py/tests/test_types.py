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


def test_the_stub_names_what_the_native_module_has_with_its_parameters() -> None:
    # _advm.pyi is what type checkers see of the native module; a function added,
    # renamed or given another parameter there must be changed in the stub too.
    import ast
    import inspect

    from advm import _advm

    stub = pathlib.Path(_advm.__file__ or "").parent / "_advm.pyi"
    tree = ast.parse(stub.read_text())
    stubbed = {n.name: [a.arg for a in n.args.args] for n in tree.body if isinstance(n, ast.FunctionDef)}
    names = {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    public = {k for k in dir(_advm) if not k.startswith("_") or k in ("__version__", "__source_id__")}
    runtime = {k: getattr(_advm, k) for k in public}
    assert set(stubbed) | names | classes == set(runtime)
    for name, params in stubbed.items():
        assert list(inspect.signature(runtime[name]).parameters) == params, name
    assert all(inspect.isclass(runtime[c]) for c in classes)


def test_the_public_functions_are_annotated_and_documented() -> None:
    import inspect

    import advm

    for name in advm.__all__:
        obj = getattr(advm, name)
        if name == "__version__":
            assert isinstance(obj, str)
            continue
        assert (obj.__doc__ or "").strip(), name
        if inspect.isfunction(obj):
            sig = inspect.signature(obj)
            assert sig.return_annotation is not inspect.Signature.empty, name
            assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), name
