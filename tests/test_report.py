"""``evo report``: the static HTML page from the fixture archive, its files, and a headless render."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from archive_fixture import S_FAIL, S_MMA, SHAPES, build
from evo.cli import main
from populations import Candidate, Shape

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Page(HTMLParser):
    """Collects tag names, every src/href, and the text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.links += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Page, dict[Shape, Candidate]]:
    root = tmp_path_factory.mktemp("report")
    best = build(root / "arch")
    assert main(["report", str(root / "arch"), "--out", str(root / "rep")]) == 0
    page = Page()
    page.feed((root / "rep" / "index.html").read_text(encoding="utf-8"))
    page.close()
    return root / "rep", page, best


def test_page_lists_every_shape_with_its_best(report: tuple[Path, Page, dict[Shape, Candidate]]) -> None:
    out, page, best = report
    text = " ".join(page.text)
    for shape in SHAPES:
        assert str(shape) in text
    for cand in best.values():
        assert cand.id in text  # each best kernel heads its lineage
    assert "1.080×" in text and "1.500" not in text  # S_MMA's best is the child: the flagged 1.5x never counts
    parent = best[S_MMA].parents[0]
    assert parent in text  # the lineage shows the child's seed parent
    assert f"No ok, unflagged kernel yet at 1 shape(s): {S_FAIL}" in text
    for head in ("device", "offline", "server", "template", "knobs", "BM=64"):
        assert head in text
    assert page.tags.count("table") == 2 and "style" in page.tags


def test_page_references_only_local_files(report: tuple[Path, Page, dict[Shape, Candidate]]) -> None:
    out, page, _ = report
    assert page.links, "the page should show the plots"
    for link in page.links:
        assert "://" not in link and not link.startswith("//"), link
        if not link.startswith("#"):
            assert (out / link).is_file() and (out / link).stat().st_size > 1000, link
    assert {"speedup_vs_flops.png", "speedup_per_decade.png"} <= set(page.links)
    assert "http" not in (out / "index.html").read_text()


def test_rerun_replaces_and_bad_input_writes_nothing(report: tuple[Path, Page, dict[Shape, Candidate]], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out, _, _ = report
    arch = out.parent / "arch"
    assert main(["report", str(arch), "--out", str(out)]) == 0  # an earlier report is replaced
    capsys.readouterr()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    for argv in (["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r")],
                 ["report", str(arch), "--out", str(tmp_path / "mine")]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["mine"] and os.listdir(tmp_path / "mine") == ["notes.txt"]


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian package chromium)")
def test_renders_in_headless_chromium(report: tuple[Path, Page, dict[Shape, Candidate]], tmp_path: Path) -> None:
    out, _, _ = report
    shot = tmp_path / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1200,1600",
                        (out / "index.html").as_uri()], capture_output=True, timeout=60)
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # a blank page is a few KB; ours has tables and two plots


def test_empty_archive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`evo report` of an archive without evaluations is an error saying what would work (nothing
    written); the library function still renders such an archive as a page, not a crash."""
    from evo.cli._report import build_report
    from populations import Archive

    Archive(tmp_path / "arch", "w").close()
    assert main(["report", str(tmp_path / "arch"), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert "nothing to report" in err and "evo run" in err and err.count("\n") == 1
    assert not (tmp_path / "rep").exists()
    build_report(tmp_path / "arch", tmp_path / "rep")
    page = Page()
    page.feed((tmp_path / "rep" / "index.html").read_text(encoding="utf-8"))
    assert "No shape has an ok kernel yet." in " ".join(page.text)
