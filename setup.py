"""Build hook: the package build generates specdec/v1 (the gRPC/protobuf code) from
protos/specdec/v1/*.proto, so that `pip install .`, `pip wheel .`, an sdist build and the
editable install of `make setup` all carry it. The generated code is never committed
(.gitignore) and never edited by hand. Everything else is in pyproject.toml.

The generator is grpc_tools.protoc from grpcio-tools, which pyproject.toml's
[build-system] requires (pinned to constraints.txt's version): it runs in pip's isolated
build environment and never lands in the installed environment.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from setuptools import Command, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_ROOT = ROOT / "protos"
PROTO_PACKAGE = "specdec/v1"  # protos/specdec/v1/*.proto -> specdec/v1/*_pb2*.py


def generate_protos(root: Path = ROOT) -> list[Path]:
    """Generate specdec/v1 under `root` from protos/; return the .proto files used.

    The code is generated into a scratch folder first, and only files whose content
    changed are written (stale ones removed), so regenerating a checkout whose code is
    current changes nothing, even for a process importing specdec.v1 at that moment."""
    from grpc_tools import protoc  # the build requirement; imported only when building

    protos = sorted((root / "protos" / PROTO_PACKAGE).glob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {root / 'protos' / PROTO_PACKAGE}")
    include = str(Path(protoc.__file__).resolve().parent / "_proto")  # well-known types
    with tempfile.TemporaryDirectory() as scratch:
        argv = ["grpc_tools.protoc", f"-I{root / 'protos'}", f"-I{include}",
                f"--python_out={scratch}", f"--pyi_out={scratch}",
                f"--grpc_python_out={scratch}", *map(str, protos)]
        if protoc.main(argv) != 0:
            raise RuntimeError("grpc_tools.protoc failed on " + " ".join(map(str, protos)))
        new = Path(scratch) / PROTO_PACKAGE
        (new / "__init__.py").write_bytes(b"")
        fresh = {f.name: f.read_bytes() for f in new.iterdir() if f.is_file()}
    out = root / PROTO_PACKAGE
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():  # the module of a removed .proto
        if stale.name not in fresh and stale.name not in (".generated", "__pycache__"):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    for name, data in fresh.items():
        target = out / name
        if not target.is_file() or target.read_bytes() != data:
            target.write_bytes(data)
    return protos


class build_protos(Command):  # noqa: N801 (setuptools command names are lower case)
    description = "generate specdec/v1 from protos/specdec/v1/*.proto"
    user_options: list = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        for proto in generate_protos(ROOT):
            print(f"generated code for {proto.relative_to(ROOT)}")


class build_py_with_protos(build_py):  # noqa: N801
    """build_py that first generates specdec/v1 in the source tree (the editable install
    of `make setup` imports it from there; a wheel copies it from there)."""

    def run(self):
        self.run_command("build_protos")
        super().run()

    def check_package(self, package, package_dir):
        # egg_info lists sources before build_py.run generates specdec/v1
        if package == "specdec.v1" and not Path(package_dir).is_dir():
            return None
        return super().check_package(package, package_dir)


# Listed explicitly: specdec/v1 does not exist before the build generates it.
PACKAGES = sorted(
    {*find_packages(include=["specdec", "specdec.*", "draft_service", "draft_service.*",
                             "target_service", "target_service.*", "coordinator",
                             "coordinator.*", "specdec_tools", "specdec_tools.*"]),
     "specdec.v1"}
)

setup(
    packages=PACKAGES,
    package_data={"specdec.v1": ["*.pyi"], "coordinator.api": ["*.html"],
                  "specdec": ["requirements/*.txt"]},  # the real pairs' part wheels
    cmdclass={"build_protos": build_protos, "build_py": build_py_with_protos},
)
