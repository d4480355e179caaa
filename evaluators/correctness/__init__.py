"""The correctness cascade a candidate's output goes through inside the GPU worker: operands and
references, the guarded (canary-fenced) outputs, the checks and the after-timing recheck.

Its modules import torch, so this package re-exports nothing: the harness (``run/_harness.py``),
inside the worker process, imports them directly, and importing ``evaluators`` never loads torch.
"""
