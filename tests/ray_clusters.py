"""Real Ray clusters for the tests (never a mock): one raylet with *logical* GPUs
(``ray.init(num_gpus=N)``), or several raylets on this host (``ray.cluster_utils.Cluster``),
each its own "node" with its own GPUs, that a test can kill and bring back.

Workers import this checkout and ``tests/`` (where the GPU handler test doubles live).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
#: GCS notices a killed raylet within ~2 s instead of Ray's default ~30 s
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                      "health_check_timeout_ms": 500, "health_check_initial_delay_ms": 0}


def runtime_env() -> dict[str, Any]:
    return {"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}}


@contextmanager
def one_node(ray: Any, num_gpus: int = 2, num_cpus: int = 2) -> Iterator[Any]:
    """A fresh single-node cluster with ``num_gpus`` logical GPUs; shut down on exit."""
    if ray.is_initialized():
        ray.shutdown()
    # address="local": always a new cluster (without it ray.init joins a live one another run left)
    ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False,
             runtime_env=runtime_env())
    try:
        yield ray
    finally:
        ray.shutdown()


@contextmanager
def gpu_nodes(ray: Any, nodes: int = 2, num_cpus: int = 2) -> Iterator[Any]:
    """A head raylet with the CPUs and no GPU, plus ``nodes`` raylets of one logical GPU each;
    yields the ``Cluster`` (``add_node(num_gpus=1, num_cpus=0)`` / ``remove_node``)."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": num_cpus, "num_gpus": 0, "include_dashboard": False, "object_store_memory": 200 << 20,
        "_system_config": FAST_HEALTH_CHECKS})
    for _ in range(nodes):
        add_gpu_node(cluster)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, runtime_env=runtime_env())
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def add_gpu_node(cluster: Any) -> Any:
    """One more raylet with one logical GPU and no CPU (compiles stay on the head)."""
    return cluster.add_node(num_cpus=0, num_gpus=1, object_store_memory=100 << 20)


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something true (returned), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
