"""Launch plans: validation without a shape, resolution with one, limits, round trip."""
from __future__ import annotations

import pytest

from populations import Launch, LaunchPlan, PlanError, Shape, TensorMapSpec


def plan(**kw) -> LaunchPlan:
    launch = dict(kernel="evo_gemm", grid=("cdiv(N, 128)", "cdiv(M, 128)", 1), block=(256, 1, 1),
                  args=("A", "B", "C", "M", "N", "K", "lda"), smem="2 * 128 * 64 * 2")
    launch.update(kw.pop("launch", {}))
    return LaunchPlan(launches=(Launch(**launch),), **kw)


def test_resolves_for_a_ragged_shape() -> None:
    launches, ws = plan(workspace="M * N * 4").resolve(Shape.parse("129x257x65:NN"))
    (only,) = launches
    assert only.grid == (3, 2, 1) and only.smem == 32768 and ws == 129 * 257 * 4
    assert only.args == ("A", "B", "C", 129, 257, 65, 65)


def test_leading_dimensions_follow_the_layout() -> None:
    p = plan(launch=dict(args=("lda", "ldb", "ldc")))
    assert p.resolve(Shape.parse("10x20x30:TN"))[0][0].args == (30, 30, 20)
    assert p.resolve(Shape.parse("10x20x30:NN"))[0][0].args == (30, 20, 20)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(launch=dict(kernel="not a name")), "identifier"),
        (dict(launch=dict(block=(2048, 1, 1))), "threads"),
        (dict(launch=dict(block=(0, 1, 1))), "positive"),
        (dict(launch=dict(args=("A", "Q"))), "unknown name"),
        (dict(launch=dict(args=("tmap:nope",))), "tensor map"),
        (dict(launch=dict(grid=("os.system", 1, 1))), "not allowed"),
        (dict(workspace=1.5), "integer"),
    ],
)
def test_static_errors(kw, match) -> None:
    with pytest.raises(PlanError, match=match):
        plan(**kw)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(launch=dict(grid=("M * N * K", 1, 1))), "grid"),
        (dict(launch=dict(grid=(1, 70000, 1))), "grid"),
        (dict(launch=dict(smem=300 * 1024)), "shared memory"),
        (dict(workspace="1 << 40"), "workspace"),
        (dict(launch=dict(args=("M * N * 4096",))), "int32"),
        (dict(launch=dict(grid=("300 - N", 1, 1))), "grid"),
    ],
)
def test_shape_dependent_limits(kw, match) -> None:
    with pytest.raises(PlanError, match=match):
        plan(**kw).resolve(Shape.parse("4096x4096x4096"))


def test_no_launch_and_too_many_launches() -> None:
    with pytest.raises(PlanError):
        LaunchPlan(launches=())
    one = plan().launches[0]
    with pytest.raises(PlanError, match="at most"):
        LaunchPlan(launches=(one,) * 9)


def test_tensor_maps_and_round_trip() -> None:
    p = plan(launch=dict(args=("tmap:tmA", "C", "M")), tensor_maps={"tmA": TensorMapSpec("A", (128, 64), 128)})
    (only,), _ = p.resolve(Shape.parse("256x256x256"))
    assert only.args[0] == ("tmap", "tmA")
    assert LaunchPlan.from_dict(p.to_dict()) == p
    with pytest.raises(PlanError):
        TensorMapSpec("D", (128, 64))
    with pytest.raises(PlanError):
        TensorMapSpec("A", (512, 64))
    with pytest.raises(PlanError):
        TensorMapSpec("A", (128, 64), swizzle=16)


def test_malformed_dict() -> None:
    with pytest.raises(PlanError, match="malformed"):
        LaunchPlan.from_dict({"launches": [{"grid": [1]}]})
