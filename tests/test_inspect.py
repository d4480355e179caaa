"""``evo inspect``: the views of an archive, the evo-inspect/1 JSON document, and bad input."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evo.cli import _cmd_inspect
from evo.cli import main
from populations import Archive, Candidate, Evaluation, KernelStats, Launch, LaunchPlan, Shape, Status, TimerResult

ROOT = Path(__file__).resolve().parents[1]
S1, S2 = Shape(128, 256, 64), Shape(4096, 4096, 4096, "NN")
PLAN = LaunchPlan(launches=(Launch("k", ("cdiv(N, 128)", "cdiv(M, 128)", 1), (256, 1, 1), ("A", "B", "C", "M", "N", "K")),))
DOC = (ROOT / "docs" / "inspect-json.md").read_text()


def timer(t: float, base: float = 1e-3) -> TimerResult:
    return TimerResult(t, t * 0.99, t * 1.01, base, base * 0.99, base * 1.01, 25)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Candidate]]:
    """A small archive: a chain of five candidates (one [odd] knob value), evaluations of every
    status, a flagged one, an LLM crossover with a missing parent, and a second shape."""
    root = tmp_path_factory.mktemp("inspect") / "arch"
    cs: list[Candidate] = []
    with Archive(root, "w") as a:
        for i in range(5):
            c = Candidate(source=f"__global__ void k() {{ /* {i} */ }}", plan=PLAN, shapes=(S1, S2) if i == 4 else (S1,),
                          template="sm80_mma", knobs={"BM": 64 * (i + 1), "NOTE": "[bold]x"},
                          parents=(cs[-1].id,) if cs else (), operator="mutate" if cs else "seed", generation=i)
            cs.append(c)
            evs = [Evaluation(c.id, S1, Status.OK, timers={"device": timer(1e-3 / (1 + i / 10)), "offline": timer(1.1e-3)},
                              kernels=(KernelStats("k", registers=100 + i, spill_stores=4 * i),), arch="sm_90a")]
            a.record(c, evs)
        a.add(Evaluation(cs[0].id, S1, Status.COMPILE_ERROR, message="error: x"))
        a.add(Evaluation(cs[1].id, S1, Status.FLAGGED, flags=("too fast",)))
        a.add(Evaluation(cs[4].id, S2, Status.OK, timers={"device": timer(2e-3)}))
        llm = Candidate(source="__global__ void k() { /* llm */ }", plan=PLAN, shapes=(S2,), operator="llm_crossover",
                        model="smollm2", parents=(cs[4].id, cs[2].id, "f" * 20), generation=5)
        a.add(llm)
        cs.append(llm)
    return root, cs


def inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_document(archive: tuple[Path, list[Candidate]], capsys: pytest.CaptureFixture[str]) -> None:
    root, cs = archive
    code, out, err = inspect(capsys, root, "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["format"] == "evo-inspect/1" and doc["archive"] == str(root) and doc["lineage"] is None
    assert [s["shape"] for s in doc["shapes"]] == [str(S1), str(S2)]
    s1 = doc["shapes"][0]
    assert s1["candidates"] == 5 and s1["evaluations"] == 7
    assert s1["status_counts"] == {"ok": 5, "rejected": 0, "compile_error": 1, "runtime_error": 0, "timeout": 0,
                                   "incorrect": 0, "flagged": 1}
    ids = [e["id"] for e in s1["elites"]]
    assert ids == [cs[4].id, cs[3].id, cs[2].id, cs[0].id]  # cs[1] was flagged
    top = s1["elites"][0]
    assert s1["best_speedup"] == pytest.approx(1.4) == top["fitness"]
    assert top["registers"] == 104 and top["spills"] == 16 and top["knobs"] == {"BM": 320, "NOTE": "[bold]x"}
    assert top["timers"]["device"]["speedup"] == pytest.approx(1.4)
    assert top["timers"]["offline"]["baseline_median_s"] == pytest.approx(1e-3)
    # every field the document promises is documented, and nothing undocumented appears
    for key in [*doc, *s1, *top, *top["timers"]["device"]]:
        assert f"`{key}`" in DOC, f"field {key} is missing from docs/inspect-json.md"


def test_json_shape_top_and_lineage(archive: tuple[Path, list[Candidate]], capsys: pytest.CaptureFixture[str]) -> None:
    root, cs = archive
    code, out, _ = inspect(capsys, root, "--json", "--shape", "128x256x64:tn", "--top", "2")
    doc = json.loads(out)
    assert code == 0 and [s["shape"] for s in doc["shapes"]] == [str(S1)] and len(doc["shapes"][0]["elites"]) == 2
    code, out, _ = inspect(capsys, root, "--json", "--lineage", cs[5].id[:7])
    doc = json.loads(out)
    assert code == 0 and doc["shapes"] == []
    lin = doc["lineage"]
    assert lin["root"] == cs[5].id
    nodes = {n["id"]: n for n in lin["nodes"]}
    assert len(nodes) == len(lin["nodes"]) == 7  # the llm child, its 5 ancestors (once each) and a missing parent
    assert nodes[cs[5].id]["parents"] == [cs[4].id, cs[2].id, "f" * 20] and nodes[cs[5].id]["model"] == "smollm2"
    assert nodes["f" * 20]["found"] is False and nodes[cs[0].id]["parents"] == []
    assert nodes[cs[4].id]["shapes"] == [str(S1), str(S2)]
    for key in [*lin["nodes"][0]]:
        assert f"`{key}`" in DOC


def test_tables_when_piped(archive: tuple[Path, list[Candidate]], capsys: pytest.CaptureFixture[str]) -> None:
    root, cs = archive
    code, out, err = inspect(capsys, root)
    assert code == 0 and err == ""
    assert "128x256x64:TN:f32  best 1.400x vs cuBLAS  (5 candidates, 7 evaluations)" in out
    assert "ok 5  compile_error 1  flagged 1" in out
    assert "4096x4096x4096:NN:f32  best 0.500x vs cuBLAS" in out
    assert cs[4].id[:12] in out and "BM=320 NOTE=[bold]x" in out  # knob text is shown, not read as markup
    for col in ("regs", "spills", "device us", "device x", "offline us", "offline x"):
        assert col in out
    assert "\x1b[" not in out  # no colour codes into a pipe


def test_lineage_text_and_terminal_tree(archive: tuple[Path, list[Candidate]], capsys: pytest.CaptureFixture[str]) -> None:
    root, cs = archive
    code, out, _ = inspect(capsys, root, "--lineage", cs[5].id)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(cs[5].id[:12]) and "llm_crossover" in lines[0] and "smollm2" in lines[0]
    assert lines[1].startswith("  <- " + cs[4].id[:12])
    assert any("(repeated above)" in ln for ln in lines) and any("(not in this archive)" in ln for ln in lines)

    class Terminal(io.StringIO):  # a double for the one thing we cannot give a test: a real terminal
        def isatty(self) -> bool:
            return True

    with Archive(root) as a:
        report, tree = _cmd_inspect.build_report(a, None, 3, cs[5].id)
    term = Terminal()
    _cmd_inspect.render_rich(report, tree, term)
    assert "└──" in term.getvalue() or "├──" in term.getvalue()  # rich's tree, not the plain text


def test_csv(archive: tuple[Path, list[Candidate]], capsys: pytest.CaptureFixture[str]) -> None:
    root, cs = archive
    code, out, _ = inspect(capsys, root, "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 5
    assert rows[0]["id"] == cs[4].id and float(rows[0]["device_speedup"]) == pytest.approx(1.4)
    assert json.loads(rows[0]["knobs"]) == {"BM": 320, "NOTE": "[bold]x"}
    assert rows[-1]["shape"] == str(S2) and rows[-1]["offline_speedup"] == ""
    code, out, _ = inspect(capsys, root, "--csv", "--lineage", cs[5].id)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[0]["depth"] == "0" and rows[1]["child"] == cs[5].id and len(rows) >= 7


BAD_INPUT = {
    "missing dir": (["{missing}"], "no such archive directory"),
    "not an archive": (["{plain}"], "not an evo archive"),
    "zero shape": (["{root}", "--shape", "0x128x128"], "M must be >= 1"),
    "negative shape": (["{root}", "--shape", "128x-1x128"], "must be >= 1"),
    "non-integer shape": (["{root}", "--shape", "128x1.5x128"], "whole number"),
    "absurd shape": (["{root}", "--shape", "99999999x1x1"], "absurd"),
    "garbage shape": (["{root}", "--shape", "big"], "cannot parse shape"),
    "absent shape": (["{root}", "--shape", "1x1x1"], "no population for shape"),
    "unknown id": (["{root}", "--lineage", "0123456789"], "unknown candidate id"),
    "empty id": (["{root}", "--lineage", ""], "unknown candidate id"),
    "top zero": (["{root}", "--top", "0"], "--top must be at least 1"),
    "top text": (["{root}", "--top", "many"], "--top must be a whole number"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input(case: str, archive: tuple[Path, list[Candidate]], tmp_path: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = archive
    (tmp_path / "plain").mkdir()
    argv, message = BAD_INPUT[case]
    argv = [a.format(root=root, missing=tmp_path / "missing", plain=tmp_path / "plain") for a in argv]
    before = {p: p.stat().st_mtime_ns for p in [root, *root.iterdir(), tmp_path, *tmp_path.iterdir()]}
    code, out, err = inspect(capsys, *argv, "--json")
    assert code == 2 and out == ""
    assert err.startswith("evo inspect: ") and message in err and err.count("\n") == 1
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing written anywhere
    assert not (tmp_path / "missing").exists() and sorted(os.listdir(tmp_path / "plain")) == []


def test_ambiguous_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Archive(tmp_path / "a", "w") as a:
        for i in range(40):  # 40 ids over 16 hex digits: some first digit repeats
            a.add(Candidate(source=f"__global__ void k() {{ /* {i} */ }}", plan=PLAN, shapes=(S1,)))
        first = [cid[0] for cid in a.candidate_ids(S1)]
    prefix = next(d for d in first if first.count(d) > 1)
    code, out, err = inspect(capsys, tmp_path / "a", "--lineage", prefix)
    assert code == 2 and out == "" and "ambiguous" in err


def test_damage_is_reported_and_exits_3_unless_allowed(archive: tuple[Path, list[Candidate]], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = archive
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in root.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    log = copy / f"{S1.key}.evolog"
    data = bytearray(log.read_bytes())
    data[len(data) // 3] ^= 0xFF
    log.write_bytes(bytes(data))
    code, out, err = inspect(capsys, copy, "--json")
    assert code == 3 and json.loads(out)["format"] == "evo-inspect/1"  # what could be read is still shown
    assert err.startswith("evo inspect: warning: ") and "damaged bytes" in err and str(log) in err
    code, out, err = inspect(capsys, copy, "--json", "--allow-damaged")
    assert code == 0 and json.loads(out)["format"] == "evo-inspect/1" and "damaged bytes" in err


def test_command_line_entry_point(archive: tuple[Path, list[Candidate]]) -> None:
    root, _ = archive
    ok = subprocess.run([sys.executable, "-m", "evo", "inspect", str(root), "--top", "1"], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "best 1.400x vs cuBLAS" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "evo", "inspect", str(root / "nope")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1
