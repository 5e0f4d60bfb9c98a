"""Tests for ecomkit.launch: notebooks' way of running scripts under torchrun."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ecomkit.errors import DataError, EcomkitError
from ecomkit.launch import read_json, read_jsonl, repo_root, run_python, run_torchrun

ROOT = Path(__file__).resolve().parents[1]


def write_script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_repo_root_found_from_a_subfolder(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT / "tests")
    assert repo_root() == ROOT
    with pytest.raises(EcomkitError, match="pyproject.toml"):
        repo_root(tmp_path)


@pytest.mark.dist
def test_run_torchrun_streams_every_rank(tmp_path, capsys):
    script = write_script(tmp_path, "hello.py", """
        import os
        print(f"hello from rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}"
              f" omp={os.environ['OMP_NUM_THREADS']}")
    """)
    result = run_torchrun(script, nproc=2, env={"TMPDIR": str(tmp_path)}, timeout=60)
    assert result.returncode == 0
    for rank in (0, 1):
        assert f"hello from rank {rank} of 2 omp=1" in result.stdout
    assert "hello from rank 1 of 2" in capsys.readouterr().out  # printed live, not only returned


@pytest.mark.dist
def test_run_torchrun_failure_raises_with_the_message(tmp_path):
    script = write_script(tmp_path, "fail.py", """
        import os, sys
        if os.environ["RANK"] == "1":
            print("rank 1: the catalog file is corrupt", file=sys.stderr, flush=True)
            sys.exit(3)
    """)
    with pytest.raises(EcomkitError) as info:
        run_torchrun(script, nproc=2, env={"TMPDIR": str(tmp_path)}, timeout=60, live=False)
    assert "rank 1: the catalog file is corrupt" in str(info.value)
    assert "exit status" in str(info.value)


def test_run_python_passes_args_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the default of 1 must come from run_python
    script = write_script(tmp_path, "echo.py", """
        import os, sys
        print("args", sys.argv[1:], "omp", os.environ["OMP_NUM_THREADS"], "x", os.environ["X"])
    """)
    out = run_python(script, ["--a", 1], env={"X": "y"}, live=False).stdout
    assert "args ['--a', '1'] omp 1 x y" in out
    out = run_python(script, [], env={"X": "y", "OMP_NUM_THREADS": "2"}, live=False).stdout
    assert "omp 2" in out


def test_timeout_kills_and_raises(tmp_path):
    script = write_script(tmp_path, "slow.py", """
        import time
        print("started", flush=True)
        time.sleep(60)
    """)
    with pytest.raises(EcomkitError, match="did not finish within 1.5 s") as info:
        run_python(script, timeout=1.5, live=False)
    assert "started" in str(info.value)


def test_missing_script_is_a_clear_error():
    with pytest.raises(EcomkitError, match="does not exist"):
        run_python("scripts/no_such_script.py")


def test_read_json_and_jsonl(tmp_path):
    good = tmp_path / "m.jsonl"
    good.write_text('{"step": 1, "loss": 2.5}\n\n{"step": 2, "loss": 2.0}\n')
    assert read_jsonl(good) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.0}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n{"step": 2, "lo')
    with pytest.raises(DataError, match="line 2"):
        read_jsonl(bad)
    (tmp_path / "r.json").write_text('{"ok": true}')
    assert read_json(tmp_path / "r.json") == {"ok": True}
    with pytest.raises(DataError, match="no such file"):
        read_json(tmp_path / "absent.json")
