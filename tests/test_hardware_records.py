"""Typed records (``simplace.hardware.records``): every kind reads and writes back the
JSON it came from, the committed records files included, and bad input names its field."""

import json
from pathlib import Path

import pytest

from simplace.calibrate.records import load_records, read_records, write_records
from simplace.errors import CalibrationError, SimplaceError
from simplace.hardware.records import (
    CALIBRATION_RECORDS,
    HeaderRecord,
    LinkRecord,
    PhaseRecord,
    RateRecord,
    ValidationRecord,
    calibration_record,
    validation_record,
)
from simplace.hardware.timing import Timing, robust_stats
from tests.test_calibrate import synthetic_records

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = sorted((ROOT / "calibration").glob("*/records.jsonl"))


def test_every_kind_reads_and_writes_back_its_json():
    t = robust_stats([1e-3, 2e-3]).to_dict()
    recs = synthetic_records(segments_per_kind=8, host_steps=2) + [
        {"kind": "op_error", "device": "cpu:0", "signature": "s", "error": "why"},
        {"kind": "segment_error", "model": "m", "error": "why"},
        {"kind": "rate", "device": "cpu:0", "op_class": "matmul", "unit": "flop",
         "rate": 1e9, "saturated": True, "why": "", "points": [{"size": 8}]},
        {"kind": "link_chain", "a": "cpu:0", "b": "cpu:1", "nbytes": 256, "hops": 3,
         "loop": {"a": 2, "b": 2}, "alone_a": t, "alone_b": t, "chain": t,
         "chain_host": t}]
    assert {r["kind"] for r in recs} == set(CALIBRATION_RECORDS)
    for k, d in enumerate(recs):
        rec = calibration_record(d, f"record {k}")
        assert type(rec) is CALIBRATION_RECORDS[d["kind"]] and rec.kind == d["kind"]
        assert json.dumps(rec.to_dict()) == json.dumps(d)


@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_committed_records_load_typed_and_write_back_unchanged(path, tmp_path):
    lines = path.read_text().splitlines()
    recs = load_records(path)
    assert isinstance(recs[0], HeaderRecord) and len(recs) == len(lines)
    for rec, line in zip(recs, lines, strict=True):  # same fields, values and order
        d = json.loads(line)
        assert rec.to_dict() == d and list(rec.to_dict()) == list(d)
    write_records(tmp_path / "r.jsonl", recs)
    assert read_records(tmp_path / "r.jsonl") == read_records(path)


def test_fields_are_typed_and_unknown_fields_kept():
    t = robust_stats([1e-3, 2e-3, 3e-3])
    d = {"kind": "link", "src": "cpu:0", "dst": "cpu:1", "nbytes": 1024,
         "timing": t.to_dict(), "note": "kept"}
    rec = calibration_record(d, "here")
    assert isinstance(rec, LinkRecord) and isinstance(rec.timing, Timing)
    assert rec.timing == t and rec.after_call is None and rec.extra == {"note": "kept"}
    assert rec.to_dict() == d  # the absent optional field stays absent
    with pytest.raises(AttributeError):
        rec.src = "cpu:2"  # frozen
    assert PhaseRecord(phase="links").to_dict() == {"kind": "phase", "phase": "links"}


@pytest.mark.parametrize("d, match", [
    ({"kind": "phase"}, r"here: field 'phase' is missing \(a phase record needs"),
    ({"kind": "nope"}, "'kind' must be one of header, "),
    ([], "a record must be a JSON object"),
    ({"kind": "rate", "device": "cpu:0", "op_class": "matmul", "unit": "flop", "rate": 0,
      "saturated": True, "points": []}, "field 'rate' of a rate record must be > 0"),
    ({"kind": "put_host", "src": "a", "dst": "b", "timing": {"samples_s": []}},
     "here: field 'timing': No timing samples"),
])
def test_bad_records_name_where_and_what(d, match):
    with pytest.raises(CalibrationError, match=match):
        calibration_record(d, "here")


def test_rate_record_of_a_result_is_a_rate_record():
    from simplace.calibrate.rates import rate_record

    res = {"rate": 2e9, "saturated": False, "why": "budget", "points": [{"size": 1}]}
    rec = calibration_record(rate_record("cpu:0", "matmul", res), "here")
    assert isinstance(rec, RateRecord) and rec.why == "budget" and rec.unit == "flop"


def test_validation_record_round_trip_and_checks():
    d = {"schema": "simplace.validation_record", "schema_version": 1, "cost_model": "m",
         "graph_hash": "ab", "graph_name": "g", "device_names": ["cpu:0"], "method": "x",
         "assignment": [0], "predicted_step_time_s": 1.0, "measured_step_time_s": 2.0,
         "model_spec": {"name": "mlp"}}
    rec = validation_record(d, "here")
    assert isinstance(rec, ValidationRecord) and rec.extra == {"model_spec": {"name": "mlp"}}
    assert json.dumps(rec.to_dict()) == json.dumps(d)
    with pytest.raises(SimplaceError, match="measured_step_time_s must be > 0"):
        validation_record(dict(d, measured_step_time_s=0), "here")
    with pytest.raises(SimplaceError, match="not a simplace validation record"):
        validation_record(dict(d, schema="x"), "here")
