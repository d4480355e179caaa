"""The command line against damaged archives and bad input, as a new user would meet them (issue 38).

Builds a real archive (tests/archive_fixture.py: six shapes, template candidates, evaluations
with every status), damages one shape log at a time in 13 ways (truncations at the header, in
the first frame, at random offsets and by the last byte; a flipped byte in the magic or the
middle with the mtime kept; format version 99; garbage; zero length; a removed log; a torn tail
appended) and runs every reader on each (inspect, archive check, export, report, rl export, a
seed resume). Then the bad-input cases of tests/test_cli_fuzz.py (choices, TOML, shapes, paths)
and random grammar strings for --gpus, --arch and --tokens. Every case runs in this process
under a 60 s alarm and is classified:

- clean error: non-zero exit, no traceback, the last stderr line ``evo CMD: error: ...`` (or the
  damage named);
- warned success: exit 0 on a damaged archive with the damaged file named on stderr (a resume,
  an rl export: allowed to go on);
- false success: exit 0 on bad input, or on a damaged archive without the file named;
- traceback / hang.

    PYTHONPATH=. python bench/cli_fuzz.py [--seed 0] [--grammar 60] [--json out.json]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import archive_fixture  # noqa: E402
import test_cli_fuzz as tcf  # noqa: E402

from evo.cli import main  # noqa: E402

OUTCOMES = ("clean error", "warned success", "false success", "traceback", "hang")


class Hang(Exception):
    pass


def _alarm(_sig: int, _frame: object) -> None:
    raise Hang()


def call(argv: list[str], timeout_s: int = 60) -> tuple[str, int, str]:
    """('ok'|'traceback'|'hang', exit code, stderr) of one command line in this process."""
    err, out = io.StringIO(), io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout_s)
    kind, code = "ok", 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = int(exc.code or 0)
    except Hang:
        kind, code = "hang", -1
    except Exception:  # noqa: BLE001 - a traceback is what this counts
        kind, code = "traceback", -1
        err.write(traceback.format_exc())
    finally:
        signal.alarm(0)
    return kind, code, err.getvalue()


def classify(kind: str, code: int, err: str, damaged: str = "") -> str:
    if kind != "ok" or "Traceback" in err:
        return "traceback" if kind != "hang" else "hang"
    if code == 0:
        return "warned success" if damaged and damaged in err else "false success"
    lines = err.strip().splitlines()
    return "clean error" if lines and lines[-1].startswith("evo") else "false success"


# -- damage ------------------------------------------------------------------------------------------
def damages(rng: random.Random) -> dict[str, Callable[[Path], None]]:
    def cut(frac: float) -> Callable[[Path], None]:
        return lambda p: _write(p, p.read_bytes()[: max(9, int(p.stat().st_size * frac))])

    def flip(at: Callable[[int], int]) -> Callable[[Path], None]:
        def f(p: Path) -> None:
            data = bytearray(p.read_bytes())
            data[at(len(data))] ^= 0x5A
            _write(p, bytes(data))
        return f

    return {
        "zero": lambda p: _write(p, b""),
        "header_only": lambda p: _write(p, p.read_bytes()[:8]),
        "in_first_frame": lambda p: _write(p, p.read_bytes()[:30]),
        "random_cut_1": cut(rng.random()),
        "random_cut_2": cut(rng.random()),
        "random_cut_3": cut(rng.random()),
        "last_byte": lambda p: _write(p, p.read_bytes()[:-1]),
        "flip_magic": flip(lambda n: 2),
        "flip_middle": flip(lambda n: n // 2),
        "version_99": lambda p: _write(p, p.read_bytes()[:6] + struct.pack("<H", 99) + p.read_bytes()[8:]),
        "garbage": lambda p: _write(p, rng.randbytes(p.stat().st_size)),
        "removed": lambda p: p.unlink(),
        "torn_tail": lambda p: _write(p, p.read_bytes() + p.read_bytes()[100:160]),
    }


def _write(path: Path, data: bytes) -> None:
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime kept: the side index must not hide it


def damage_cases(base: Path, work: Path, rng: random.Random, table: Counter, notes: list[str]) -> None:
    logs = sorted(p.name for p in base.glob("*.evolog"))
    cases = [(name, hurt, log) for name, hurt in damages(rng).items() for log in logs]
    cases += [("manifest garbage", lambda p: _write(p, b"{not json"), "archive.json"),
              ("manifest removed", lambda p: p.unlink(), "archive.json")]
    for name, hurt, log in cases:
        root = work / "a"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, root)
        hurt(root / log)
        shape = log[: -len(".evolog")].replace("_", ":") if log.endswith(".evolog") else "64x64x64"
        for argv in (["inspect", str(root)], ["archive", "check", str(root)],
                     ["export", str(root), "--out", str(work / "lib"), "--verify", "off"],
                     ["report", str(root), "--out", str(work / "rep")],
                     ["rl", "export", str(root), "--out", str(work / "d.jsonl")],
                     ["seed", str(root), "--shape", shape, "--per-template", "1", "--arch", "sm_90a"]):
            kind, code, err = call(argv)
            outcome = classify(kind, code, err, str(root / log) if log.endswith(".evolog") else str(root))
            if argv[0] in ("export", "report") and code == 0:
                outcome = "false success"  # they must refuse a damaged archive
            if argv[0] == "seed" and code == 2 and "no template covers" in err:
                outcome = "clean error"  # the f16 shape: refused before the archive is touched
            table[("damage", outcome)] += 1
            if outcome not in ("clean error", "warned success"):
                notes.append(f"{outcome}: damage {name} on {log}: evo {' '.join(argv[:2])} -> {code}: {err[-300:]!r}")


# -- bad input ---------------------------------------------------------------------------------------
def bad_input_cases(work: Path, rng: random.Random, grammar: int, table: Counter, notes: list[str]) -> None:
    def run_case(label: str, argv: list[str]) -> None:
        kind, code, err = call(argv)
        outcome = classify(kind, code, err)
        table[("bad input", outcome)] += 1
        if outcome != "clean error":
            notes.append(f"{outcome}: {label}: {argv} -> {code}: {err[-300:]!r}")

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    small = tcf._archive(work / "a")
    t = work / "t"
    t.mkdir()
    (t / "bad.toml").write_bytes(b"[x\n\xff")
    (t / "flat.toml").write_text("x = 5\n")
    (t / "deep.toml").write_text("a = " + "[" * 4000 + "]" * 4000 + "\n")
    os.mkfifo(t / "fifo.toml")
    (t / "k.cu").write_text('/* evo-plan: {"launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [32, 1, 1], '
                            '"args": ["A", "B", "C", "M", "N", "K"]}]} */\nextern "C" __global__ void k() {}\n')
    for case, (argv, _needle) in sorted(tcf.CHOICES.items()):
        run_case(case, [a.format(a=small, t=t) for a in argv])
    for case, data in sorted(tcf.TOML.items()):
        (t / "run.toml").write_bytes(data)
        run_case(f"toml {case}", ["run", "--config", str(t / "run.toml"), "--max-evals", "1"])
    for shape in tcf.SHAPES:
        for command, argv in {"seed": ["seed", str(small)], "inspect": ["inspect", str(small)],
                              "eval": ["eval", str(t / "k.cu")],
                              "propose": ["propose", str(small), "--operator", "knob_mutation"],
                              "shapes": ["shapes", "LlamaConfig", "--tokens", "x" + shape]}.items():
            run_case(f"shape {shape!r}", argv + ([f"--shape={shape}"] if command != "shapes" else []))
    (work / "file").write_text("x")
    (work / "plain").mkdir()
    (work / "plain" / "mine.txt").write_text("keep")  # not an archive and not empty: no command may take it
    for path, make in sorted(tcf.BAD_PATHS.items()):
        for command, rest in (("inspect", []), ("export", ["--out", str(work / "o")]),
                              ("report", ["--out", str(work / "o")]), ("archive check", []),
                              ("seed", ["--shape", "64x64x64", "--arch", "sm_80"]), ("rl export", ["--out", str(work / "o.jsonl")])):
            run_case(f"path {path}", [*command.split(), make(work), *rest])
    chars = "0123456789,:-_ .aAlLsmcount\t"
    for _ in range(grammar):
        g = "".join(rng.choice(chars) for _ in range(rng.randint(0, 8)))
        kind, code, err = call(["run", str(work / "r"), "--shape", "64x64x64", f"--gpus={g}", "--max-evals", "1",
                                "--arch", "sm_90a"])
        valid_gpus = "no GPU" in err or code == 0  # a valid list reaches the pool: here, the one-line "no GPU" error
        outcome = classify(kind, code, err)
        table[("grammar ok", "accepted") if valid_gpus and outcome == "clean error" else ("bad input", outcome)] += 1
        a = "".join(rng.choice("sm_0123456789a. ") for _ in range(rng.randint(0, 7)))
        run_case(f"arch {a!r}", ["seed", "--dry-run", "--shape", "64x64x64", f"--arch={a}"]) if a.strip() not in (
            "80", "86", "89", "90", "90a", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm80", "sm86", "sm89", "sm90",
            "sm90a", "8.0", "8.6", "8.9", "9.0") or a != a.strip() else None
        tok = "".join(rng.choice("0123456789,- ") for _ in range(rng.randint(0, 10)))
        kind, code, err = call(["shapes", "LlamaConfig", f"--tokens={tok}"])
        valid = all(x.strip().isdigit() and 0 < int(x) <= 1 << 20 for x in tok.split(",")) if tok else False
        outcome = classify(kind, code, err)
        if valid:
            table[("grammar ok", "accepted" if code == 0 else outcome)] += 1
        else:
            table[("bad input", outcome)] += 1
        if not valid and outcome != "clean error":
            notes.append(f"{outcome}: tokens {tok!r} -> {code}: {err[-200:]!r}")


def main_(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grammar", type=int, default=60, help="random strings per grammar (--gpus, --arch, --tokens)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    table: Counter = Counter()
    notes: list[str] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="evo-cli-fuzz-") as tmp:
        base = Path(tmp) / "base"
        archive_fixture.build(base)
        damage_cases(base, Path(tmp) / "w", rng, table, notes)
        bad_input_cases(Path(tmp) / "b", rng, args.grammar, table, notes)
    print("| outcome | damaged archive | bad input |\n|---|---|---|")
    for o in OUTCOMES:
        print(f"| {o} | {table[('damage', o)]} | {table[('bad input', o)]} |")
    print(f"valid grammar samples (random strings that were valid): {table[('grammar ok', 'accepted')]} accepted, "
          f"{sum(v for (c, o), v in table.items() if c == 'grammar ok' and o != 'accepted')} refused")
    print(f"total {sum(table.values())} cases in {time.monotonic() - t0:.0f} s (seed {args.seed})")
    for n in notes:
        print(" ", n[:400])
    if args.json:
        Path(args.json).write_text(json.dumps({"table": {f"{k[0]}|{k[1]}": v for k, v in table.items()}, "notes": notes}))
    return 0


if __name__ == "__main__":
    sys.exit(main_())
