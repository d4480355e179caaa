"""Running a compiled candidate on a GPU: the worker process and its supervisor, the loaders, the
parameter packing (tensor maps), VA-fenced buffers, the device lease, the timers, the calibration
child and the harness that runs the phases of a job.

Only the torch-free names are re-exported here; ``_harness.py`` and ``_timers.py`` import torch and
are loaded inside the worker process (``_worker.HARNESS_TARGET``), never by importing this package.
"""
from ._lease import GpuLease, gpu_key
from ._loader import LOADERS, CudaError, LoaderUnavailable, get_loader
from ._tmap import ParamPack, TensorMapError, tmap_geometry
from ._worker import DEFAULT_DEADLINES, HARNESS_TARGET, WorkerSupervisor, WorkerUnavailable

__all__ = ["GpuLease", "gpu_key", "CudaError", "LOADERS", "LoaderUnavailable", "get_loader",
           "ParamPack", "TensorMapError", "tmap_geometry",
           "DEFAULT_DEADLINES", "HARNESS_TARGET", "WorkerSupervisor", "WorkerUnavailable"]
