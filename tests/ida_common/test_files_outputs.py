"""ida_common.files: outputs never overwrite inputs, whole directories appear atomically, stale
temporaries of killed writers are swept and live ones are not (issue 11 items 2, 3, 11)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ida_common.files import atomic_directory, check_output, sweep_stale, temp_pattern

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_output_onto_or_into_or_around_the_input_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"x")
    (tmp_path / "link").symlink_to(src)
    refused = {
        src: "is the input",
        tmp_path / "link": "is the input",  # through a symlink
        tmp_path / "hf" / "sub" / "..": "is the input",  # through .. (sub does not exist)
        tmp_path / "hf" / "mx": "is inside the input",
        tmp_path / "link" / "mx": "is inside the input",
        tmp_path: "contains the input",
    }
    for out, why in refused.items():
        for overwrite in (False, True):  # --overwrite never allows writing onto the input
            with pytest.raises(ValueError, match=why) as info:
                check_output(out, inputs=[src], overwrite=overwrite, kind="dir", what="OUT_DIR")
            assert "\n" not in str(info.value) and str(info.value).startswith(f"OUT_DIR {out}: ")
    f = src / "model.safetensors"
    with pytest.raises(ValueError, match="is the input"):
        check_output(tmp_path / "link" / "model.safetensors", inputs=[f], overwrite=True)
    assert check_output(tmp_path / "out", inputs=[src], kind="dir") == tmp_path / "out"


def test_existing_outputs_need_overwrite_and_a_file_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "a").write_text("a")
    (tmp_path / "file").write_text("f")
    check_output(tmp_path / "empty", kind="dir")  # nothing to lose
    with pytest.raises(ValueError, match="exists and is not empty; pass --overwrite"):
        check_output(full, kind="dir")
    check_output(full, kind="dir", overwrite=True)
    with pytest.raises(ValueError, match="exists; pass --overwrite"):
        check_output(tmp_path / "file")
    check_output(tmp_path / "file", overwrite=True)
    with pytest.raises(ValueError, match="is a directory; give the output file's name"):
        check_output(full, overwrite=True)
    with pytest.raises(ValueError, match="exists and is not a directory"):
        check_output(tmp_path / "file", kind="dir", overwrite=True)


def test_atomic_directory_replaces_only_when_complete(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with atomic_directory(out) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(out, overwrite=True) as tmp:
        (tmp / "a").write_text("new, half")
        raise RuntimeError("failed half-way")
    assert (out / "a").read_text() == "old" and sorted(os.listdir(tmp_path)) == ["out"]
    with pytest.raises(ValueError, match="pass --overwrite"), atomic_directory(out) as tmp:
        (tmp / "a").write_text("new")
    assert (out / "a").read_text() == "old" and sorted(os.listdir(tmp_path)) == ["out"]
    with atomic_directory(out, overwrite=True) as tmp:
        (tmp / "b").write_text("new")
    assert sorted(os.listdir(out)) == ["b"] and sorted(os.listdir(tmp_path)) == ["out"]


UNWRITABLE = [("under-a-file", "is a file, not a directory")]
if Path("/proc/self").is_dir():  # no one may create directories in /proc, root included
    UNWRITABLE.append(("/proc/ida-no/out", r"cannot create a directory in /proc \(No such file or directory\)"))


@pytest.mark.parametrize(("where", "why"), UNWRITABLE)
def test_atomic_directory_names_the_output_it_cannot_create(where: str, why: str, tmp_path: Path) -> None:
    """Issue 23 item 10: the error names the output the caller gave and what blocks it, never the
    hidden temporary (``.out.XXXXXXXX.tmp``); nothing is left behind."""
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub" / "out" if where == "under-a-file" else Path(where)
    with pytest.raises(OSError, match=why) as info, atomic_directory(out) as tmp:
        (tmp / "a").write_text("never")
    assert info.value.filename == str(out) and ".tmp" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["file"]


KILLED_WRITER = """
    import sys
    from ida_common.files import atomic_directory
    with atomic_directory(sys.argv[1] if len(sys.argv) > 1 else {out!r}, overwrite=True) as tmp:
        (tmp / "a").write_text("new")
"""


def test_a_kill_before_the_rename_keeps_the_old_directory_and_the_next_run_sweeps(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_text("old")
    r = _python(KILLED_WRITER.format(out=str(out)), env={"IDA_KILL_AT": "atomic_directory.complete"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (out / "a").read_text() == "old"
    stale = [p for p in os.listdir(tmp_path) if p != "out"]
    assert len(stale) == 1 and temp_pattern("out").fullmatch(stale[0]), stale
    r = _python(KILLED_WRITER.format(out=str(out)))
    assert r.returncode == 0, r.stderr
    assert (out / "a").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["out"]


def test_sweep_removes_dead_writers_temporaries_only(tmp_path: Path) -> None:
    live = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import os, sys, tempfile
            from ida_common.files import lock_temporary
            fd, p = tempfile.mkstemp(prefix=".model.safetensors.", suffix=".tmp", dir={str(tmp_path)!r})
            assert lock_temporary(fd)
            print(p, flush=True)
            sys.stdin.read()
        """),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        live_tmp = Path(live.stdout.readline().strip())
        r = _python(f"""
            import os, tempfile
            from ida_common.files import lock_temporary
            fd, p = tempfile.mkstemp(prefix=".model.safetensors.", suffix=".tmp", dir={str(tmp_path)!r})
            assert lock_temporary(fd)
            print(p, flush=True)
            os.kill(os.getpid(), 9)
        """)
        dead_tmp = Path(r.stdout.strip())
        other = tmp_path / ".model.safetensors.notours.tmp"  # not mkstemp's 8 characters
        other.write_text("keep")
        (tmp_path / ".tokenizer.json.abcd1234.tmp").write_text("another target's")
        assert live_tmp.exists() and dead_tmp.exists()
        assert sweep_stale(tmp_path, "model.safetensors") == [dead_tmp]
        assert live_tmp.exists() and not dead_tmp.exists() and other.exists()
        assert (tmp_path / ".tokenizer.json.abcd1234.tmp").exists()
    finally:
        live.communicate("", timeout=60)
    assert sweep_stale(tmp_path, "model.safetensors") == [live_tmp]  # its writer has exited now


def test_copy_file_atomic_killed_half_way_leaves_the_old_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "big.json", tmp_path / "out" / "big.json"
    src.write_bytes(os.urandom(3 << 20))
    dst.parent.mkdir()
    dst.write_text("old")
    code = f"from ida_common.files import copy_file_atomic; copy_file_atomic({str(src)!r}, {str(dst)!r})"
    r = _python(code, env={"IDA_KILL_AT": "copy_file.partial"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert dst.read_text() == "old"
    (stale,) = [p for p in os.listdir(dst.parent) if p != "big.json"]
    assert os.path.getsize(dst.parent / stale) > 0  # the half copy, under a temporary name only
    assert _python(code).returncode == 0
    assert dst.read_bytes() == src.read_bytes() and os.listdir(dst.parent) == ["big.json"]


def test_atomic_output_sweeps_a_killed_writers_temporary_but_not_a_live_ones(tmp_path: Path) -> None:
    """Issue 11 item 11: temporaries of killed writers (up to 76 MB each) were never removed. Now every
    atomic_output sweeps the dead ones of its own target; a concurrent live writer's stays."""
    from ida_common.files import atomic_output

    target = tmp_path / "model.safetensors"
    live = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys
            from ida_common.files import atomic_output
            with atomic_output({str(target)!r}) as f:
                print(f.name, flush=True)
                sys.stdin.read()
                f.write(b"live")
        """),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        live_tmp = Path(live.stdout.readline().strip())
        src = tmp_path / "src.bin"
        src.write_bytes(os.urandom(2 << 20))
        code = f"from ida_common.files import copy_file_atomic; copy_file_atomic({str(src)!r}, {str(target)!r})"
        assert _python(code, env={"IDA_KILL_AT": "copy_file.partial"}).returncode == -signal.SIGKILL
        stale = [p for p in tmp_path.iterdir() if p.name.startswith(".model") and p != live_tmp]
        assert len(stale) == 1 and stale[0].stat().st_size > 0
        with atomic_output(target) as f:
            f.write(b"ours")
        assert not stale[0].exists() and live_tmp.exists() and target.read_bytes() == b"ours"
    finally:
        live.communicate("", timeout=60)
    assert target.read_bytes() == b"live" and sorted(p.name for p in tmp_path.iterdir()) == [
        "model.safetensors",
        "src.bin",
    ]
