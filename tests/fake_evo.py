"""``python -m fake_evo ARGS...`` (with tests/ on PYTHONPATH): the real ``evo`` command line with
the stand-in evaluator pool (fake_pool.FakeEvaluatorPool, configured by ``EVO_FAKE_*``) given to
``evo run`` through the library (``evo.cli.main(argv, pool_factory=...)``), for tests and
benchmark rehearsals that run ``evo run`` as a child process on a machine without a GPU."""
from __future__ import annotations

import sys

from fake_pool import FakeEvaluatorPool

from evo.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(main(argv, pool_factory=FakeEvaluatorPool) if argv[:1] == ["run"] else main(argv))
