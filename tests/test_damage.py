"""Issue 38: damage is never silent, bad input never succeeds, first steps explain themselves.

The archive side (populations): damage only the side index can show (a log cut at a record
boundary, a log removed), damaged headers and versions, dangling evaluations, lineage through a
lost candidate, check and repair. The command side: export/report refuse a damaged archive and
record the damage with --allow-damaged, seed counts what it really wrote, a closed pipe is quiet,
evo eval works without a GPU, propose says what it is doing and takes the optuna alias.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import archive_fixture
from evo.cli import main
from populations import Archive, Candidate, Evaluation, Launch, LaunchPlan, Shape, Status, TimerResult
from populations import check_archive, repair_archive

S, S2 = Shape(128, 256, 64), Shape(64, 64, 64)
PLAN = LaunchPlan(launches=(Launch("k", ("cdiv(N, 128)", "cdiv(M, 128)", 1), (256, 1, 1), ("A", "B", "C", "M", "N", "K")),))


def _cand(i: int, parents: tuple[str, ...] = (), shapes: tuple[Shape, ...] = (S,)) -> Candidate:
    return Candidate(source=f'extern "C" __global__ void k() {{ /* {i} */ }}', plan=PLAN, shapes=shapes, parents=parents)


def _ev(c: Candidate, shape: Shape = S, t: float = 1e-3) -> Evaluation:
    return Evaluation(c.id, shape, Status.OK, timers={"device": TimerResult(t, t, t, 2e-3, 2e-3, 2e-3, 9)})


def _build(root: Path, n: int = 6) -> list[Candidate]:
    cands = []
    with Archive(root, "w") as a:
        for i in range(n):
            c = _cand(i, (cands[-1].id,) if cands else ())
            a.record(c, [_ev(c, t=1e-3 / (1 + i))], durable=True)
            cands.append(c)
    return cands


def _log(root: Path, shape: Shape = S) -> Path:
    return root / f"{shape.key}.evolog"


def _problems(root: Path, **kw: bool) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = Archive(root, "r", **kw)
        try:
            return a.problems()
        finally:
            a.close()


def _keep_mtime(path: Path, data: bytes) -> None:
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


# -- the archive -----------------------------------------------------------------------------------
def test_a_log_cut_at_a_record_boundary_is_damage_the_index_shows(tmp_path: Path) -> None:
    _build(tmp_path)
    data = _log(tmp_path).read_bytes()
    _log(tmp_path).write_bytes(data[:8])  # the header only: reads as a whole, empty log
    for verify in (False, True):
        found = _problems(tmp_path, verify=verify)
        assert len(found) == 1 and "12 record(s) that the index lists are lost" in found[0], found
        assert f"the log is 8 bytes, the index recorded {len(data)}" in found[0]


def test_a_flipped_byte_under_a_valid_index_is_found_by_a_verifying_reader(tmp_path: Path) -> None:
    _build(tmp_path, 30)
    data = bytearray(_log(tmp_path).read_bytes())
    data[len(data) // 4] ^= 0x40  # before the tail the index checksums (its last 4 KiB)
    _keep_mtime(_log(tmp_path), bytes(data))  # size and mtime kept: the index still "describes" it
    assert _problems(tmp_path) == []  # the fast path trusts the index (docs/cli.md says so)
    found = _problems(tmp_path, verify=True)
    assert any("damaged bytes skipped" in p and "record(s) lost" in p for p in found), found
    assert any("that the index lists are lost" in p for p in found), found


@pytest.mark.parametrize("header,needle", [(b"", "empty (0 bytes)"), (b"EVOLOX\x02\x00", "damaged header"),
                                           (b"EVOLOG" + struct.pack("<H", 99), "v99 is unknown"),
                                           (b"EVOLOG" + struct.pack("<H", 0), "v0 is unknown")])
def test_damaged_headers_are_damage_not_empty_shapes(tmp_path: Path, header: bytes, needle: str) -> None:
    _build(tmp_path)
    data = _log(tmp_path).read_bytes()
    _log(tmp_path).write_bytes(header + data[len(header):] if header else b"")
    found = _problems(tmp_path)
    assert len(found) == 1 and needle in found[0] and "its index lists 12 record(s)" in found[0], found


def test_a_removed_log_is_reported_by_its_index(tmp_path: Path) -> None:
    _build(tmp_path)
    _log(tmp_path).unlink()
    found = _problems(tmp_path)
    assert len(found) == 1 and "missing" in found[0] and "12 record(s)" in found[0], found


def test_a_removed_index_is_not_damage(tmp_path: Path) -> None:
    _build(tmp_path)
    (tmp_path / f"{S.key}.evolog.idx").unlink()
    assert _problems(tmp_path, verify=True) == [] and check_archive(tmp_path).ok


def test_dangling_evaluations_and_lineage_through_a_lost_candidate(tmp_path: Path) -> None:
    cands = _build(tmp_path)
    data = bytearray(_log(tmp_path).read_bytes())
    with Archive(tmp_path) as a:  # the best candidate's frame: damage it, keep its evaluation
        entry = a._shape_log(S).cands[cands[-1].id]
    data[entry.data_offset + 3] ^= 0xFF
    _log(tmp_path).write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = Archive(tmp_path, verify=True)
        found = a.problems()
        assert any("evaluation(s) of 1 candidate(s) this log no longer holds" in p for p in found), found
        best = a.elites(S, top=1)[0]
        assert best.candidate_id == cands[-1].id and best.candidate is None
        with pytest.raises(KeyError):
            a.lineage(cands[-1].id)
        tree = a.lineage(cands[-1].id, missing_ok=True)
        assert tree.candidate is None and tree.parents == ()
        a.close()


def test_check_and_repair_write_a_whole_copy_beside_it(tmp_path: Path) -> None:
    root = tmp_path / "a"
    cands = _build(root)
    with Archive(root, "w") as a:  # a candidate in two shapes: its second log gets damaged
        c = _cand(99, shapes=(S, S2))
        a.record(c, [_ev(c), _ev(c, S2)], durable=True)
    (root / "calibration.json").write_text("{}")
    data = bytearray(_log(root).read_bytes())
    data[len(data) // 3] ^= 0x11
    _log(root).write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    found = check_archive(root)
    assert not found.ok and found.shapes == 2
    fixed = repair_archive(root)
    assert fixed.out == str(root) + ".repaired" and fixed.evaluations >= 1
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before  # the original is only read
    again = check_archive(fixed.out)
    assert again.ok and (Path(fixed.out) / "calibration.json").is_file()
    assert again.candidates + len(fixed.dropped) >= found.candidates - 1
    with pytest.raises(Exception, match="exists"):
        repair_archive(root)  # never over an existing directory
    assert len(cands) == 6


# -- the command line ------------------------------------------------------------------------------
def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def damaged(tmp_path: Path) -> Path:
    root = tmp_path / "arch"
    archive_fixture.build(root)
    log = _log(root, archive_fixture.S_TINY)
    _keep_mtime(log, log.read_bytes()[: log.stat().st_size // 2])
    return root


def test_export_refuses_a_damaged_archive_and_says_why(damaged: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = damaged.parent / "lib"
    code, _, err = _run(capsys, ["export", str(damaged), "--out", str(out), "--verify", "off"])
    assert code == 3 and not out.exists() and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("evo export: warning: ") and _log(damaged, archive_fixture.S_TINY).name in lines[0]
    assert "--allow-damaged" in lines[-1] and "evo archive check" in lines[-1]


def test_report_with_allow_damaged_lists_the_damage_on_the_page(damaged: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = damaged.parent / "rep"
    code, _, err = _run(capsys, ["report", str(damaged), "--out", str(out)])
    assert code == 3 and not out.exists()
    code, _, err = _run(capsys, ["report", str(damaged), "--out", str(out), "--allow-damaged"])
    assert code == 0, err
    page = (out / "index.html").read_text()
    assert "This archive is damaged: 2 problem(s)" in page and archive_fixture.S_TINY.key in page  # torn tail + lost records


def test_archive_check_command(damaged: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, ["archive", "check", str(damaged), "--json"])
    doc = json.loads(out)
    assert code == 3 and doc["ok"] is False and len(doc["damage"]) == 2 and "evo archive: warning:" in err
    code, out, err = _run(capsys, ["archive", "check", str(damaged), "--repair"])
    assert code == 0 and "repaired copy" in out
    code, out, err = _run(capsys, ["archive", "check", str(damaged) + ".repaired"])
    assert code == 0 and "whole" in out and err == ""
    code, out, err = _run(capsys, ["archive", "check", str(damaged), "--out", "x"])
    assert code == 2 and "--repair" in err


def test_seed_counts_what_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["seed", str(tmp_path / "a"), "--shape", "256x256x256", "--arch", "sm_90a", "--per-template", "1"]
    code, out, _ = _run(capsys, argv)
    first = int(out.strip().splitlines()[-1].split()[1])
    assert code == 0 and first > 0
    code, out, _ = _run(capsys, argv)
    assert code == 0 and out.strip().splitlines()[-1].startswith(f"wrote 0 new candidates") and f"{first} of the {first}" in out


def test_no_template_says_the_real_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, ["seed", "--dry-run", "--shape", "64x64x64:f16", "--arch", "sm_90a"])
    assert code == 2 and "contract f16 (it has f32)" in err and err.count("\n") == 1


def test_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    root = tmp_path / "a"
    archive_fixture.build(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    big = "; ".join(["{}"] * 1)
    proc = subprocess.run(f"{sys.executable} -m evo inspect {root} --json --top 50 | head -c 1 > /dev/null; "
                          "echo ${PIPESTATUS[0]} >&2", shell=True, executable="/bin/bash", env=env,
                          capture_output=True, text=True, timeout=120)
    assert big and proc.stderr.strip().splitlines()[-1] in ("0", "141"), proc.stderr
    assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr


def test_propose_takes_the_optuna_alias_and_shows_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "a"
    archive_fixture.build(root)
    code, out, err = _run(capsys, ["propose", str(root), "--shape", str(archive_fixture.S_MMA), "--operator", "optuna",
                                   "-n", "1", "--top", "1"])
    assert code == 0 and "parent 1/1" in err and "asking optuna for 1 proposal(s)" in err and " -> " in out
    # "knob" is both a registered operator (knob mutation) and evo run's group alias: the operator wins
    code, out, err = _run(capsys, ["propose", str(root), "--shape", str(archive_fixture.S_MMA), "--operator", "knob",
                                   "-n", "1", "--top", "1"])
    assert code == 0 and "asking knob for 1 proposal(s)" in err


def test_propose_refuses_a_group_alias_that_is_no_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    import evo.cli._orchestrate as orch
    from evo.cli._cmd_propose import operator_name

    monkeypatch.setitem(orch.ALIASES, "both_knobs", {"knob_mutation": 0.5, "knob_crossover": 0.5})
    with pytest.raises(KeyError, match="names a group"):
        operator_name("both_knobs")
    assert operator_name("optuna") == "tpe" and operator_name("knob") == "knob"


def test_eval_without_a_gpu_compiles_and_resolves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from evaluators.compile._toolkit import nvrtc_available

    if not nvrtc_available():
        pytest.skip("needs NVRTC")
    k = tmp_path / "k.cu"
    k.write_text('/* evo-plan: {"launches": [{"kernel": "k", "grid": ["cdiv(N, 16)", "cdiv(M, 16)", 1], '
                 '"block": [16, 16, 1], "args": ["A", "B", "C", "M", "N", "K"]}]} */\n#include <cuda_fp16.h>\n'
                 'extern "C" __global__ void k(const __half* A, const __half* B, float* C, int M, int N, int K) {\n'
                 '  int r = blockIdx.y * 16 + threadIdx.y, c = blockIdx.x * 16 + threadIdx.x;\n'
                 '  if (r < M && c < N) C[r * N + c] = __half2float(A[r * K]) * __half2float(B[c * K]);\n}\n')
    code, out, err = _run(capsys, ["eval", str(k), "--shape", "64x128x64", "--compile-only", "--json"])
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["kernels"][0]["name"] == "k" and doc["kernels"][0]["registers"] > 0
    assert doc["shapes"][0]["launches"][0]["grid"] == [8, 4, 1]


def test_eval_names_the_file_at_fault(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    k = tmp_path / "k.cu"
    k.write_text('extern "C" __global__ void k() {}\n')
    (tmp_path / "p.json").write_text('{"launches": [')
    (tmp_path / "p.toml").write_text('launches = [')
    for plan, needle in (("p.json", "--plan"), ("p.toml", "--plan")):
        code, _, err = _run(capsys, ["eval", str(k), "--shape", "64x64x64", "--plan", str(tmp_path / plan)])
        assert code == 2 and needle in err and str(tmp_path / plan) in err and "k.cu" not in err, err
    code, _, err = _run(capsys, ["eval", str(k), "--shape", "64x64x64"])
    assert code == 2 and "kernel" in err and "k.cu" in err


def test_report_from_a_test_double_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "a"
    with Archive(root, "w") as a:
        c = _cand(1)
        ev = _ev(c)
        a.record(c, [Evaluation(ev.candidate_id, ev.shape, ev.status, timers=ev.timers, provenance={"pool": "fake"})])
    code, _, err = _run(capsys, ["report", str(root), "--out", str(tmp_path / "r")])
    assert code == 0, err
    assert "come from a test double" in (tmp_path / "r" / "index.html").read_text()
    shutil.rmtree(tmp_path / "r")


def test_inspect_checksums_everything_unless_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "a"
    _build(root, 30)
    data = bytearray(_log(root).read_bytes())
    data[len(data) // 4] ^= 0x40  # under a valid index (size, mtime and tail checksum unchanged)
    _keep_mtime(_log(root), bytes(data))
    code, _, err = _run(capsys, ["inspect", str(root)])
    assert code == 3 and "damaged bytes skipped" in err
    code, _, err = _run(capsys, ["inspect", str(root), "--fast", "--top", "1"])
    assert code == 0 and err == ""  # the documented trade: --fast trusts the index


def test_a_live_writers_tail_is_not_damage(tmp_path: Path) -> None:
    _build(tmp_path)
    with Archive(tmp_path, "w") as w:  # holds the lock: a tail now is a write in progress
        with open(_log(tmp_path), "ab") as fh:
            fh.write(_log(tmp_path).read_bytes()[8:40])  # half a frame, as a reader can catch a write
        assert _problems(tmp_path, verify=True) == []
        w.add(_cand(77))
    with open(_log(tmp_path), "ab") as fh:  # no writer now: the same bytes are a torn tail
        fh.write(b"\xe5voR" + b"\0" * 20)
    assert any("torn tail" in p for p in _problems(tmp_path, verify=True))


@pytest.mark.parametrize("manifest", [b"", b"{not json", b'{"format": "other"}', None])
def test_a_damaged_manifest_beside_logs_is_damage(tmp_path: Path, manifest: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "a"
    _build(root)
    if manifest is None:
        (root / "archive.json").unlink()
    else:
        (root / "archive.json").write_bytes(manifest)
    for argv in (["inspect", str(root)], ["archive", "check", str(root)], ["report", str(root), "--out", str(tmp_path / "r")]):
        code, _, err = _run(capsys, argv)
        assert code == 3 and "damaged archive" in err and err.count("\n") == 1, (argv, err)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "archive.json").write_text("{}")  # no logs: not an archive, bad input
    code, _, err = _run(capsys, ["inspect", str(tmp_path / "plain")])
    assert code == 2 and "does not describe an evo archive" in err


def test_a_writer_refuses_logs_without_their_manifest_as_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "a"
    _build(root)
    (root / "archive.json").unlink()
    code, _, err = _run(capsys, ["seed", str(root), "--shape", "256x256x256", "--arch", "sm_90a"])
    assert code == 3 and "damaged archive" in err and not (root / "archive.json").exists()


def test_eval_loader_choices_come_from_the_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--loader`` is checked against ``evaluators.LOADERS`` (a plug-in's registered loader is a
    choice too), with a one-line error naming the registered ones, before any GPU is looked for."""
    from evaluators import LOADERS

    k = tmp_path / "k.cu"
    k.write_text('/* evo-plan: {"launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [32, 1, 1], '
                 '"args": ["A", "B", "C", "M", "N", "K"]}]} */\nextern "C" __global__ void k() {}\n')
    code, _, err = _run(capsys, ["eval", str(k), "--shape", "64x64x64", "--loader", "nope"])
    assert code != 0 and "--loader 'nope'" in err and all(n in err for n in LOADERS.names()), err
    assert len(err.strip().splitlines()) == 1
