"""evo's command-line wing: ``evo <command>`` (``main``), a thin layer over the library.

Each ``_cmd_*.py`` parses one command's arguments and calls the wings below it (``evo.search``
for ``run``/``seed``/``propose``, ``evo.export`` for ``export``, ``evo.rl`` for ``rl``, the
runtime for loading); ``_orchestrate.py`` is the composition root that builds an engine, its
pool, operators and RL updater from a run's configuration. Nothing below this wing imports it.
"""
from ._main import build_parser, main, version

__all__ = ["build_parser", "main", "version"]
