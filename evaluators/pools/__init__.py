"""Evaluator pools: the abstract ``EvaluatorPool``, the shared ``PoolCore``, ``LocalPool`` (threads
over local GPU workers) and ``RayPool`` (Ray tasks and GPU actors) with its shape sharding.

Ray itself is imported only when a RayPool is made.
"""
from ._base import POOLS, EvaluatorPool
from ._pool import PRECISE_JOB, LocalPool, PoolStats, gpu_arch, visible_gpus
from ._ray_pool import RayPool, RayPoolStats, RayUnavailable, connect_ray

__all__ = ["POOLS", "EvaluatorPool", "PRECISE_JOB", "LocalPool", "PoolStats", "gpu_arch", "visible_gpus",
           "RayPool", "RayPoolStats", "RayUnavailable", "connect_ray"]
