"""evo inside torch models: native operators and ``nn.Linear`` patching.

- ``load_ops()`` builds (once, cached) and loads ``torch.ops.evo_native.mm(a, b)`` and
  ``torch.ops.evo_native.linear(x, w, bias)``: C++ operators registered with ``TORCH_LIBRARY``
  that run an exported kernel on torch's current stream for the exact shapes an export covers
  and cuBLAS (at::matmul / at::linear) for everything else; they have Meta kernels (torch.compile)
  and are safe inside CUDA graphs.
- ``register(library)`` fills their dispatch table from ``evo.load_library(LIB)``;
  ``call_counts()`` says how many CUDA calls took an exported kernel and how many fell back.
- ``patch(model, library)`` / ``unpatch(model)`` / ``patched(model, library)`` replace the
  forward of the ``nn.Linear`` modules the library covers (see :mod:`evo.torch._patch`).
"""
from ._ops import OpsBuildError, call_counts, load_ops, register, registered, reset_counts
from ._patch import PatchReport, patch, patched, unpatch

__all__ = ["OpsBuildError", "call_counts", "load_ops", "register", "registered", "reset_counts", "PatchReport", "patch",
           "patched", "unpatch"]
