"""One clear error: a user error is reported once (rank 0), last on the screen, without a worker traceback.

The launch tests run torchrun itself (not the suite's forkserver launcher): what is tested is what a user
sees when torchrun's agent ends a job whose ranks met bad input (ecomkit.errors).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ecomkit import errors
from ecomkit.config import parse_config
from ecomkit.errors import ConfigError, DataError, EcomkitError, report_user_error
from ecomkit.launch import run_torchrun, user_error_from_agent_file

REPO = Path(__file__).resolve().parents[1]


def _torchrun(script: Path, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """torchrun with both ranks, every line of every process in the order it reached the terminal."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240)


def _bad_csv(path: Path) -> Path:
    rows = ["title,category,price"] + [f"商品{i} 数据线,数码配件,{10 + i}" for i in range(40)]
    rows[6] = "商品5 数据线,数码配件,cheap"       # file line 7: a price that is not a number
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.dist
def test_a_data_error_under_torchrun_is_printed_once_and_last(tmp_path):
    data = _bad_csv(tmp_path / "bad.csv")
    proc = _torchrun(REPO / "scripts" / "02_data_parallel.py",
                     ["--task", "nlu", "--data", str(data), "--strict-data", "--output-dir", str(tmp_path / "run"),
                      "--max-steps", "2", "--report-to", "none", "--no-progress"], tmp_path)
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    where = f"{data}, line 7, field 'price'"
    assert out.count(where) == 1, out[-6000:]                      # once, not once per rank
    last = [line for line in out.splitlines() if line.strip() and not set(line.strip()) <= {"="}]
    assert where in last[-1] and "--no-strict-data" in last[-1], out[-3000:]   # the last words on screen
    frames = [line for line in out.splitlines() if line.strip().startswith("File ")]
    ours = (str(REPO / "ecomkit"), str(REPO / "scripts"))           # not torchrun's frames (a venv may sit in REPO)
    assert not [f for f in frames if f.split('"')[1].startswith(ours)], out[-6000:]   # only torchrun's agent
    assert "[rank 1]" not in out, out[-6000:]
    assert "exitcode  : 2" in out                                   # the user-error exit status, not a crash


@pytest.mark.dist
def test_run_torchrun_raises_the_user_error_alone(tmp_path):
    script = tmp_path / "bad_input.py"
    script.write_text(textwrap.dedent("""
        from ecomkit.errors import DataError, exit_on_user_error

        @exit_on_user_error
        def main():
            raise DataError("reviews.csv, line 12, field 'sentiment': value 'meh' is not in label_map")

        main()
    """), encoding="utf-8")
    with pytest.raises(EcomkitError) as info:
        run_torchrun(script, nproc=2, env={"TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}, timeout=120,
                     live=False)
    text = str(info.value)
    assert text.startswith("reviews.csv, line 12, field 'sentiment'"), text
    assert "ChildFailedError" not in text and "Traceback" not in text and text.count("line 12") == 1


def _as_rank(monkeypatch, rank: int, error_file: Path | None = None) -> None:
    """This process as ``rank`` of 2 under torchrun, with its agent's error file or without one."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    if error_file is None:
        monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    else:
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))


def test_rank_0_writes_the_error_into_torchruns_error_file_instead_of_printing(tmp_path, monkeypatch, capsys):
    error_file = tmp_path / "error.json"
    _as_rank(monkeypatch, 0, error_file)
    with pytest.raises(SystemExit) as exit_info:
        report_user_error(DataError("a.csv, line 3: bad"))
    assert exit_info.value.code == errors.USER_ERROR_EXIT == 2
    assert capsys.readouterr().err == ""
    record = json.loads(error_file.read_text())
    assert record["message"]["extraInfo"]["py_callstack"] == "error: a.csv, line 3: bad"   # what torchrun shows
    assert user_error_from_agent_file(error_file) == "error: a.csv, line 3: bad"
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    with pytest.raises(SystemExit):
        report_user_error(DataError("a.csv, line 3: bad"))
    assert capsys.readouterr().err.strip() == "error: a.csv, line 3: bad"   # no torchrun: stderr, once


def test_another_rank_waits_for_rank_0_and_reports_only_an_error_of_its_own(monkeypatch, capsys):
    waited = []
    monkeypatch.setattr(errors.time, "sleep", waited.append)
    _as_rank(monkeypatch, 1)
    with pytest.raises(SystemExit):
        report_user_error(ConfigError("only rank 1 saw this"))
    assert waited == [errors.PEER_GRACE_S]
    assert capsys.readouterr().err.strip() == "[rank 1] error: only rank 1 saw this"


def test_a_mistyped_flag_is_a_user_error_with_the_closest_flag():
    with pytest.raises(ConfigError, match=r"unrecognized arguments: --max-stepz.*Did you mean --max-steps\?"):
        parse_config(["--max-stepz", "3"])


def test_agent_file_without_a_user_error_gives_none(tmp_path):
    crash = tmp_path / "crash.json"
    crash.write_text(json.dumps({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "..."}}}))
    assert user_error_from_agent_file(crash) is None
    assert user_error_from_agent_file(tmp_path / "missing.json") is None


def test_an_error_caused_by_a_gone_peer_never_becomes_torchruns_root_cause(tmp_path, monkeypatch, capsys):
    from ecomkit.faults.known_errors import CollectiveTimeoutError, raise_explained

    error_file = tmp_path / "error.json"
    _as_rank(monkeypatch, 0, error_file)
    with pytest.raises(CollectiveTimeoutError) as info:
        raise_explained(RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:29500"), 10.0, 0)
    with pytest.raises(SystemExit):
        report_user_error(info.value)
    assert not error_file.exists() and "a peer rank is gone" in capsys.readouterr().err
