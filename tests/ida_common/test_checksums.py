"""ida_common.checksums: SHA256SUMS written and read in coreutils' format, and every damage named."""

from __future__ import annotations

import doctest
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ida_common import checksums
from ida_common.checksums import SUMS_FILE, ChecksumError, read_sums, verify_sums, write_sums
from tests.conftest import flip_bit

SHA256SUM = shutil.which("sha256sum")


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    (root / "config.json").write_text('{"a": 1}\n')
    (root / "sub" / "notes.txt").write_text("x")
    (root / "empty").write_bytes(b"")
    return root


def test_doctests() -> None:
    result = doctest.testmod(checksums, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result


def test_every_file_is_listed_with_its_sha256_and_the_sums_file_is_not(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    sums = write_sums(root)
    assert list(sums) == ["config.json", "empty", "model.safetensors", "sub/notes.txt"]
    for name, digest in sums.items():
        assert digest == hashlib.sha256((root / name).read_bytes()).hexdigest()
    assert read_sums(root) == sums
    write_sums(root)  # again, with SHA256SUMS present: it never lists itself
    assert read_sums(root) == sums
    assert verify_sums(root) is True and verify_sums(root, ["config.json"]) is True


@pytest.mark.skipif(SHA256SUM is None, reason="coreutils' sha256sum is not installed")
def test_coreutils_checks_our_file_and_we_read_its_file(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    write_sums(root)
    ok = subprocess.run([SHA256SUM, "-c", SUMS_FILE], cwd=root, capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and ok.stdout.count(": OK") == 4, ok.stdout + ok.stderr
    flip_bit(root / "model.safetensors", 500_000)
    bad = subprocess.run([SHA256SUM, "-c", SUMS_FILE], cwd=root, capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "model.safetensors: FAILED" in bad.stdout, bad.stdout
    with pytest.raises(ChecksumError, match=r"/model.safetensors: its bytes differ from the sha256 recorded"):
        verify_sums(root)
    # a file written by sha256sum itself, text and binary markers
    names = ["config.json", "sub/notes.txt"]
    text = subprocess.run([SHA256SUM, *names], cwd=root, capture_output=True, text=True, check=True).stdout
    binary = subprocess.run([SHA256SUM, "-b", "empty"], cwd=root, capture_output=True, text=True, check=True).stdout
    (root / SUMS_FILE).write_text(text + binary)
    assert sorted(read_sums(root) or {}) == ["config.json", "empty", "sub/notes.txt"]
    assert verify_sums(root) is True


def test_no_sums_file_means_nothing_to_check(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    assert read_sums(root) is None and verify_sums(root) is False


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("flip", r"config.json: its bytes differ from the sha256 recorded in SHA256SUMS when it was written"),
        ("delete", r"sub/notes.txt: missing \(listed in SHA256SUMS\)"),
        ("garbled", r"SHA256SUMS: line 2 is not '<sha256>  <file name>': 'not a sum'"),
        ("twice", r"SHA256SUMS: line 5 lists config.json a second time"),
        ("latin1", r"SHA256SUMS: not UTF-8 text"),
        ("outside", r"SHA256SUMS: line 2 names a file outside its directory: '../secret'"),
        ("absolute", r"SHA256SUMS: line 2 names a file outside its directory: '/etc/passwd'"),
        # a list that is not a regular file is refused before it is opened: a FIFO would block, /dev/zero never end
        ("fifo", r"SHA256SUMS: not a regular file"),
        ("device", r"SHA256SUMS: not a regular file"),
        ("directory", r"SHA256SUMS: not a regular file"),
        ("dangling", r"SHA256SUMS: a link to a file that does not exist"),
        ("huge", r"SHA256SUMS: larger than 16 MiB"),
        ("listed-fifo", r"sub/notes.txt: not a regular file \(listed in SHA256SUMS\)"),
    ],
)
def test_each_damage_is_one_error_naming_the_file(tmp_path: Path, damage: str, message: str) -> None:
    root = _tree(tmp_path / "d")
    write_sums(root)
    sums_file = root / SUMS_FILE
    lines = sums_file.read_text().splitlines(keepends=True)
    if damage == "flip":
        flip_bit(root / "config.json", 3)
    elif damage == "delete":
        (root / "sub" / "notes.txt").unlink()
    elif damage == "garbled":
        sums_file.write_text(lines[0] + "not a sum\n")
    elif damage == "twice":
        sums_file.write_text("".join(lines) + lines[0])
    elif damage in ("outside", "absolute"):
        name = "../secret" if damage == "outside" else "/etc/passwd"
        sums_file.write_text(lines[0] + f"{'0' * 64}  {name}\n")
    elif damage in ("fifo", "device", "directory", "dangling"):
        sums_file.unlink()
        {
            "fifo": lambda: os.mkfifo(sums_file),
            "device": lambda: sums_file.symlink_to("/dev/zero"),
            "directory": sums_file.mkdir,
            "dangling": lambda: sums_file.symlink_to(root / "gone"),
        }[damage]()
    elif damage == "huge":
        sums_file.write_text("".join(lines) * (checksums.MAX_SUMS_BYTES // len("".join(lines)) + 1))
    elif damage == "listed-fifo":
        (root / "sub" / "notes.txt").unlink()
        os.mkfifo(root / "sub" / "notes.txt")
    else:
        sums_file.write_bytes(b"\xff\xfe\n")
    with pytest.raises(ChecksumError, match=message) as caught:
        verify_sums(root)
    assert caught.value.path.is_relative_to(root)


def test_a_name_not_listed_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    write_sums(root)
    (root / "late.txt").write_text("added after")
    assert verify_sums(root) is True  # what is listed still holds
    with pytest.raises(ChecksumError, match=r"late.txt: not listed in SHA256SUMS"):
        verify_sums(root, ["late.txt"])


def test_a_name_sha256sum_would_escape_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    (root / "a\\b").write_text("x")
    with pytest.raises(ValueError, match=r"a newline or backslash cannot be listed in SHA256SUMS"):
        write_sums(root)
    assert not (root / SUMS_FILE).exists()
