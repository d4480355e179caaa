"""bench/grammar_host.py (issue 35): the grammars of one batched call driven without a model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "grammar_host.py"), *args], capture_output=True,
                          text=True, timeout=300)


def test_holds_leave_no_row_stuck_where_plain_grammars_do(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    r = run("--rows", "32", "--seeds", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["results"]
    holds = [x for x in rows if x["arm"] == "holds"]
    plain = [x for x in rows if x["arm"] == "plain"]
    assert len(holds) == len(plain) == 3
    assert all(x["stuck"] == 0 and x["finished"] == 32 for x in holds), holds
    assert sum(x["stuck"] for x in plain) > 0  # the crowding chooser does strand plain rows


def test_bad_rows_is_one_line_and_exit_2() -> None:
    r = run("--rows", "many")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--rows" in r.stderr
