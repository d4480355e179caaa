"""The GPU timers, public: the one implementation of timing kernels with CUDA graphs and events.

``evaluators.run._timers`` holds them; this module is their public face for other packages
(``evo export --verify`` and the benchmarks re-time finished kernels with
:func:`replay_medians`). It imports torch, so ``evaluators/__init__`` does not re-export it:
importing ``evaluators`` stays free of torch and CUDA.
"""
from .run._timers import (REPLAY_TARGET_S, Arm, DeviceTiming, TimerStats, capture, device_timer, host_timer,
                          median_ci, replay_medians, rotation_sets)

__all__ = ["REPLAY_TARGET_S", "Arm", "DeviceTiming", "TimerStats", "capture", "device_timer", "host_timer",
           "median_ci", "replay_medians", "rotation_sets"]
