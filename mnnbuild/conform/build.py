"""Build MNN's own runtime (``libMNN``, ``libllm``, ``llm_demo``) and our conformance driver against it.

The build lives outside the project, in ``<cache root>/<key>/`` (``src/`` patched source, ``qnn/include/QNN``
headers link, ``build/``, ``driver-<hash>/``, ``build.json`` written last), where the key hashes the MNN
source, the patches, the QNN headers, the compiler and cmake, and the cmake options; so the ~15-minute
build happens once per machine and a changed input gets its own directory. Cache root:
``$MNNBUILD_CONFORM_CACHE``, else ``$XDG_CACHE_HOME/mnnbuild/conform``, else ``~/.cache/mnnbuild/conform``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from mnnbuild.base.errors import ConformBuildError
from mnnbuild.base.fsutil import atomic_write_text, sha256_file
from mnnbuild.base.userdirs import user_cache_dir
from mnnbuild.conform.patcher import Patch, check_patches, load_patches

log = logging.getLogger(__name__)

CACHE_ENV = "MNNBUILD_CONFORM_CACHE"
SOURCE_ENV = "MNN_SOURCE"
QNN_ROOT_ENV = "QNN_SDK_ROOT"
DRIVER_SOURCE = Path(__file__).parent / "driver" / "conform_driver.cpp"
#: The options issue 13 found to build MNN's LLM engine with the QNN plugin backend on x86_64. Optimization
#: is off (the last -O wins over MNN's own -O3): the build is for semantics, not speed, and -O0 compiles
#: several times faster on a small shared box. No fast-math either way, so the numerics are MNN's.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_C_FLAGS_RELEASE=-O0 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG",
    "-DMNN_BUILD_LLM=ON",
    "-DMNN_LOW_MEMORY=ON",
    "-DMNN_SUPPORT_TRANSFORMER_FUSE=ON",
    "-DMNN_QNN=ON",
    "-DMNN_WITH_PLUGIN=ON",
    "-DMNN_BUILD_TOOLS=ON",
)
#: What we run: the LLM demo (it pulls in libMNN and libllm), and the NPU partitioner with the tool that makes
#: its samples (compared with our partition, not a gate). Not part of the key: a finished build lacking a newer
#: target gets it from :func:`ensure_tools`, an incremental build in the same tree.
BUILD_TARGETS = ("llm_demo", "compilefornpu", "generateIO")
_BUILD_RECORD = "build.json"


class BuildRecord(BaseModel):
    key: str
    source: str
    source_sha256: str
    patches: list[str]
    qnn_headers: str
    compiler: str
    cmake: str
    options: list[str]
    seconds: float


@dataclass(frozen=True)
class MnnBuild:
    """A finished build: where its libraries and programs are."""

    root: Path
    record: BuildRecord

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def llm_demo(self) -> Path:
        return self.build_dir / "llm_demo"

    def tool(self, target: str) -> Path:
        """A program the build makes (a cmake target at the top of the build tree)."""
        return self.build_dir / target

    @property
    def source_dir(self) -> Path:
        return self.root / "src"

    def lib_dirs(self) -> list[Path]:
        """Directories holding the built shared libraries (libMNN, libllm, libMNN_Express, ...)."""
        return sorted({p.parent for p in self.build_dir.rglob("lib*.so") if p.is_file()})


@dataclass(frozen=True)
class Toolchain:
    cmake: Path
    compiler: Path
    generator: list[str]
    """cmake generator arguments (Ninja when available)."""
    launcher: Path | None
    """ccache, when installed: a second key (e.g. a new patch) recompiles only what changed."""

    def describe(self) -> tuple[str, str]:
        return _first_line([str(self.compiler), "--version"]), _first_line([str(self.cmake), "--version"])


def _first_line(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0].strip() if out.strip() else cmd[0]


def find_toolchain(environ: Mapping[str, str] | None = None) -> Toolchain:
    """cmake and a C++ compiler must be installed; nothing is installed at run time."""
    env = os.environ if environ is None else environ
    path = env.get("PATH")
    cmake = shutil.which("cmake", path=path)
    compiler_name = env.get("CXX", "c++")
    compiler = shutil.which(compiler_name, path=path) or shutil.which("g++", path=path)
    missing = [name for name, found in (("cmake", cmake), (f"a C++ compiler ({compiler_name})", compiler)) if not found]
    if missing or cmake is None or compiler is None:
        raise ConformBuildError(
            f"conform needs {' and '.join(missing)} on PATH to build MNN (e.g. apt-get install cmake g++); "
            "nothing is installed at run time"
        )
    ninja = shutil.which("ninja", path=path)
    generator = ["-G", "Ninja"] if ninja else ["-G", "Unix Makefiles"]
    ccache = shutil.which("ccache", path=path)
    return Toolchain(Path(cmake), Path(compiler), generator, Path(ccache) if ccache else None)


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser().resolve()
    return user_cache_dir(env).expanduser().resolve() / "conform"


def _is_tarball(path: Path) -> bool:
    return path.is_file() and any(path.name.endswith(ext) for ext in (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2"))


def resolve_source(source: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> Path:
    """The MNN source (a tree or a tarball of one) named by the user, checked to be one."""
    env = os.environ if environ is None else environ
    raw = source if source is not None else env.get(SOURCE_ENV)
    if not raw:
        raise ConformBuildError(
            f"conform needs an MNN source: set {SOURCE_ENV} (or --mnn-source) to an MNN source tree or tarball"
        )
    path = Path(raw).expanduser().resolve()
    if path.is_dir():
        if not (path / "CMakeLists.txt").is_file() or not (path / "transformers" / "llm").is_dir():
            raise ConformBuildError(f"{path}: not an MNN source tree (expected CMakeLists.txt and transformers/llm/)")
        return path
    if _is_tarball(path):
        return path
    raise ConformBuildError(f"{path}: {SOURCE_ENV} must be an MNN source directory or a .tar(.gz|.xz|.bz2) of one")


def resolve_qnn_headers(headers: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> Path:
    """The QNN API headers dir (the one holding QnnInterface.h): given, or ``$QNN_SDK_ROOT/include/QNN``."""
    env = os.environ if environ is None else environ
    if headers is not None:
        path, origin = Path(headers).expanduser().resolve(), "--qnn-headers"
    elif env.get(QNN_ROOT_ENV):
        path, origin = Path(env[QNN_ROOT_ENV]).expanduser().resolve() / "include" / "QNN", QNN_ROOT_ENV
    else:
        raise ConformBuildError(
            f"conform needs Qualcomm's QNN headers: set {QNN_ROOT_ENV} to a QNN/QAIRT SDK or pass --qnn-headers DIR "
            "(the directory holding QnnInterface.h)"
        )
    if not (path / "QnnInterface.h").is_file():
        raise ConformBuildError(f"{path} ({origin}): no QnnInterface.h; expected the QNN API headers directory")
    return path


def _tree_digest(root: Path, pattern: str = "*") -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob(pattern)):
        rel = p.relative_to(root)
        if ".git" in rel.parts or not p.is_file():
            continue
        h.update(rel.as_posix().encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def source_digest(source: Path) -> str:
    return sha256_file(source) if source.is_file() else _tree_digest(source)


def build_key(
    source_sha256: str, patches: list[Patch], headers_sha256: str, compiler: str, cmake: str, options: tuple[str, ...]
) -> str:
    """Changes with the source, any patch's text, the QNN headers, the compiler or cmake, and the options."""
    doc = {
        "source": source_sha256,
        "patches": [[p.name, hashlib.sha256(p.text.encode()).hexdigest()] for p in patches],
        "qnn_headers": headers_sha256,
        "compiler": compiler,
        "cmake": cmake,
        "options": list(options),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _single_top_dir(root: Path) -> Path:
    entries = [p for p in root.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else root


def unpack_source(source: Path, dest: Path) -> Path:
    """Copy or extract the source into ``dest``; returns the tree's root (a tarball's single top dir)."""
    if source.is_dir():
        shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        return dest
    dest.mkdir(parents=True)
    try:
        with tarfile.open(source) as tar:
            tar.extractall(dest, filter="data")  # refuses absolute paths, '..' and links out of dest
    except (tarfile.TarError, OSError) as exc:
        raise ConformBuildError(f"{source}: cannot extract: {exc}") from None
    root = _single_top_dir(dest)
    if not (root / "CMakeLists.txt").is_file():
        raise ConformBuildError(f"{source}: no CMakeLists.txt at the top of the archive; not an MNN source")
    return root


def prepare_source(source: Path, patches: list[Patch], dest: Path) -> None:
    """Unpack ``source`` to a temp dir next to ``dest``, check and apply every patch, rename into place.
    A patch that does not apply stops here, before anything is built (and ``dest`` is not created)."""
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        root = unpack_source(source, tmp)
        patched = check_patches(root, patches)
        for rel, text in patched.items():
            (root / rel).write_text(text, encoding="utf-8")
        root.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(cmd: list[str], cwd: Path, log_path: Path, what: str, env: Mapping[str, str] | None = None) -> None:
    with log_path.open("a", encoding="utf-8") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=dict(env) if env else None)
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-1:]
        raise ConformBuildError(f"{what} failed (exit {proc.returncode}); log {log_path}: {' '.join(tail)}")


def _ccache_env(tools: Toolchain, root: Path) -> dict[str, str]:
    env = dict(os.environ)
    if tools.launcher:
        # objects are shared between keys: relative paths under the cache root, no cwd in the hash
        env.setdefault("CCACHE_BASEDIR", str(root.parent))
        env.setdefault("CCACHE_NOHASHDIR", "1")
    return env


def ensure_build(
    source: Path, qnn_headers: Path, jobs: int = 2, root: Path | None = None, patches: list[Patch] | None = None
) -> MnnBuild:
    """The build for this source, patches, headers and toolchain: reused when done, else made (once)."""
    tools = find_toolchain()
    patches = load_patches() if patches is None else patches
    compiler, cmake = tools.describe()
    src_sha = source_digest(source)
    key = build_key(src_sha, patches, _tree_digest(qnn_headers, "*.h"), compiler, cmake, CMAKE_OPTIONS)
    base = (root or cache_root()) / key
    record_path = base / _BUILD_RECORD
    if record_path.is_file():
        try:
            return MnnBuild(base, BuildRecord.model_validate_json(record_path.read_text(encoding="utf-8")))
        except ValueError:
            log.warning("conform: %s is unreadable; building again", record_path)
    base.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    src = base / "src"
    if not src.is_dir():  # renamed into place only once patched: an existing one is complete
        log.info("conform: unpacking %s and applying %d patches into %s", source, len(patches), src)
        prepare_source(source, patches, src)
    include = base / "qnn" / "include"
    include.mkdir(parents=True, exist_ok=True)
    link = include / "QNN"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(qnn_headers, target_is_directory=True)
    build = base / "build"
    build.mkdir(exist_ok=True)
    log_path = base / "build.log"
    env = _ccache_env(tools, base)
    configure = [str(tools.cmake), *tools.generator, "-S", "../src", "-B", ".", *CMAKE_OPTIONS]
    configure.append(f"-DQNN_SDK_ROOT={base / 'qnn'}")  # cmake picks the compiler as find_toolchain did ($CXX, c++)
    if tools.launcher:
        configure += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={tools.launcher}" for lang in ("C", "CXX")]
    log.warning("conform: building MNN in %s (log %s); this takes ~15 minutes on 2 cores, once", build, log_path)
    _run(configure, build, log_path, "cmake configure of MNN", env)
    _run(
        [str(tools.cmake), "--build", ".", "-j", str(jobs), "--target", *BUILD_TARGETS],
        build,
        log_path,
        "build of MNN",
        env,
    )
    record = BuildRecord(
        key=key,
        source=str(source),
        source_sha256=src_sha,
        patches=[p.name for p in patches],
        qnn_headers=str(qnn_headers),
        compiler=compiler,
        cmake=cmake,
        options=list(CMAKE_OPTIONS),
        seconds=time.perf_counter() - started,
    )
    atomic_write_text(record_path, record.model_dump_json(indent=2))
    return MnnBuild(base, record)


def ensure_tools(build: MnnBuild, targets: tuple[str, ...]) -> None:
    """Build the ``targets`` a finished build lacks (one made before they were in ``BUILD_TARGETS``):
    an incremental build in its tree, the rest of it up to date."""
    missing = [t for t in targets if not build.tool(t).is_file()]
    if not missing:
        return
    tools = find_toolchain()
    log.warning("conform: building %s in %s", ", ".join(missing), build.build_dir)
    _run(
        [str(tools.cmake), "--build", ".", "-j", "2", "--target", *missing],
        build.build_dir,
        build.root / "build.log",
        f"build of {', '.join(missing)}",
        _ccache_env(tools, build.root),
    )


def ensure_driver(build: MnnBuild) -> Path:
    """Our driver program, compiled against this build (once per driver source)."""
    tools = find_toolchain()
    digest = sha256_file(DRIVER_SOURCE)[:12]
    out_dir = build.root / f"driver-{digest}"
    exe = out_dir / "conform_driver"
    if exe.is_file():
        return exe
    out_dir.mkdir(parents=True, exist_ok=True)
    lib_dirs = build.lib_dirs()
    libs = [p.name[3:-3] for d in lib_dirs for p in d.glob("lib*.so") if p.name[3:-3] in ("MNN", "MNN_Express", "llm")]
    tmp = out_dir / f"conform_driver.tmp{os.getpid()}"
    cmd = [
        str(tools.compiler),
        "-std=c++17",
        "-O2",
        str(DRIVER_SOURCE),
        "-I",
        str(build.source_dir / "include"),
        "-I",
        str(build.source_dir / "transformers" / "llm" / "engine" / "include"),
        *[f"-L{d}" for d in lib_dirs],
        *[f"-Wl,-rpath,{d}" for d in lib_dirs],
        *[f"-l{name}" for name in sorted(set(libs), key=("llm", "MNN_Express", "MNN").index)],
        "-o",
        str(tmp),
    ]
    _run(cmd, out_dir, out_dir / "compile.log", "compile of the conformance driver")
    tmp.rename(exe)
    return exe
