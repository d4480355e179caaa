"""Provenance on CPU: the code version names the measuring code by content, not only by git."""
from __future__ import annotations

import re

from evaluators._provenance import code_version, source_digest


def test_source_digest_follows_the_code_and_nothing_else(tmp_path):
    (tmp_path / "evaluators" / "__pycache__").mkdir(parents=True)
    (tmp_path / "populations").mkdir()
    (tmp_path / "evaluators" / "_a.py").write_text("x = 1\n")
    (tmp_path / "populations" / "_b.py").write_text("y = 2\n")
    first = source_digest(root=str(tmp_path))
    assert re.fullmatch(r"[0-9a-f]{12}", first)
    (tmp_path / "evaluators" / "__pycache__" / "_a.cpython-311.pyc").write_bytes(b"\0\1")
    (tmp_path / "evaluators" / "notes.txt").write_text("not code")
    assert source_digest(root=str(tmp_path)) == first  # caches and non-Python files do not count
    (tmp_path / "evaluators" / "_a.py").write_text("x = 2\n")
    assert source_digest(root=str(tmp_path)) != first
    (tmp_path / "evaluators" / "_a.py").write_text("x = 1\n")
    (tmp_path / "populations" / "_b.py").rename(tmp_path / "populations" / "_c.py")
    assert source_digest(root=str(tmp_path)) != first  # a renamed file is other code


def test_code_version_carries_the_digest_of_this_checkout():
    version = code_version()
    assert version.endswith(f" src {source_digest()}") and len(version) > len(" src ") + 12
