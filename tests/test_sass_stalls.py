"""bench/sass_stalls.py: Nsight Compute's source page summed per SASS instruction. The CSV here is a
test double of ncu's ``--page source --csv --print-source sass`` output (ncu is not on CPU machines):
its column names are the ones the tool looks for, its rows made up."""
import csv
import gzip
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import sass_stalls  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed"]
ROWS = [["0x10", "LDS.128 R12, [R50+0x10]", "40", "38", "1,000"],
        ["0x20", "DEPBAR.LE SB0, 0x1", "900", "890", "100"],
        ["0x30", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R5+UR25], R4", "50", "49", "300"],
        ["0x40", "SHF.R.W.U32 R16, R16, R20, R17", "10", "2", "2,000"]]


def _write(path: Path, preamble: str = "") -> Path:
    with (gzip.open(path, "wt", newline="") if path.suffix == ".gz" else open(path, "w", newline="")) as f:
        f.write(preamble)
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows([HEADER, *ROWS])
    return path


@pytest.mark.parametrize("name", ["src.csv", "src.csv.gz"])
def test_rows_ranked_by_all_samples_until_the_cover(tmp_path, capsys, name):
    path = _write(tmp_path / name, preamble="==PROF== Disconnected from process 1\n")
    assert sass_stalls.main([str(path), "--cover", "0.9"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| 0x")]
    # 1000 samples: DEPBAR alone is 90%, so it is the only row listed
    assert len(table) == 1 and "DEPBAR.LE" in table[0] and "90.0%" in table[0] and "1000 samples" in out
    assert sass_stalls.main([str(path), "--cover", "0.99"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0x")]
    assert [line.split(" | ")[0] for line in table] == ["| 0x20", "| 0x30", "| 0x10"]


def test_a_page_without_stall_sampling_is_said_not_read_as_no_stalls(tmp_path, capsys):
    path = tmp_path / "raw.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([["Address", "Source", "Instructions Executed"], ["0x10", "NOP", "1"]])
    assert sass_stalls.main([str(path)]) == 2
    assert "no 'Warp Stall Sampling' column" in capsys.readouterr().err
    (tmp_path / "junk.csv").write_text("ID,Kernel Name\n1,x\n")
    assert sass_stalls.main([str(tmp_path / "junk.csv")]) == 2
    assert "no header with a 'Source' column" in capsys.readouterr().err
