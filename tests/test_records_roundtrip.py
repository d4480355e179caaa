"""Shapes parse strictly; every record survives encode/decode unchanged; bad bytes fail cleanly.

The round trips are property tests (hypothesis) over the whole space of records the codec
promises to carry, because the archive stores nothing but these bytes.
"""
from __future__ import annotations

import json
import string

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from populations import (SCHEMA_VERSION, Candidate, CodecError, Evaluation, KernelStats, Launch, LaunchPlan,
                         Shape, ShapeError, Status, TensorMapSpec, TimerResult, decode, encode, from_plain, to_plain)
from populations._shape import CONTRACTS, LAYOUTS, MAX_DIM

# -- the shape parser ------------------------------------------------------------------------
GOOD = {
    "4096x4096x4096": Shape(4096, 4096, 4096),
    "64x128x64:NN": Shape(64, 128, 64, "NN"),
    "64x128x64:nn:f16": Shape(64, 128, 64, "NN", "f16"),
    "64x128x64:f16:TN": Shape(64, 128, 64, "TN", "f16"),
    " 1 x 2 x 3 ": Shape(1, 2, 3),
    "1X2X3": Shape(1, 2, 3),
    f"{MAX_DIM}x1x1": Shape(MAX_DIM, 1, 1),
}
BAD = {
    "zero M": "0x128x128",
    "zero K": "128x128x0",
    "negative": "-64x128x128",
    "negative N": "64x-1x128",
    "fraction": "64.5x128x128",
    "exponent": "1e3x128x128",
    "hex": "0x40x128x128",
    "word": "axbxc",
    "two dims": "4096x4096",
    "four dims": "1x2x3x4",
    "empty": "",
    "blank": "   ",
    "absurd dim": f"{MAX_DIM + 1}x1x1",
    "absurd operand": "1048576x1048576x1048576",
    "huge integer": "1" * 40 + "x1x1",
    "unknown suffix": "64x64x64:XX",
    "empty suffix value": "64x64x64:",
    "bad contract": "64x64x64:TN:f64",
    "separator": "64*64*64",
    "two layouts": "64x64x64:NN:TN",
    "two contracts": "64x64x64:f16:f32",
    "full-width digits": "\uff16\uff14x64x64",
}


@pytest.mark.parametrize("text,shape", sorted(GOOD.items()))
def test_good_shapes_parse(text: str, shape: Shape) -> None:
    assert Shape.parse(text) == shape
    assert Shape.parse(str(shape)) == shape


@pytest.mark.parametrize("why", sorted(BAD))
def test_bad_shape_strings_are_refused(why: str) -> None:
    with pytest.raises(ShapeError) as info:
        Shape.parse(BAD[why])
    assert str(info.value) and "\n" not in str(info.value)  # one clear line


@pytest.mark.parametrize("dims", [(0, 1, 1), (1, -1, 1), (1, 1, True), (1.0, 1, 1), ("64", 1, 1), (MAX_DIM + 1, 1, 1)])
def test_bad_shape_values_are_refused(dims: tuple) -> None:
    with pytest.raises(ShapeError):
        Shape(*dims)


@pytest.mark.parametrize("layout,contract", [("TT", "f32"), ("TN", "bf16"), ("tn", "f32")])
def test_bad_layouts_and_contracts(layout: str, contract: str) -> None:
    with pytest.raises(ShapeError):
        Shape(64, 64, 64, layout, contract)


def test_non_string_shape() -> None:
    with pytest.raises(ShapeError):
        Shape.parse(4096)  # type: ignore[arg-type]


# -- strategies ---------------------------------------------------------------------------------
shapes = st.builds(Shape, st.integers(1, 8192), st.integers(1, 8192), st.integers(1, 8192),
                   st.sampled_from(LAYOUTS), st.sampled_from(CONTRACTS))
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)  # no lone surrogates: not UTF-8
exprs = st.one_of(st.integers(0, 1 << 20), st.sampled_from(
    ["cdiv(N, 128)", "cdiv(M, 64) * 2", "min(M, N)", "max(K, 1) // 2", "round_up(N, 64)", "M * N * 4", "K % 64 + 1"]))
idents = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
blocks = st.sampled_from([(32, 1, 1), (128, 1, 1), (256, 1, 1), (384, 1, 1), (1024, 1, 1), (32, 4, 2)])
tmaps = st.dictionaries(idents, st.builds(TensorMapSpec, st.sampled_from("ABC"),
                                          st.tuples(st.integers(1, 256), st.integers(1, 256)),
                                          st.sampled_from([0, 32, 64, 128])), max_size=3)


@st.composite
def plans(draw: st.DrawFn) -> LaunchPlan:
    maps = draw(tmaps)
    arg = st.sampled_from(["A", "B", "C", "workspace", "M", "N", "K", "lda", "ldb", "ldc", "M * 2"]
                          + [f"tmap:{name}" for name in maps])
    launches = draw(st.lists(st.builds(Launch, idents, st.tuples(exprs, exprs, exprs), blocks,
                                       st.lists(arg, max_size=12).map(tuple), exprs), min_size=1, max_size=4))
    return LaunchPlan(tuple(launches), workspace=draw(exprs), zero_workspace=draw(st.booleans()), tensor_maps=maps)


plain_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                            | st.floats(allow_nan=False) | texts,
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
                            max_leaves=12)
knob_values = st.one_of(st.integers(-(2**31), 2**31), st.booleans(), texts)
finite = st.floats(allow_nan=False, allow_infinity=False)
hex_ids = st.text("0123456789abcdef", min_size=20, max_size=20)


@st.composite
def candidates(draw: st.DrawFn) -> Candidate:
    return Candidate(
        source=draw(texts.filter(str.strip)) + " __global__", plan=draw(plans()),
        shapes=tuple(draw(st.lists(shapes, min_size=1, max_size=3))), generic=draw(st.booleans()),
        template=draw(st.none() | idents), knobs=draw(st.none() | st.dictionaries(idents, knob_values, max_size=6)),
        parents=tuple(draw(st.lists(hex_ids, max_size=3))), operator=draw(idents),
        model=draw(st.none() | texts), adapter=draw(st.none() | texts), prompt=draw(st.none() | texts),
        completion=draw(st.none() | texts), generation=draw(st.integers(0, 10**6)), created=draw(finite),
        meta=draw(st.dictionaries(texts, plain_values, max_size=4)))


timers = st.builds(TimerResult, finite, finite, finite, finite, finite, finite, st.integers(0, 10**6), texts)
kernel_stats = st.builds(KernelStats, idents, *(st.integers(0, 1 << 20) for _ in range(6)))
evaluations = st.builds(
    Evaluation, hex_ids, shapes, st.sampled_from(list(Status)), message=texts,
    timers=st.dictionaries(st.sampled_from(["device", "offline", "graph", "cold"]), timers, max_size=3),
    kernels=st.lists(kernel_stats, max_size=3).map(tuple), flags=st.lists(texts, max_size=3).map(tuple),
    max_error=st.none() | finite, compile_s=finite, correctness_s=finite, timing_s=finite, arch=texts,
    provenance=st.dictionaries(texts, plain_values, max_size=4), created=finite,
    roofline_frac=st.none() | finite)
records = st.one_of(candidates(), evaluations)


# -- round trips --------------------------------------------------------------------------------
@settings(deadline=None)
@given(shapes)
def test_shape_text_and_key_round_trip(shape: Shape) -> None:
    assert Shape.parse(str(shape)) == shape
    assert Shape.parse(shape.key.replace("_", ":")) == shape
    assert set(shape.key) <= set(string.ascii_letters + string.digits + "_")


@settings(max_examples=60, deadline=None)
@given(plans())
def test_plan_round_trip(plan: LaunchPlan) -> None:
    assert LaunchPlan.from_dict(plan.to_dict()) == plan
    assert LaunchPlan.from_dict(msgpack.unpackb(msgpack.packb(plan.to_dict()))) == plan


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_record_round_trip(record: Candidate | Evaluation) -> None:
    data = encode(record)
    back = decode(data)
    assert back == record and type(back) is type(record)
    assert encode(back) == data  # the encoding is canonical: a second trip changes no byte
    json.dumps(to_plain(record))  # the plain form is JSON-able too (evo inspect --json uses it)
    if isinstance(record, Candidate):
        assert back.id == record.id  # the content hash survives (the archive indexes by it)


# -- bad bytes ------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_decode(data: bytes) -> None:
    try:
        decode(data)
    except CodecError:
        pass


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records, st.data())
def test_damaged_fields_raise_codec_error(record: Candidate | Evaluation, data: st.DataObject) -> None:
    """Any field replaced by junk: a record or CodecError, never another exception (this found
    timers given as a list escaping as AttributeError)."""
    plain = to_plain(record)
    field = data.draw(st.sampled_from(sorted(plain)))
    plain[field] = data.draw(plain_values)
    try:
        from_plain(plain)
    except CodecError:
        pass


@pytest.mark.parametrize("kind,field,junk", [
    ("evaluation", "timers", [1]), ("evaluation", "timers", {"device": 5}), ("evaluation", "kernels", [5]),
    ("evaluation", "shape", "0x1x1"), ("evaluation", "status", "great"), ("candidate", "generation", float("inf")),
    ("candidate", "shapes", [None]), ("candidate", "plan", {"launches": []}), ("candidate", "created", "now"),
])
def test_known_junk_fields(kind: str, field: str, junk: object) -> None:
    plan = LaunchPlan((Launch("k", (1, 1, 1), (32, 1, 1), ()),))
    c = Candidate(source="x __global__", plan=plan, shapes=(Shape(1, 1, 1),))
    record = c if kind == "candidate" else Evaluation(c.id, Shape(1, 1, 1), Status.OK)
    with pytest.raises(CodecError):
        from_plain({**to_plain(record), field: junk})


def test_versions_and_kinds() -> None:
    c = Candidate(source="x __global__", plan=LaunchPlan((Launch("k", (1, 1, 1), (32, 1, 1), ()),)), shapes=(Shape(1, 1, 1),))
    plain = to_plain(c)
    assert plain["v"] == SCHEMA_VERSION
    with pytest.raises(CodecError, match="newer"):
        from_plain({**plain, "v": SCHEMA_VERSION + 1})
    with pytest.raises(CodecError, match="version"):
        from_plain({**plain, "v": 0})
    with pytest.raises(CodecError, match="kind"):
        from_plain({**plain, "kind": "elephant"})
    with pytest.raises(CodecError):
        from_plain({**plain, "id": "0" * 20})  # content and id disagree
    with pytest.raises(CodecError):
        decode(b"\xc1")
    with pytest.raises(CodecError):
        decode(msgpack.packb([1, 2, 3]))


def test_roofline_frac_is_optional_and_old_records_still_decode() -> None:
    """Issue 26 added ``roofline_frac``: a record written before it (no such key) decodes with
    None and encodes back to the very same bytes; a recorded one survives; junk is a CodecError."""
    old = {"v": 1, "kind": "evaluation", "candidate_id": "ab" * 10, "shape": "1x4096x4096:TN:f32", "status": "ok",
           "message": "", "timers": {}, "kernels": [], "flags": [], "max_error": None, "compile_s": 0.0,
           "correctness_s": 0.0, "timing_s": 0.0, "arch": "sm_90a", "provenance": {}, "created": 1.0}
    data = msgpack.packb(old, use_bin_type=True)
    ev = decode(data)
    assert isinstance(ev, Evaluation) and ev.roofline_frac is None
    assert encode(ev) == data
    new = decode(encode(Evaluation(ev.candidate_id, ev.shape, Status.OK, roofline_frac=0.61, created=1.0)))
    assert new.roofline_frac == 0.61
    with pytest.raises(CodecError):
        from_plain({**old, "roofline_frac": "fast"})
