"""Stage runs on a loopback Dask cluster: ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 (started and
stopped here, killed with the tests even when they fail), the shared cache on moto's S3 server (`test_remote_cache`).

The tiny bundle built on the cluster is byte for byte the local build's, under the same cache keys; a worker killed
mid-task leaves its task to the other; a worker whose code differs refuses in one line, and so does one that cannot
reach the cache; a scheduler that does not answer stops the build in one line; Ctrl-C cancels the task there."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import pytest

from mnnbuild.pipeline.cache import ArtifactCache
from tests.conftest import PROJECT_ROOT, copy_project, doit
from tests.test_cache import summary
from tests.test_remote_cache import BUCKET, remote, s3  # noqa: F401 - s3: the module's moto server fixture

distributed = pytest.importorskip("distributed", reason="the cluster extra: pip install -e '.[test]'")

pytestmark = pytest.mark.slow  # runs doit on a cluster

TARGET = "bundle:tiny-qwen3-v79"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_pytest() -> None:
    """In a cluster process: SIGKILL when the test process dies, however it dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


class Loopback:
    """A scheduler and its workers, each a process of its own on 127.0.0.1."""

    def __init__(self, base: Path, env: Mapping[str, str]) -> None:
        self.base, self.env = base, dict(env)
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self._spawn(["scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--no-dashboard"], "scheduler")
        self.client = distributed.Client(self.address, timeout=30, set_as_default=False)

    def _spawn(self, args: list[str], name: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.base / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dask", *args],
            env={**self.env, **(env or {})},
            cwd=self.base,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_pytest,
        )
        self.procs.append(proc)
        return proc

    def add_worker(self, name: str, env: Mapping[str, str] | None = None, memory: float = 4) -> str:
        """A worker (no nanny: a killed worker stays dead), one task at a time; its address."""
        before = set(self.client.scheduler_info(n_workers=-1)["workers"])
        scratch = self.base / name
        args = ["worker", self.address, "--no-nanny", "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1",
                "--resources", f"MEMORY={memory}", "--name", name, "--preload", "mnnbuild.cluster.worker"]  # fmt: skip
        proc = self._spawn(args, name, {"MNNBUILD_WORKER_DIR": str(scratch), **(env or {})})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = set(self.client.scheduler_info(n_workers=-1)["workers"]) - before
            if new:
                (address,) = new
                self.workers[address] = proc
                return address
            assert proc.poll() is None, (self.base / f"{name}.log").read_text()
            time.sleep(0.2)
        raise AssertionError(f"worker {name} did not join")

    def kill(self, address: str) -> None:
        proc = self.workers.pop(address)
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        """Kill the cluster; its workers' task processes (and what they started) must end with them."""
        self.client.close()
        below = []
        for proc in self.procs:
            try:
                below += psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        gone = all_gone(below)
        for left in below:  # not to outlive the tests even so
            try:
                left.kill()
            except psutil.NoSuchProcess:
                pass
        assert gone, f"processes outlived their worker: {below}"


def cluster_env(s3_env: Mapping[str, str]) -> dict[str, str]:
    """What the cluster's processes see: this checkout first, the S3 endpoint, no cache of their own."""
    path = os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("MNNBUILD_", "DASK_"))}
    return {**keep, **s3_env, "PYTHONPATH": path, "MNNBUILD_CACHE": "off"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3: dict[str, str]) -> Iterator[Loopback]:  # noqa: F811
    loop = Loopback(tmp_path_factory.mktemp("cluster"), cluster_env(s3))
    try:
        loop.add_worker("w1")
        loop.add_worker("w2")
        yield loop
    finally:
        loop.stop()


def build_env(s3_env: Mapping[str, str], cluster: Loopback | str, prefix: str) -> dict[str, str]:
    address = cluster if isinstance(cluster, str) else cluster.address
    return {**s3_env, "MNNBUILD_SCHEDULER": address, "MNNBUILD_CACHE_REMOTE": f"s3://{BUCKET}/{prefix}"}


def task_processes(loop: Loopback, address: str) -> list[psutil.Process]:
    """A worker's task processes: the children of its fork server (`mnnbuild.cluster.worker`)."""
    try:
        servers = [
            c for c in psutil.Process(loop.workers[address].pid).children() if "forkserver" in " ".join(c.cmdline())
        ]
        return [t for s in servers for t in s.children()]
    except psutil.NoSuchProcess:
        return []


def wait_processing(loop: Loopback, prefix: str, timeout: float = 60) -> tuple[str, list[psutil.Process]]:
    """The worker that runs a task whose key starts with ``prefix``, once its process runs, and its processes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker, keys in loop.client.processing().items():
            if any(str(k).startswith(prefix) for k in keys) and task_processes(loop, worker):
                return str(worker), psutil.Process(loop.workers[worker].pid).children(recursive=True)
        time.sleep(0.05)
    raise AssertionError(f"no task {prefix}* ran")


def all_gone(procs: list[psutil.Process], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_bundle_built_on_the_cluster_is_the_local_build_byte_for_byte(
    tmp_path: Path,
    s3: dict[str, str],  # noqa: F811
    cluster: Loopback,
) -> None:
    """doit keeps the DAG, every stage but fetch runs on a worker; the bundle is the local build's, every cache key
    is the local build's, and the client never got the contexts' bytes (the bundle's worker took them from S3)."""
    (tmp_path / "local").mkdir()
    (tmp_path / "remote").mkdir()
    local = doit(tmp_path / "local", TARGET, env={"MNNBUILD_CACHE": str(tmp_path / "local-cache")}, check=True)
    remote_root = tmp_path / "remote"
    proc = doit(remote_root, "-n", "2", TARGET, env=build_env(s3, cluster, "bytes"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(summary(proc)["built"]) == sorted(summary(local)["built"]), proc.stdout
    on = {}
    for origin in (remote_root / "artifacts").rglob("*.origin.json"):
        record = json.loads(origin.read_text())
        if not origin.name.startswith("fetch"):
            on[origin.parent.relative_to(remote_root).as_posix()] = record.get("worker")
    assert set(on.values()) <= set(cluster.workers) and None not in on.values(), on
    bundle = "artifacts/tiny-qwen3/v79/bundle"
    files = {p.relative_to(remote_root / bundle): p for p in (remote_root / bundle).rglob("*") if p.is_file()}
    assert len(files) > 10
    for rel, path in files.items():
        if not rel.name.endswith(".origin.json"):
            assert path.read_bytes() == (tmp_path / "local" / bundle / rel).read_bytes(), rel
    ours = {(e.stage, e.key) for e in ArtifactCache(str(tmp_path / "local-cache")).usage().entries}
    theirs = {(e.stage, e.key) for e in remote(f"s3://{BUCKET}/bytes").usage().entries if e.stage != "fetch"}
    assert ours == theirs
    assert not (remote_root / "artifacts/tiny-qwen3/v79/context/graphllm0/qnn/graphllm0.bin").exists()


def start_io_build(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """`doit io:tiny-qwen3` started on the cluster ``env`` names, artifacts under ``tmp_path``, no local cache."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    full.update({"MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"), "HF_HUB_OFFLINE": "1", "MNNBUILD_CACHE": "off"})
    return subprocess.Popen(
        [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), "io:tiny-qwen3"],
        cwd=tmp_path, env={**full, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_a_task_whose_worker_is_killed_completes_on_the_other(
    tmp_path: Path,
    s3: dict[str, str],  # noqa: F811
    cluster: Loopback,
) -> None:
    """SIGKILL to the worker running io: its task process dies with it, the scheduler gives io to the other worker,
    the build ends well, and the cache holds whole entries only."""
    build = start_io_build(tmp_path, build_env(s3, cluster, "killed"))
    try:
        victim, processes = wait_processing(cluster, "mnnbuild-io:")
        cluster.kill(victim)
        out, _ = build.communicate(timeout=120)
    finally:
        if build.poll() is None:
            build.kill()
            build.wait()
    assert build.returncode == 0, out
    origin = json.loads((tmp_path / "artifacts/tiny-qwen3/io/io.origin.json").read_text())
    assert origin["worker"] in cluster.workers and origin["worker"] != victim
    assert all_gone(processes), "the killed worker's task process outlived it"
    bucket = remote(f"s3://{BUCKET}/killed")
    for entry in bucket.usage().entries:
        assert bucket.restore(entry.stage, entry.key, tmp_path / "check" / entry.stage, link=False) is not None
    cluster.add_worker("w3")  # two workers again for the tests after this one


def test_ctrl_c_cancels_the_task_on_the_cluster(
    tmp_path: Path,
    s3: dict[str, str],  # noqa: F811
    cluster: Loopback,
) -> None:
    """SIGINT to doit while io runs on a worker: the run stops in one line, the scheduler forgets the task and the
    worker's task process is killed."""
    build = start_io_build(tmp_path, build_env(s3, cluster, "interrupted"))
    try:
        worker, _ = wait_processing(cluster, "mnnbuild-io:")
        running = task_processes(cluster, worker)
        build.send_signal(signal.SIGINT)
        out, _ = build.communicate(timeout=60)
    finally:
        if build.poll() is None:
            build.kill()
            build.wait()
    assert build.returncode != 0
    assert "stopped by Ctrl-C" in out and "Traceback" not in out, out
    assert all_gone(running), "the task process still runs"
    deadline = time.monotonic() + 15
    while any(cluster.client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(cluster.client.processing().values())


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory, s3: dict[str, str]) -> Iterator[Loopback]:  # noqa: F811
    """A scheduler of its own, for one odd worker at a time."""
    loop = Loopback(tmp_path_factory.mktemp("odd"), cluster_env(s3))
    try:
        yield loop
    finally:
        loop.stop()


def one_line(proc: subprocess.CompletedProcess[str], needle: str) -> str:
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if needle in line]
    assert len(lines) >= 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return lines[0]


def test_a_worker_whose_code_differs_refuses_in_one_line(
    tmp_path: Path,
    s3: dict[str, str],  # noqa: F811
    odd: Loopback,
) -> None:
    """A worker running another checkout, whose io stage has one more statement: it names the code that differs and
    writes nothing under the client's key."""
    other = copy_project(tmp_path / "other")
    io = other / "mnnbuild/stages/io.py"
    io.write_text(io.read_text() + "\nCHANGED_ON_THIS_WORKER = True\n")
    path = os.pathsep.join([str(other), str(other / "runtime")])
    address = odd.add_worker("differs", {"PYTHONPATH": path})
    try:
        proc = doit(tmp_path, "io:tiny-qwen3", env=build_env(s3, odd, "differs"))
    finally:
        odd.kill(address)
    assert proc.returncode != 0
    line = one_line(proc, "refuses io:tiny-qwen3")
    assert f"worker {address} refuses io:tiny-qwen3: its mnnbuild code of mnnbuild.stages.io" in line, line
    assert not [e for e in remote(f"s3://{BUCKET}/differs").usage().entries if e.stage == "io"]


def test_a_worker_without_the_cache_says_so_in_one_line(
    tmp_path: Path,
    s3: dict[str, str],  # noqa: F811
    odd: Loopback,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    address = odd.add_worker("nocache", {"AWS_ENDPOINT_URL": dead, "AWS_MAX_ATTEMPTS": "1"})
    try:
        proc = doit(tmp_path, "io:tiny-qwen3", env=build_env(s3, odd, "nocache"))
    finally:
        odd.kill(address)
    assert proc.returncode != 0
    line = one_line(proc, "cannot use the shared cache")
    assert f"worker {address} cannot use the shared cache s3://{BUCKET}/nocache: unreachable" in line, line


def test_a_scheduler_that_does_not_answer_stops_the_build_in_one_line(
    tmp_path: Path,
    s3: dict[str, str],  # noqa: F811
) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**build_env(s3, address, "nobody"), "MNNBUILD_SCHEDULER_TIMEOUT": "1"}
    proc = doit(tmp_path, "io:tiny-qwen3", env=env)
    assert proc.returncode != 0
    line = one_line(proc, "does not answer")
    assert f"MNNBUILD_SCHEDULER={address}: the scheduler does not answer within 1 s" in line, line
    assert not (tmp_path / "artifacts/tiny-qwen3/io/io.origin.json").exists()


def test_a_task_bigger_than_every_worker_says_so_in_one_line(
    tmp_path: Path,
    s3: dict[str, str],  # noqa: F811
    odd: Loopback,
) -> None:
    """Workers declare the memory they give tasks (``--resources MEMORY=<GiB>``); a task needs 1 GiB besides its
    stage's own: with only a half-GiB worker, io is not submitted to wait forever but fails in one line."""
    address = odd.add_worker("small", memory=0.5)
    try:
        proc = doit(tmp_path, "io:tiny-qwen3", env=build_env(s3, odd, "small"))
    finally:
        odd.kill(address)
    assert proc.returncode != 0
    line = one_line(proc, "needs 1 GiB")
    assert f"io:tiny-qwen3 needs 1 GiB and the largest worker of {odd.address} declares 0.5 (MEMORY)" in line, line
