"""ida_common.jsonl: one error text for JSON, UTF-8 and nesting errors; torn-tail repair."""

from __future__ import annotations

import json

import pytest

from ida_common.jsonl import iter_jsonl, repair_torn_tail


class Bad(ValueError):
    pass


@pytest.mark.parametrize(
    "line, needle",
    [
        (b'{"a": "x', "(Unterminated string starting at column 7)"),
        (b'{"a" 1}', "(Expecting ':' delimiter at column 6)"),
        (b'{"a": "\xff"}', "(invalid UTF-8 (byte 0xff at byte column 8))"),
        (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
    ],
)
def test_errors_name_file_line_and_what(tmp_path, line, needle):
    with pytest.raises(Bad) as info:
        list(iter_jsonl([b'{"ok": 1}', line], tmp_path / "f.jsonl", Bad))
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 'f.jsonl'}:2: not valid JSON (") and needle in msg and "at at" not in msg


def test_torn_tail_is_cut_and_a_whole_last_record_terminated(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": 2, "b"')
    with pytest.warns(RuntimeWarning, match="dropping an incomplete last line"):
        assert repair_torn_tail(p) == b'{"a": 1}\n'
    p.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert repair_torn_tail(str(p)) == b'{"a": 1}\n{"a": 2}\n' == p.read_bytes()
    assert [json.loads(x) for x in p.read_bytes().splitlines()] == [{"a": 1}, {"a": 2}]


def test_dumps_utf8_keeps_text_and_escapes_only_what_utf8_cannot_hold() -> None:
    import doctest
    import json

    from ida_common import jsonl

    assert jsonl.dumps_utf8({"t": "tab\tünï"}) == json.dumps({"t": "tab\tünï"}, ensure_ascii=False)
    line = jsonl.dumps_utf8({"t": "a\udcffb", "u": "é"})
    line.encode("utf-8")  # writable
    assert json.loads(line) == {"t": "a\udcffb", "u": "é"}
    assert doctest.testmod(jsonl).failed == 0
