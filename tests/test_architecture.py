"""The house rules of ``ecomkit``'s layout (and of ``ecomlab``, the lab beside it), checked so they cannot drift.

- The floors (``[tool.importlinter]`` in pyproject.toml) hold: ``lint-imports``
  passes, and it *fails* on a copy of the packages with one upward import added,
  or with ``ecomkit`` importing ``ecomlab``, so the contracts are known to bite.
- No function-level import of an ecomkit or ecomlab module (an upward arrow in disguise).
  Function-level imports are kept only for heavy optional third-party packages,
  each with a ``# lazy:`` comment giving its reason.
- At most 10 modules directly under ``ecomkit/``; no module over about 400 lines (the training loop: 700).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import grimp  # comes with import-linter (the test extra)
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ecomkit"
PACKAGES = ("ecomkit", "ecomlab")      # the core and the measurement lab, one distribution
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
MAX_TOP_LEVEL_MODULES = 10
MAX_MODULE_LINES = 420   # "about 400": a docstring's worth of slack, not a second module
# The training loop reads as one file, top to bottom (torchtitan's train.py): build, step, evaluation, report.
LONGER_MODULES = {"ecomkit/train/loop.py": 700}
LAZY_MARK = "# lazy:"
# Heavy or optional third-party packages that may be imported inside a function (with a reason).
LAZY_ALLOWED = ("deepspeed", "accelerate", "peft", "bitsandbytes", "pynvml", "ipywidgets", "matplotlib", "IPython",
                "tqdm.notebook",  # tqdm's ipywidgets-backed bar
                "torch.utils.tensorboard", "tensorboard", "wandb", "mlflow",  # --report-to sinks and reader (ecomkit.reporting)
                "trl",  # TRL's SFTTrainer: the packing benchmark's peer (ecomkit.train.hf_trainer)
                "liger_kernel", "cut_cross_entropy")  # --loss-kernel liger|cce: the GPU extra (ecomkit.models.loss)


def _lint(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the test extra (pip install -e '.[test]').")
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_import_contract_holds():
    result = _lint(ROOT, ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of both packages and the contracts, with ``line`` appended to ``module`` (a path under the copy)."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # deliberate\n")
    return tmp_path


@pytest.mark.parametrize("module, line, expected", [
    ("ecomkit/errors.py", "import ecomkit.plan", ["ecomkit.errors -> ecomkit.plan"]),
    ("ecomkit/metrics.py", "import ecomlab.rates", ["ecomkit never imports ecomlab BROKEN",
                                                    "ecomkit.metrics -> ecomlab.rates"]),
    ("ecomlab/artifacts.py", "import ecomlab.measure.zero", ["ecomlab.artifacts -> ecomlab.measure.zero"]),
], ids=["ecomkit ground imports its top floor", "ecomkit imports the lab", "ecomlab ground imports its experiments"])
def test_import_contracts_fail_on_a_copy_with_one_bad_import(tmp_path, module, line, expected):
    result = _lint(_copy_with(tmp_path, module, line), tmp_path)
    assert result.returncode != 0, result.stdout
    assert all(text in result.stdout for text in expected), result.stdout


def test_no_import_cycles():
    """No module reaches itself through its imports, ``if TYPE_CHECKING:`` ones included (config.validate names
    TrainConfig without importing schema, which imports it)."""
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)
    cycles = [(a, b) for a in sorted(graph.modules) for b in graph.find_modules_directly_imported_by(a)
              if graph.find_shortest_chain(importer=b, imported=a)]
    assert not cycles, cycles


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _function_level_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, imported module, source line) for every import statement inside a def."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            found += [(node.lineno, name, lines[node.lineno - 1]) for name in names]
    return found


def test_no_function_level_imports_of_ecomkit_modules():
    offenders = [f"{p.relative_to(ROOT)}:{line}: {src.strip()}"
                 for p in _modules() for line, name, src in _function_level_imports(p)
                 if name.startswith((".", *PACKAGES))]
    assert not offenders, "import these at module level (or move the code to the right floor):\n" + "\n".join(
        offenders)


def _lazy_import_problem(name: str, src: str) -> str | None:
    if name.startswith((".", *PACKAGES)):
        return None  # reported by the test above
    if not any(name == ok or name.startswith(ok + ".") for ok in LAZY_ALLOWED):
        return f"import {name} at module level (only {', '.join(LAZY_ALLOWED)} may be imported lazily)"
    if LAZY_MARK not in src:
        return f"add '{LAZY_MARK} <reason>' on the line"
    return None


def test_function_level_imports_are_heavy_optional_packages_with_a_reason():
    offenders = [f"{p.relative_to(ROOT)}:{line}: {src.strip()}  -> {why}"
                 for p in _modules() for line, name, src in _function_level_imports(p)
                 if (why := _lazy_import_problem(name, src))]
    assert not offenders, "\n".join(offenders)


def test_top_level_is_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_module_is_too_long():
    lines = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules()}
    long = {name: n for name, n in lines.items() if n > LONGER_MODULES.get(name, MAX_MODULE_LINES)}
    assert not long, f"split these modules (more than {MAX_MODULE_LINES} lines, {LONGER_MODULES}): {long}"


# Issue 55's bounds on the package's size and its prose (docstrings, comment-only lines, lines with a comment).
MAX_PACKAGE_LINES, MAX_PROSE_SHARE = 26_000, 0.18


def prose_lines(source: str) -> tuple[int, int]:
    """(lines, prose lines) of one module: a line counts as prose if it is in a docstring or holds a comment."""
    prose = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and \
                isinstance(body[0].value.value, str):
            prose.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = source.splitlines()
    readline = iter(source.splitlines(keepends=True)).__next__
    prose.update(tok.start[0] for tok in tokenize.generate_tokens(readline) if tok.type == tokenize.COMMENT)
    return len(lines), len(prose)


def test_the_package_is_small_and_its_prose_short():
    counts = [prose_lines(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))]
    lines, prose = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert lines <= MAX_PACKAGE_LINES, lines
    assert prose / lines <= MAX_PROSE_SHARE, f"{prose} of {lines} lines are docstrings or comments ({prose / lines:.1%})"


def test_prose_lines_count_docstrings_and_comments_once_each():
    src = '''"""Module.

Why."""
x = 1  # note
# alone
def f():
    """One line."""
    return 2
'''
    assert prose_lines(src) == (8, 6)


def test_checks_catch_what_they_look_for(tmp_path):
    """The AST scan itself finds a nested ecomkit import and a lazy import without its reason."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ecomkit.dist import log\n    import deepspeed\n"
                     "    import accelerate  # lazy: heavy optional package\n")
    probe.write_text(probe.read_text() + "    import yaml  # lazy: not heavy\n")
    found = _function_level_imports(probe)
    assert [(n, LAZY_MARK in s) for _, n, s in found] == [
        ("ecomkit.dist", False), ("deepspeed", False), ("accelerate", True), ("yaml", True)]
    assert [_lazy_import_problem(n, s) is None for _, n, s in found] == [True, False, True, False]
