"""The CLI pass over damaged archives, bad input and conventions (docs/cli.md): one test per item."""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import archive_fixture
from fake_pool import FakeEvaluatorPool
from evo.cli import build_parser, main
from populations import Archive, Candidate, Evaluation, Launch, LaunchPlan, Shape, Status, TimerResult
from populations._log import FRAME_MAGIC, KIND_EVALUATION

ROOT = Path(__file__).resolve().parents[1]
S1, S2 = Shape(128, 256, 64), Shape(64, 64, 64)
PLAN = LaunchPlan(launches=(Launch("k", ("cdiv(N, 128)", "cdiv(M, 128)", 1), (256, 1, 1), ("A", "B", "C", "M", "N", "K")),))


def cand(i: int, shape: Shape = S1, **kw: object) -> Candidate:
    return Candidate(source=f"extern \"C\" __global__ void k() {{ /* {i} */ }}", plan=PLAN, shapes=(shape,),
                     template="sm80_mma", knobs={"BM": 64 * (i % 4 + 1)}, **kw)  # type: ignore[arg-type]


def ok(c: Candidate, speedup: float) -> Evaluation:
    t = 1e-3 / speedup
    return Evaluation(c.id, c.shapes[0], Status.OK, timers={"device": TimerResult(t, t, t, 1e-3, 1e-3, 1e-3, 20)})


def small(root: Path, n: int = 4) -> Path:
    """Two shapes, n candidates each, one ok evaluation per candidate."""
    with Archive(root, "w") as a:
        for shape in (S1, S2):
            for i in range(n):
                c = cand(i, shape)
                a.record(c, [ok(c, 1.0 + i / 10)], durable=True)
    return root


def evo(capsys: pytest.CaptureFixture[str], *argv: object, real_pool: bool = False) -> tuple[int, str, str]:
    """The command line in this process; ``evo run`` gets the stand-in pool through the library
    (``main(argv, pool_factory=...)``) unless ``real_pool``."""
    library = {"pool_factory": FakeEvaluatorPool} if argv[:1] == ("run",) and not real_pool else {}
    try:
        code = main([str(a) for a in argv], **library)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def log_of(root: Path, shape: Shape = S1) -> Path:
    return root / f"{shape.key}.evolog"


# -- damaged archives -------------------------------------------------------------------------------
def test_torn_tail_is_reported_kept_and_fails_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = small(tmp_path / "a")
    log = log_of(root)
    whole = log.read_bytes()
    torn = whole + whole[-300:-100]  # half a frame appended: a killed writer
    log.write_bytes(torn)
    code, out, err = evo(capsys, "inspect", root, "--json")
    assert code == 3 and json.loads(out)["shapes"][0]["candidates"] == 4
    assert f"{log}: torn tail: 200 bytes at offset {len(whole)}" in err
    assert evo(capsys, "inspect", root, "--allow-damaged")[0] == 0
    # the next writer cuts the tail, after keeping it, and says so
    code, _, err = evo(capsys, "seed", root, "--shape", S2, "--per-template", "1", "--arch", "sm_80")
    side = Path(f"{log}.{len(whole)}.torn")
    assert code == 0 and f"evo seed: warning: {log}: torn tail: 200 bytes lost at offset {len(whole)}" in err
    assert side.name in err
    assert side.read_bytes() == torn[len(whole):] and log.read_bytes() == whole
    assert evo(capsys, "inspect", root)[0] == 0  # repaired: the side file is no part of the archive


def _corrupt_record(log: Path) -> None:
    """Append one evaluation frame whose checksum is right but whose payload is not a record; its
    summary key ranks it first, so inspect's top elite row needs it decoded."""
    key, payload = f"{cand(3, S1).id}\tok\t0\t9.0".encode(), b"\xc1not msgpack"
    rest = struct.pack("<IBBH", len(payload), KIND_EVALUATION, len(key), 0) + key
    with open(log, "ab") as fh:
        fh.write(FRAME_MAGIC + struct.pack("<I", zlib.crc32(payload, zlib.crc32(rest))) + rest + payload)


@pytest.mark.parametrize("damage", ["empty", "stray", "newer", "bad_record"])
def test_damage_is_isolated_per_shape_and_record(damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = small(tmp_path / "a")
    log = log_of(root)
    if damage == "empty":
        log.write_bytes(b"")
    elif damage == "stray":
        log.write_bytes(b"this is not a log at all\n")
    elif damage == "newer":
        log.write_bytes(b"EVOLOG" + struct.pack("<H", 99))
    else:
        _corrupt_record(log)
    code, out, err = evo(capsys, "inspect", root, "--json")
    doc = json.loads(out)
    counts = {s["shape"]: s["candidates"] for s in doc["shapes"]}
    assert code == 3 and counts[str(S2)] == 4  # the other shape reads in full
    assert counts[str(S1)] == (4 if damage == "bad_record" else 0) or damage == "bad_record"
    assert str(log) in err and "Traceback" not in err
    # seed and run go on with the healthy shape (and a bad record is skipped, not fatal)
    assert evo(capsys, "seed", root, "--shape", S2, "--per-template", "1", "--arch", "sm_80")[0] == 0
    code, out, err = evo(capsys, "run", root, "--shape", S2, "--max-evals", "2", "--progress", "none")
    assert code == 0, err
    if damage != "bad_record":  # appending to the damaged shape is refused with what to do
        code, _, err = evo(capsys, "seed", root, "--shape", S1, "--per-template", "1", "--arch", "sm_80")
        *warnings, error = err.splitlines()  # the damage, as warnings, then one error line
        assert code == 2 and error.startswith("evo seed: error: ") and "move that file away" in error
        assert all(w.startswith("evo seed: warning: ") for w in warnings)


def test_inspect_summary_decodes_no_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLM-adapter statistics come from the frame keys: only LLM-made candidates' evaluations decode."""
    import populations._shape_log as archive_mod

    with Archive(tmp_path / "a", "w") as a:
        for i in range(30):
            c = cand(i)
            a.record(c, [ok(c, 1 + i / 100)])
        llm = cand(99, model="smollm2", adapter="v1", parents=(cand(0).id,))
        a.record(llm, [ok(llm, 2.0)])
    calls: list[bytes] = []
    real = archive_mod.decode
    monkeypatch.setattr(archive_mod, "decode", lambda data: calls.append(data) or real(data))
    with Archive(tmp_path / "a") as a:
        from evo.cli._cmd_inspect import build_report

        report, _ = build_report(a, None, 1)
    assert report["shapes"][0]["adapters"][0]["adapter"] == "v1"
    assert report["shapes"][0]["adapters"][0]["improved"] == 1
    # top-1 elite (candidate + evaluation) and the LLM candidate's and its parent's evaluations: 4, not 62
    assert len(calls) <= 4


# -- bad input --------------------------------------------------------------------------------------
def test_non_utf8_toml_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.toml").write_bytes(b'shapes = ["64x64x64"]\narchive = "\xff\xfe"\n')
    code, out, err = evo(capsys, "run", "--config", tmp_path / "run.toml")
    assert code == 2 and "run.toml is not UTF-8" in err and err.count("\n") == 1
    assert os.listdir(tmp_path) == ["run.toml"]


@pytest.mark.parametrize("where", ["file", "proc"])
def test_archive_under_a_file_or_proc(where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("x")
    path = tmp_path / "f" / "a" if where == "file" else Path("/proc/evo-test/a")
    for argv in (["seed", path, "--shape", S1, "--arch", "sm_80"], ["run", path, "--shape", S1],
                 ["inspect", path]):
        code, out, err = evo(capsys, *argv)
        assert code == 2 and str(path) in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("command", ["export", "report", "rl export"])
def test_unwritable_out(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "arch"
    archive_fixture.build(root)
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f" / "lib", Path("/proc/evo-test-out")):
        code, _, err = evo(capsys, *command.split(), root, "--out", out)
        assert code == 2 and str(out) in err and err.count("\n") == 1, err
    code, _, err = evo(capsys, "rl", "export", root, "--out", tmp_path)  # a directory: no DIR.tmp left behind
    assert code == 2 and not Path(f"{tmp_path}.tmp").exists() and not list(tmp_path.glob("*.tmp"))


def test_empty_archive_export_and_report_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Archive(tmp_path / "a", "w").close()
    for command in ("export", "report"):
        code, out, err = evo(capsys, command, tmp_path / "a", "--out", tmp_path / command)
        assert code == 2 and "nothing to" in err and "evo run" in err and not (tmp_path / command).exists()


def test_seed_nothing_covered_fails_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = evo(capsys, "seed", tmp_path / "a", "--shape", "64x64x64:f16")
    assert code == 2 and "no template covers 64x64x64:TN:f16" in err and "f32" in err
    assert not (tmp_path / "a").exists()


def test_run_without_gpu_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, out, err = evo(capsys, "run", tmp_path / "a", "--shape", "64x64x64", "--max-evals", "1", real_pool=True)
    assert code == 2 and "no NVIDIA GPU is visible" in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("command", ["run", "seed", "inspect", "export", "report", "propose"])
def test_empty_archive_path_is_an_error(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    extra = {"run": ["--shape", "64x64x64"], "seed": ["--shape", "64x64x64"], "export": ["--out", "o"],
             "report": ["--out", "o"], "propose": ["--shape", "64x64x64"]}.get(command, [])
    code, out, err = evo(capsys, command, "--archive", "", *extra)
    assert code == 2 and "empty" in err and os.listdir(tmp_path) == []


def test_unknown_model_fails_at_once_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small(tmp_path / "a")
    code, out, err = evo(capsys, "propose", tmp_path / "a", "--shape", S1, "--model", "nope")
    assert code == 2 and "unknown model 'nope'" in err and "smollm2-135m" in err and err.count("\n") == 1


# -- one CLI ----------------------------------------------------------------------------------------
def _subparsers() -> dict[str, object]:
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_flags_are_spelled_one_way() -> None:
    subs = _subparsers()
    for name in ("seed", "run", "inspect", "export", "report", "propose"):
        opts = {s for a in subs[name]._actions for s in a.option_strings}  # type: ignore[attr-defined]
        assert "--archive" in opts and any(a.metavar == "ARCHIVE" and not a.option_strings
                                           for a in subs[name]._actions), name  # type: ignore[attr-defined]
    shape_metavars = {a.metavar for s in subs.values() for a in s._actions if "--shape" in a.option_strings}  # type: ignore[attr-defined]
    assert shape_metavars == {"MxNxK[:TN|NN][:f32|f16]"}
    arch = {(a.default, a.metavar) for s in subs.values() for a in s._actions  # type: ignore[attr-defined]
            if "--arch" in a.option_strings}
    assert arch <= {("auto", "SM"), (None, "SM")}  # run: None = the file's value, else auto
    for name in ("seed", "run", "inspect", "export", "eval", "propose"):  # every command that prints a table or result
        assert any("--json" in a.option_strings for a in subs[name]._actions), name  # type: ignore[attr-defined]


def test_gpus_and_arch_grammar() -> None:
    from evo.cli._cmd_args import UsageError, parse_gpus, resolve_arch

    assert parse_gpus(None) is None and parse_gpus("all") is None
    assert parse_gpus("0,1") == [0, 1] and parse_gpus("1") == [1] and parse_gpus("count:2") == 2
    for bad in ("a", "0,0", "count:0", "-1"):
        with pytest.raises(UsageError):
            parse_gpus(bad)
    assert {resolve_arch(a) for a in ("sm_90a", "sm90a", "90a", "90", "9.0", "SM_90")} == {"sm_90a"}
    assert resolve_arch("sm_80") == "sm_80" and resolve_arch("86") == "sm_86"
    with pytest.raises(UsageError):
        resolve_arch("hopper")


def test_version_and_plain_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = evo(capsys, "--version")
    assert code == 0 and re.fullmatch(r"evo \d+\.\d+\.\d+\n", out)
    texts = [build_parser().format_help()]
    for name, p in _subparsers().items():
        texts.append(p.format_help())  # type: ignore[attr-defined]
    texts += [_subparsers()["rl"]._actions[-1].choices[n].format_help() for n in ("export", "train")]  # type: ignore[attr-defined]
    for text in texts:
        assert "`" not in text and not re.search(r"issue\s*#?\d", text), text[:200]


def test_lock_error_names_holder_and_what_to_do(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from populations import Archive; "
                               f"a = Archive({str(tmp_path / 'a')!r}, 'w'); print('ready', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        res = subprocess.run([sys.executable, "-m", "evo", "seed", str(tmp_path / "a"), "--shape", "64x64x64",
                              "--arch", "sm_80"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert f"pid {holder.pid} on " in res.stderr and " since 20" in res.stderr and "wait for it" in res.stderr


def test_readme_says_where_events_are() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "ARCHIVE/events.jsonl" in readme and "writes `events.jsonl` beside the archive" not in readme


def test_inspect_width(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small(tmp_path / "a")
    for width in (60, 150):
        code, out, _ = evo(capsys, "inspect", tmp_path / "a", "--width", width)
        assert code == 0 and max(map(len, out.splitlines())) <= width
    code, wide, _ = evo(capsys, "inspect", tmp_path / "a", "--width", 150)
    assert max(map(len, wide.splitlines())) > 60  # not cut to a fixed 80 or 60


def test_inspect_uses_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from evo.cli._cmd_inspect import table_width

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "173")
    assert table_width(Tty()) == 173 and table_width(io.StringIO()) == 200 and table_width(Tty(), 90) == 90


def test_v1_logs_keep_plain_candidate_keys(tmp_path: Path) -> None:
    """An older evo reads v1 logs, whose candidate keys are the id alone: appending to a v1 log keeps
    it that way; new logs are v2 (keys with a summary), which that older evo refuses as newer."""
    from populations._log import RecordLog

    root = small(tmp_path / "a", 1)
    data = bytearray(log_of(root).read_bytes())
    assert data[6:8] == b"\x02\x00"
    data[6] = 1
    log_of(root).write_bytes(bytes(data))
    with Archive(root, "w") as a:
        c = cand(7)
        a.record(c, [ok(c, 3.0)])
    keys = [e.key for e in RecordLog(str(log_of(root))).entries if e.kind == 1]
    assert keys[-1] == c.id
    with Archive(root) as a:
        assert a.elites(S1, top=1)[0].candidate_id == c.id and c.id in a.candidate_ids(S1)


def test_run_json_is_the_only_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = evo(capsys, "run", tmp_path / "a", "--shape", "64x64x64", "--max-evals", "3",
                         "--progress", "plain", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["format"] == "evo-run/1" and doc["evaluations"] == 3 and doc["reason"] == "evals"
    assert "64x64x64:TN:f32" in doc["best"]
