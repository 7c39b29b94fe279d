"""Records files (simplace._jsonl) and JSON field checks (simplace._jsonfile.check_fields):
one torn-write policy for calibration and validation records."""

import json

import pytest

from simplace import _jsonl
from simplace._jsonfile import check_fields, check_schema
from simplace.calibrate.records import RecordWriter
from simplace.calibrate.records import read_records as read_calibration
from simplace.errors import CalibrationError, SimplaceError
from simplace.validate.records import append_records
from simplace.validate.records import read_records as read_validation


def _lines(path):
    return path.read_bytes().split(b"\n")


# ----------------------------------------------------------------------------- reading
def test_a_torn_last_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3, "b"')  # no final newline: torn
    with pytest.warns(UserWarning, match=rf"{path}, line 4: skipped a truncated last record"):
        assert _jsonl.read(path, SimplaceError, missing="none") == [(1, {"a": 1}),
                                                                    (3, {"a": 2})]


def test_a_whole_last_line_without_its_newline_is_read(tmp_path, recwarn):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    assert _jsonl.read(path, SimplaceError, missing="none") == [(1, {"a": 1}), (2, {"a": 2})]
    assert not recwarn.list


def test_a_last_line_cut_inside_a_character_is_torn_too(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n' + '{"name": "\u00e9t\u00e9"}'.encode()[:12])
    with pytest.warns(UserWarning, match="line 2: skipped a truncated"):
        assert _jsonl.read(path, SimplaceError, missing="none") == [(1, {"a": 1})]


@pytest.mark.parametrize("bad", ['{"a": ', "\x00\x01", "not json"])
def test_a_bad_line_before_the_last_is_an_error_saying_how_to_mend_it(tmp_path, bad):
    path = tmp_path / "r.jsonl"
    path.write_text(f'{{"a": 1}}\n{bad}\n{{"a": 2}}\n')
    with pytest.raises(CalibrationError, match=r"line 2 is not valid JSON .*delete or repair "
                                               r"this line; measure again") as err:
        _jsonl.read(path, CalibrationError, missing="none", mend="measure again")
    assert str(path) in str(err.value)
    # the same line last, newline and all, is no torn write either
    path.write_text(f'{{"a": 1}}\n{bad}\n')
    with pytest.raises(CalibrationError, match="line 2 is not valid JSON"):
        _jsonl.read(path, CalibrationError, missing="none")


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(SimplaceError, match="^run it first$"):
        _jsonl.read(tmp_path / "nope.jsonl", SimplaceError, missing="run it first")
    with pytest.raises(SimplaceError, match="is a directory"):
        _jsonl.read(tmp_path, SimplaceError, missing="none")


# ----------------------------------------------------------------------------- appending
def test_appending_drops_a_torn_last_line_first(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 2, "b')
    with pytest.warns(UserWarning, match=rf"{path}: dropped a truncated last record"):
        _jsonl.append(path, [{"a": 3}])
    assert path.read_text() == '{"a": 1}\n{"a":3}\n'


def test_appending_ends_a_whole_last_line_first(tmp_path, recwarn):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}')
    _jsonl.append(path, [{"a": 2}])
    assert path.read_text() == '{"a": 1}\n{"a":2}\n'
    assert not recwarn.list


def test_appending_creates_the_file_and_appends_nothing_for_a_bad_record(tmp_path):
    path = tmp_path / "new" / "r.jsonl"
    _jsonl.append(path, [{"a": 1}])
    with pytest.raises(ValueError):
        _jsonl.append(path, [{"a": 2}, {"a": float("nan")}])
    assert path.read_text() == '{"a":1}\n'


@pytest.mark.parametrize("data, kept", [(b"a\nbc\nde", b"a\nbc\n"), (b"abc", b""),
                                        (b"x\n" + b"y" * 10, b"x\n"), (b"q\n[1,", b"q\n")])
def test_a_torn_last_line_is_found_across_read_chunks(tmp_path, data, kept):
    path = tmp_path / "v.jsonl"
    path.write_bytes(data)
    with pytest.warns(UserWarning, match="dropped a truncated last record"):
        _jsonl._mend_tail(path, chunk_bytes=3)
    assert path.read_bytes() == kept


# ----------------------------------------------------------------------------- both kinds
def _validation_record(**kw):
    rec = {"schema": "simplace.validation_record", "schema_version": 1, "cost_model": "x",
           "graph_hash": "ab", "graph_name": "g", "device_names": ["cpu:0"],
           "assignment": [0], "predicted_step_time_s": 1.0, "measured_step_time_s": 2.0,
           "method": "m"}
    return {**rec, **kw}


def _calibration_records():
    timing = {"samples_s": [1e-3, 1.1e-3], "median_s": 1e-3, "mad_s": 1e-4}
    head = {"kind": "header", "schema": "simplace.calibration_records", "schema_version": 2,
            "name": "m", "host": "h", "date": "d", "jax_version": "0", "jaxlib_version": "0",
            "devices": [{"name": "cpu:0", "kind": "cpu", "id": 0, "memory_bytes": 1}],
            "settings": {}}
    return [head, {"kind": "put_host", "src": "cpu:0", "dst": "cpu:0", "timing": timing},
            {"kind": "phase", "phase": "runtime"}]


def _write_calibration(path, recs):
    with RecordWriter(path) as w:
        w.write_all(recs)


@pytest.mark.parametrize("kind", ["validation", "calibration"])
def test_validation_and_calibration_records_share_the_torn_write_policy(tmp_path, kind):
    path = tmp_path / f"{kind}.jsonl"
    if kind == "validation":
        recs = [_validation_record(), _validation_record(method="n")]
        append_records(path, recs)
        read, error = read_validation, SimplaceError
    else:
        recs = _calibration_records()
        _write_calibration(path, recs)
        read, error = read_calibration, CalibrationError
    whole = path.read_text()
    assert read(path) == recs
    path.write_text(whole + whole.splitlines()[1][:25])  # an append cut short
    with pytest.warns(UserWarning, match=rf"{path}, line {len(recs) + 1}: skipped a trunc"):
        assert read(path) == recs
    # appending again drops the torn line, so it does not swallow the next record
    with pytest.warns(UserWarning, match="dropped a truncated last record"):
        if kind == "validation":
            append_records(path, recs[1:])
        else:
            _write_calibration(path, recs[1:])
    assert read(path) == [*recs, *recs[1:]]
    # a damaged line elsewhere is an error naming the file and line
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:20]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(error, match=rf"{path}, line 2 is not valid JSON .*delete or repair"):
        read(path)


def test_record_field_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "v.jsonl"
    path.write_text(json.dumps(_validation_record()) + "\n"
                    + json.dumps(_validation_record(measured_step_time_s="fast")) + "\n")
    with pytest.raises(SimplaceError, match=rf"{path}, line 2: field 'measured_step_time_s' "
                                            r"of a validation record must be a number, got "
                                            r'"fast"'):
        read_validation(path)
    with pytest.raises(SimplaceError, match=r"record 0: field 'method' is missing \(a "
                                            r"validation record needs"):
        append_records(path, [{k: v for k, v in _validation_record().items()
                               if k != "method"}])


# ----------------------------------------------------------------------------- check_fields
@pytest.mark.parametrize("obj, match", [
    ([1], r"^here: the thing must be a JSON object, got a list\.$"),
    ({"n": 1}, r"^here: field 's' is missing \(the thing needs s, n\)\.$"),
    ({"s": 1, "n": 1}, r"^here: field 's' of the thing must be a string, got 1\.$"),
    ({"s": "x", "n": True}, r"field 'n' of the thing must be a number, got true\.$"),
    ({"s": "x", "n": "1"}, r"field 'n' of the thing must be a number, got \"1\"\.$"),
    ({"s": "x", "n": 1, "k": 1.5}, r"field 'k' of the thing must be an integer or null, "
                                   r"got 1\.5\.$"),
    ({"s": "x", "n": 1, "z": 0}, r"the thing has an unknown field 'z'; it takes s, n, k\.$"),
    ({"s": "x" * 100, "n": 3, "k": "y" * 100}, r'got "yyyy[y]*\.\.\.\.$'),
])
def test_check_fields_messages(obj, match):
    with pytest.raises(CalibrationError, match=match):
        check_fields(obj, {"s": str, "n": float}, CalibrationError, "here", what="the thing",
                     optional={"k": (int, type(None))}, closed=True)


def test_check_fields_accepts_json_types():
    obj = {"s": "x", "n": 3, "k": None, "extra": object()}
    assert check_fields(obj, {"s": str, "n": float}, SimplaceError, "w",
                        optional={"k": (int, type(None)), "absent": str}) is obj
    assert check_fields({"b": False}, {"b": bool}, SimplaceError, "w") == {"b": False}
    with pytest.raises(SimplaceError, match="must be true or false, got 0"):
        check_fields({"b": 0}, {"b": bool}, SimplaceError, "w")


def test_check_fields_hints_say_what_a_field_must_be():
    with pytest.raises(SimplaceError, match=r"field 'a' of a placement must be a list of "
                                            r"device indices, got 3\.$"):
        check_fields({"a": 3}, {"a": list}, SimplaceError, "p.json", what="a placement",
                     hints={"a": "a list of device indices"})


@pytest.mark.parametrize("obj, match", [
    ({"schema": "other", "schema_version": 1}, r"^f: not a simplace thing \(its 'schema' is "
                                               r"\"other\", not \"s\"\)\.$"),
    ({"schema_version": 1}, r"^f: not a simplace thing \(it has no 'schema' field \"s\"\)"),
    ([1], r"^f: not a simplace thing \(it is a list, not an object\)\.$"),
    ({"schema": "s", "schema_version": 3}, r"^f: thing schema_version 3 is not supported; "
                                           r"this simplace reads 2\.$"),
    ({"schema": "s", "schema_version": 1}, r"reads 2: make it again\.$"),
    ({"schema": "s"}, r"thing schema_version null is not supported"),
])
def test_check_schema_messages(obj, match):
    with pytest.raises(SimplaceError, match=match):
        check_schema(obj, "s", 2, SimplaceError, "f", "thing", older={1: "make it again."})
    assert check_schema({"schema": "s", "schema_version": 2}, "s", 2, SimplaceError, "f",
                        "thing") == {"schema": "s", "schema_version": 2}
