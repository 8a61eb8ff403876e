"""The two cache tiers against a real object store: s3fs talking to moto's S3 server on 127.0.0.1, started and
stopped here (a random port, fake credentials, nothing beyond loopback)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from mnnbuild.base.fsutil import sha256_file
from mnnbuild.pipeline.cache import ArtifactCache, CacheEntry
from tests.conftest import PROJECT_ROOT, attach_record, copy_project, doit
from tests.test_cache import guard_env, summary

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

BUCKET = "mnnbuild-ci"
REMOTE = f"s3://{BUCKET}/cache"
STAGES_CACHED = {"io", "partition", "config", "context", "twin", "bundle", "verify", "report"}


def s3_env(endpoint: str) -> dict[str, str]:
    """What a CI runner sets for an S3-compatible store: credentials, region, endpoint (moto accepts any key).
    No shared config or credentials file is read, and loopback bypasses any proxy."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "NO_PROXY": "127.0.0.1",
    }


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """moto's S3 server on a random loopback port for this module, its bucket made; the environment that reaches
    it (also set in this process, for the tests' own ArtifactCache)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server._server.server_address[:2]  # the port the OS picked
    env = s3_env(f"http://{host}:{port}")
    # moto keeps its buckets per process, not per server: a module run before on this worker left its bucket there
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST"), timeout=30)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir(BUCKET)
        try:
            yield env
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            server.stop()


def remote(url: str = REMOTE) -> ArtifactCache:
    cache = ArtifactCache(url)
    cache.fs.invalidate_cache()  # another process wrote there: no listing from before
    return cache


def stage_files(root: Path) -> dict[str, bytes]:
    """Every output file under an artifact root, by path (origin records and doit's state left out)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".origin.json") and not p.name.startswith(".doit")
    }


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory, s3: dict[str, str]) -> tuple[Path, list[str]]:
    """A cold runner: an empty local cache and an empty bucket; `doit` fills both. Returns its dir and the tasks
    built."""
    work = tmp_path_factory.mktemp("cold")
    env = {**s3, "MNNBUILD_CACHE": str(work / "cache"), "MNNBUILD_CACHE_REMOTE": REMOTE}
    proc = doit(work, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = summary(proc)["built"]
    assert "from cache" not in summary(proc)
    assert proc.record["bytes_stored"].get("remote", 0) > 0, proc.record  # type: ignore[attr-defined]
    return work, built


def test_cold_runner_fills_the_bucket(cold: tuple[Path, list[str]]) -> None:
    work, built = cold
    usage = remote().usage()
    assert {e.stage for e in usage.entries} == STAGES_CACHED
    assert len(usage.entries) == len(built) - 1  # all but fetch
    local = ArtifactCache(str(work / "cache")).usage()
    assert {(e.stage, e.key) for e in local.entries} == {(e.stage, e.key) for e in usage.entries}
    assert local.total_bytes == usage.total_bytes > 0
    assert not usage.partial, "no temp object is left"


def test_second_clone_restores_from_the_remote_byte_for_byte(
    tmp_path: Path, s3: dict[str, str], cold: tuple[Path, list[str]]
) -> None:
    """A second runner (another clone, empty local cache, fresh artifact root) restores everything from the bucket
    (no MNN, no QNN work); what it fetches it keeps in its local cache; asked for every output, it has the cold
    build's files byte for byte."""
    work, built = cold
    clone = copy_project(tmp_path / "clone")
    env = {
        **s3,
        **guard_env(tmp_path),
        "MNNBUILD_CACHE": str(tmp_path / "cache"),
        "MNNBUILD_CACHE_REMOTE": REMOTE,
        "MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"),
    }
    proc = doit(tmp_path, env=env, project=clone)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = summary(proc)
    assert sorted(rows["from cache"]) == sorted(set(built) - {"fetch:tiny-qwen3"}), proc.stdout
    assert sorted(rows["from remote"]) == sorted(rows["from cache"])
    origin = json.loads((tmp_path / "artifacts/tiny-qwen3/v79/verify/verify.origin.json").read_text())
    assert origin["tier"] == "remote" and origin["cache"] == REMOTE

    # every output with its files: `cache materialize` of the stages restored without them
    tasks = ["io:tiny-qwen3", "partition:tiny-qwen3", "context:tiny-qwen3-v79", "twin:tiny-qwen3-v79",
             "bundle:tiny-qwen3-v79"]  # fmt: skip
    cli = [sys.executable, "-m", "mnnbuild", "cache", "materialize", *tasks]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    started = time.time()
    got = subprocess.run([*cli, "--project", str(clone)], env={**full_env, **env, "HF_HUB_OFFLINE": "1"},
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    got = attach_record(got, tmp_path / "artifacts", started)
    assert got.returncode == 0, got.stdout + got.stderr
    # what the first run restored without its files comes now, from the remote (it was never in the local tier)
    assert sorted(summary(got)["from remote"]) == sorted(rows["no bytes"]), got.stdout
    restored, first = stage_files(tmp_path / "artifacts"), stage_files(work / "artifacts")
    assert restored.keys() == first.keys() and restored == first
    local = ArtifactCache(str(tmp_path / "cache")).usage()
    assert {e.stage for e in local.entries} == STAGES_CACHED


def test_two_runners_writing_the_same_entries_at_once_stay_consistent(
    tmp_path: Path, s3: dict[str, str], cold: tuple[Path, list[str]]
) -> None:
    """Two processes store every stage dir of the cold build under the same keys into one new prefix at once: each
    entry restores, hash-checked, and no temp name is left."""
    work, _ = cold
    url = f"s3://{BUCKET}/race"
    dirs = [(p.parent, p.name.removesuffix(".origin.json")) for p in (work / "artifacts").rglob("*.origin.json")]
    dirs = [(d, s, json.loads((d / f"{s}.origin.json").read_text())["key"]) for d, s in dirs if s != "fetch"]
    code = (
        "import sys, json, pathlib; from mnnbuild.pipeline.cache import ArtifactCache; c = ArtifactCache(sys.argv[1]);"
        "[c.store(s, k, pathlib.Path(d)) for d, s, k in json.loads(sys.argv[2])]"
    )
    args = [sys.executable, "-c", code, url, json.dumps([(str(d), s, k) for d, s, k in dirs])]
    runners = [subprocess.Popen(args, cwd=PROJECT_ROOT, env=os.environ.copy()) for _ in range(2)]
    assert [r.wait(timeout=300) for r in runners] == [0, 0]
    race = remote(url)
    usage = race.usage()
    assert len(usage.entries) == len(dirs) and not usage.partial
    for d, s, k in dirs:
        out = tmp_path / s / k
        assert race.restore(s, k, out, link=False) is not None
        entry = CacheEntry.model_validate_json(race.fs.cat_file(race._entry(s, k)))
        for f in entry.files:
            assert sha256_file(out / f.path) == f.sha256 == sha256_file(d / f.path)


KILL_AFTER_SECOND_BLOB = """
import os, pathlib, signal, sys
from mnnbuild.pipeline.cache import ArtifactCache
put = ArtifactCache._put_atomic
done = []
def dying_put(self, local, data, dest):
    put(self, local, data, dest)
    done.append(dest)
    if len(done) == 2:  # the marker, then one blob: killed with more blobs and the entry to go
        os.kill(os.getpid(), signal.SIGKILL)
ArtifactCache._put_atomic = dying_put
ArtifactCache(sys.argv[1]).store("stage", "k", pathlib.Path(sys.argv[2]))
"""

KILL_BEFORE_ENTRY = """
import os, pathlib, signal, sys
from mnnbuild.pipeline.cache import ArtifactCache
cache = ArtifactCache(sys.argv[1])
assert cache.atomic_put, "an object store: written in place, no rename"
pipe = cache.fs.pipe_file
def dying_pipe(path, data, **kw):
    if path.endswith(".json"):  # every blob is up; killed as the entry's upload starts
        os.kill(os.getpid(), signal.SIGKILL)
    return pipe(path, data, **kw)
cache.fs.pipe_file = dying_pipe
cache.store("stage", "k", pathlib.Path(sys.argv[2]))
"""


@pytest.mark.parametrize("script", [KILL_AFTER_SECOND_BLOB, KILL_BEFORE_ENTRY], ids=["blobs", "entry"])
def test_a_killed_upload_leaves_no_entry_that_looks_complete(tmp_path: Path, s3: dict[str, str], script: str) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for n in range(4):
        (src / "sub" / f"{n}.bin").write_bytes(os.urandom(256 << 10))
    url = f"s3://{BUCKET}/killed-{len(script)}"
    proc = subprocess.run([sys.executable, "-c", script, url, str(src)], cwd=PROJECT_ROOT, capture_output=True)
    assert proc.returncode == -9, proc.stderr
    cache = remote(url)
    assert not cache.has("stage", "k")
    assert cache.restore("stage", "k", tmp_path / "out") is None and not (tmp_path / "out").exists()
    usage = cache.usage()
    assert usage.entries == [] and not cache.fs.exists(cache._entry("stage", "k"))
    # the next runner stores it whole (uploading only the blobs the dead writer did not); a dead writer's temp
    # object, on a store that has them, goes with the next prune past its age
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert cache.store("stage", "k", src) == total - usage.total_bytes
    assert cache.restore("stage", "k", tmp_path / "out") is not None
    assert cache.sweep_partial(max_age=-1) == sum(size for size, _ in usage.partial.values())
    assert not remote(url).usage().partial


def test_a_corrupted_remote_blob_is_discarded_and_rebuilt(
    tmp_path: Path, s3: dict[str, str], cold: tuple[Path, list[str]]
) -> None:
    """A blob in the bucket whose bytes changed (same size): a runner with an empty local cache asks for io, finds
    the mismatch, discards the entry, rebuilds io byte for byte and stores a good entry again."""
    work, _ = cold
    key = json.loads((work / "artifacts/tiny-qwen3/io/io.origin.json").read_text())["key"]
    bucket = remote()
    entry = CacheEntry.model_validate_json(bucket.fs.cat_file(bucket._entry("io", key)))
    target = next(f for f in entry.files if f.path.endswith("output.mnn"))
    good = bucket.fs.cat_file(bucket._blob(target.sha256))
    bucket.fs.pipe_file(bucket._blob(target.sha256), bytes(b ^ 0xFF for b in good[:64]) + good[64:])
    env = {
        **s3,
        "MNNBUILD_CACHE": str(tmp_path / "cache"),
        "MNNBUILD_CACHE_REMOTE": REMOTE,
        "MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"),
    }
    proc = doit(tmp_path, "io:tiny-qwen3", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc)["built"] == ["fetch:tiny-qwen3", "io:tiny-qwen3"], proc.stdout
    assert "does not match its sha256; entry discarded" in proc.stderr
    assert (tmp_path / "artifacts" / "tiny-qwen3/io" / target.path).read_bytes() == good
    again = remote()
    assert again.has("io", key) and again.fs.cat_file(again._blob(target.sha256)) == good


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_remote_degrades_to_the_local_tier_with_one_warning(tmp_path: Path) -> None:
    env = {
        **s3_env(f"http://127.0.0.1:{closed_port()}"),
        "AWS_MAX_ATTEMPTS": "1",  # botocore's retries: what a CI would set to fail fast
        "MNNBUILD_CACHE": str(tmp_path / "cache"),
        "MNNBUILD_CACHE_REMOTE": REMOTE,
        "MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"),
    }
    proc = doit(tmp_path, "io:tiny-qwen3", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "remote" in line.lower()]
    assert len(warnings) == 1 and "unreachable" in warnings[0], proc.stderr
    assert "building with the local tier only" in warnings[0]
    assert {e.stage for e in ArtifactCache(str(tmp_path / "cache")).usage().entries} == {"io"}


def test_a_read_only_runner_restores_from_the_remote_and_writes_nothing_there(
    tmp_path: Path, s3: dict[str, str], cold: tuple[Path, list[str]]
) -> None:
    """A fork's pull request: MNNBUILD_CACHE_REMOTE_READONLY=1. Its io is restored from the bucket; the config it
    must build (another chunk limit) goes to its local cache only."""
    clone = copy_project(tmp_path / "clone")
    spec = clone / "models" / "tiny-qwen3.toml"
    spec.write_text(spec.read_text().replace('targets = ["v79"]', 'targets = ["v79", "v75"]'))
    before = {(e.stage, e.key) for e in remote().usage().entries}
    env = {
        **s3,
        "MNNBUILD_CACHE": str(tmp_path / "cache"),
        "MNNBUILD_CACHE_REMOTE": REMOTE,
        "MNNBUILD_CACHE_REMOTE_READONLY": "1",
        "MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"),
    }
    proc = doit(tmp_path, "io:tiny-qwen3", "config:tiny-qwen3-v75", env=env, project=clone)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = summary(proc)
    assert rows["from remote"] == ["io:tiny-qwen3"] and "config:tiny-qwen3-v75" in rows["built"], proc.stdout
    assert {(e.stage, e.key) for e in remote().usage().entries} == before
    local = {e.stage for e in ArtifactCache(str(tmp_path / "cache")).usage().entries}
    assert local == {"io", "config"}


def mnnbuild_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    return subprocess.run([sys.executable, "-m", "mnnbuild", *args], env={**full, **env}, capture_output=True,
                          text=True, cwd=PROJECT_ROOT, timeout=300)  # fmt: skip


def test_cache_info_and_prune_on_the_remote(tmp_path: Path, s3: dict[str, str], cold: tuple[Path, list[str]]) -> None:
    """`cache info --remote` shows the bucket's entries and cost by stage; `prune` works there, on a proven cache
    and its own names only, and not from a read-only runner."""
    info = mnnbuild_cli("cache", "info", "--remote", env={**s3, "MNNBUILD_CACHE_REMOTE": REMOTE})
    assert info.returncode == 0, info.stderr
    assert info.stdout.startswith(f"{REMOTE}: ") and "twin 4" in info.stdout and "context 4" in info.stdout
    assert any(line.split()[0] == "twin" and "entries" in line for line in info.stdout.splitlines()[1:])

    src = tmp_path / "src"
    src.mkdir()
    (src / "data.bin").write_bytes(os.urandom(4096))
    url = f"s3://{BUCKET}/prune"
    ArtifactCache(url).store("io", "k", src)
    remote(url).fs.pipe_file(f"{BUCKET}/prune/notes.txt", b"someone's file")
    env = {**s3, "MNNBUILD_CACHE_REMOTE": url}
    refused = mnnbuild_cli(
        "cache", "prune", "--remote", "--max-size", "1", env={**env, "MNNBUILD_CACHE_REMOTE_READONLY": "1"}
    )
    assert refused.returncode == 2 and "does not prune" in refused.stderr and remote(url).has("io", "k")
    pruned = mnnbuild_cli("cache", "prune", "--remote", "--max-size", "1", env=env)
    assert pruned.returncode == 0, pruned.stderr
    assert "removed 1 entries" in pruned.stdout
    left = remote(url)
    assert not left.has("io", "k") and left.fs.cat_file(f"{BUCKET}/prune/notes.txt") == b"someone's file"

    # a prefix that is no mnnbuild cache (no marker, a foreign object): nothing pruned, one line
    remote(url).fs.rm(f"{BUCKET}/prune/CACHEDIR.TAG")
    foreign = mnnbuild_cli("cache", "prune", "--url", url, "--max-size", "1", env=s3)
    assert foreign.returncode == 2 and "not an mnnbuild cache" in foreign.stderr
    assert len(foreign.stderr.strip().splitlines()) == 1, foreign.stderr


def prefix_copy(name: str) -> str:
    """A copy of the cold runner's bucket prefix (what each case below damages), as its URL."""
    cache = remote()
    dest = f"{BUCKET}/{name}"
    for path in cache.fs.find(f"{BUCKET}/cache"):
        cache.fs.copy(path, dest + path[len(f"{BUCKET}/cache") :])
    return f"s3://{dest}"


def warnings_of(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The warning lines a doit run printed (mnnbuild's log lines of level WARNING and above)."""
    return [line for line in proc.stderr.splitlines() if line.startswith(("W ", "E ", "WARNING", "ERROR"))]


def flip_blob(url: str, stage: str, key: str, path: str) -> tuple[str, bytes]:
    """Change one byte (not the size) of the blob behind ``path`` in the entry ``stage``/``key`` of the remote
    ``url``; returns the blob's sha256 and its good bytes."""
    cache = remote(url)
    entry = CacheEntry.model_validate_json(cache.fs.cat_file(cache._entry(stage, key)))
    sha = next(f.sha256 for f in entry.files if f.path == path)
    good = cache.fs.cat_file(cache._blob(sha))
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    cache.fs.pipe_file(cache._blob(sha), bytes(bad))
    return sha, good


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "read-only"])
def test_a_bad_remote_blob_a_task_needs_is_built_again_in_the_same_run(
    tmp_path: Path, s3: dict[str, str], cold: tuple[Path, list[str]], readonly: bool
) -> None:
    """The blob behind the context entry's ``qnn/graphllm1.bin`` changed in the bucket (one byte). A runner with an
    empty local cache asks for the bundle: its entry (whose binaries are the context blobs) is refused, the bundle
    builds, its context dir, restored without its files, cannot be fetched whole, so the context stage builds it
    again in the same run: one warning, exit 0, the cold build's bundle byte for byte. A writable remote gets the
    good blob back; a read-only one is left as it was, and neither this run's root nor a fresh one fails later."""
    work, _ = cold
    url = prefix_copy(f"bad-{'ro' if readonly else 'rw'}")
    key = json.loads((work / "artifacts/tiny-qwen3/v79/context/graphllm1/context.origin.json").read_text())["key"]
    sha, good = flip_blob(url, "context", key, "qnn/graphllm1.bin")
    before = {p: remote(url).fs.cat_file(p) for p in remote(url).fs.find(url)}
    env = {
        **s3,
        "MNNBUILD_CACHE": str(tmp_path / "cache"),
        "MNNBUILD_CACHE_REMOTE": url,
        "MNNBUILD_CACHE_REMOTE_READONLY": "1" if readonly else "0",
        "MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"),
    }
    proc = doit(tmp_path, "bundle:tiny-qwen3-v79", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(warnings_of(proc)) == 1 and "does not match its sha256" in warnings_of(proc)[0], proc.stderr
    ctx = tmp_path / "artifacts/tiny-qwen3/v79/context/graphllm1"
    assert json.loads((ctx / "context.origin.json").read_text())["origin"] == "built"
    assert (ctx / "qnn/graphllm1.bin").read_bytes() == good
    bundle, first = tmp_path / "artifacts/tiny-qwen3/v79/bundle", work / "artifacts/tiny-qwen3/v79/bundle"
    shipped = [p.relative_to(first) for p in first.rglob("*") if p.is_file() and "origin" not in p.name]
    assert all((bundle / rel).read_bytes() == (first / rel).read_bytes() for rel in shipped)
    after = remote(url)
    if readonly:
        assert {p: after.fs.cat_file(p) for p in after.fs.find(url)} == before, "a read-only remote is not written"
    else:
        assert after.fs.cat_file(after._blob(sha)) == good, "the rebuild stored the good blob again"
    again = doit(tmp_path, "bundle:tiny-qwen3-v79", env=env)
    assert again.returncode == 0 and not warnings_of(again), again.stdout + again.stderr
    assert not again.record["built"] and not again.record["from_cache"], again.stdout  # type: ignore[attr-defined]
    fresh = doit(tmp_path, "bundle:tiny-qwen3-v79", env={**env, "MNNBUILD_ARTIFACTS": str(tmp_path / "fresh")})
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr


def test_a_remote_killed_mid_build_is_one_warning_and_the_build_goes_on(
    tmp_path: Path, s3: dict[str, str], cold: tuple[Path, list[str]]
) -> None:
    """The remote (its own moto process, filled from the cold runner's prefix) is killed with SIGKILL once the run
    restored io's manifest: what was restored without its files from it is built again, the rest restores from
    nothing or builds; one warning, exit 0, the cold build's bundle."""
    work, _ = cold
    port = closed_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        import s3fs

        other = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
        for _ in range(100):
            try:
                other.mkdir(BUCKET)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.1)
        source = remote()
        for path in source.fs.find(f"{BUCKET}/cache"):
            other.pipe_file(path, source.fs.cat_file(path))
        env = {
            **s3,
            **s3_env(endpoint),
            "AWS_MAX_ATTEMPTS": "1",
            "MNNBUILD_CACHE": str(tmp_path / "cache"),
            "MNNBUILD_CACHE_REMOTE": REMOTE,
            "MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"),
        }
        full = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
        started = time.time()
        build = subprocess.Popen(
            [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), "bundle:tiny-qwen3-v79"],
            cwd=tmp_path, env={**full, "HF_HUB_OFFLINE": "1", **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        io_manifest = tmp_path / "artifacts/tiny-qwen3/io/io.manifest.json"
        while not io_manifest.exists() and build.poll() is None:
            time.sleep(0.002)
        server.kill()
        assert build.poll() is None, "the run ended before the remote could be killed"
        out, err = build.communicate(timeout=600)
    finally:
        server.kill()
        server.wait()
    proc = attach_record(subprocess.CompletedProcess(build.args, build.returncode, out, err), tmp_path / "artifacts",
                         started)  # fmt: skip
    assert proc.returncode == 0, out + err
    assert len(warnings_of(proc)) == 1 and "stopped answering" in warnings_of(proc)[0], err
    bundle, first = tmp_path / "artifacts/tiny-qwen3/v79/bundle", work / "artifacts/tiny-qwen3/v79/bundle"
    shipped = [p.relative_to(first) for p in first.rglob("*") if p.is_file() and "origin" not in p.name]
    assert all((bundle / rel).read_bytes() == (first / rel).read_bytes() for rel in shipped)
    again = doit(tmp_path, "bundle:tiny-qwen3-v79", env={**env, "MNNBUILD_CACHE_REMOTE": "off"})
    assert again.returncode == 0 and not again.record["built"], again.stdout + again.stderr  # type: ignore[attr-defined]
