"""Two cache tiers at real size: a cold CI runner, warm runners on fresh artifact roots, and verify's own overhead.

A Qwen3-1.7B-shaped model (``--model-dir``, e.g. the 28-layer export) is described by a spec in a temp models dir.
The remote tier is moto's S3 server on 127.0.0.1 (objects above a few MB spill to temp files), reached by s3fs
exactly as a bucket would be; the local tier is a directory beside the artifacts (hard links). One run each:

1. cold: empty local cache and bucket; ``doit verify report`` fills both (bytes stored per tier).
2. verify vs its simulator pass: in the cold root, verify alone again with the cache off (``doit verify:<task>``
   after forgetting it); its wall time over the simulator pass ``verify.json`` records in the same run.
3. warm verify, local tier: a fresh artifact root, the warm local cache: ``doit verify:<task>`` (the entry hits).
4. warm verify, remote tier: a fresh artifact root, an empty local cache, the bucket.
5. warm bundle: a fresh artifact root, the warm local cache: ``doit bundle:<task>``, against copying the bundle dir
   once (``shutil.copytree``, same file system); ``--bundle-rounds N`` runs the two N times, each on a fresh root
   and copy (a busy box), and takes the medians.

Bytes moved per tier are the restored and fetched bytes the origin records of the run's artifact root list; "a full
restore" is what restoring every entry that hit would move (the entries' bytes): what a warm runner moved before.

    flock /tmp/mnnbuild-realsize.lock python benchmarks/bench_cache_tiers.py --model-dir DIR [--arch v79]

Writes ``benchmarks/results/cache_tiers.json`` (under ``--label``, default the model dir's name).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, add_result, print_table  # noqa: E402

from mnnbuild.pipeline.cache import ArtifactCache, CacheEntry  # noqa: E402

BUCKET = "bench"
REMOTE = f"s3://{BUCKET}/cache"


def doit(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *args],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return round(seconds, 2), proc.stdout


def copy_once(src: Path, dest: Path) -> float:
    started = time.perf_counter()
    shutil.copytree(src, dest)
    return round(time.perf_counter() - started, 3)


def origins(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in root.rglob("*.origin.json"):
        try:
            found.append((path.parent, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return found


def moved(root: Path, cache: ArtifactCache) -> dict[str, Any]:
    """Bytes restored and fetched per tier in ``root`` (its origin records), and what restoring every entry that hit
    in full would have moved (the entries' files, from ``cache``)."""
    per_tier: dict[str, int] = {}
    full = 0
    hits = deferred = 0
    for stage_dir, origin in origins(root):
        if origin.get("origin") != "cache":
            continue
        hits += 1
        deferred += bool(origin.get("deferred"))
        tier = str(origin.get("tier"))
        per_tier[tier] = per_tier.get(tier, 0) + int(origin.get("bytes") or 0)
        fetched = origin.get("fetched")
        if isinstance(fetched, dict):
            per_tier[str(fetched.get("tier"))] = per_tier.get(str(fetched.get("tier")), 0) + int(fetched["bytes"])
        stage = next(stage_dir.glob("*.origin.json")).name.removesuffix(".origin.json")
        try:
            entry = CacheEntry.model_validate_json(cache.fs.cat_file(cache._entry(stage, str(origin["key"]))))
            full += sum(f.size for f in entry.files if f.link is None)
        except (OSError, ValueError, KeyError):
            continue
    return {"bytes_by_tier": per_tier, "bytes": sum(per_tier.values()), "full_restore_bytes": full,
            "hits": hits, "without_bytes": deferred}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=os.environ.get("MNNBUILD_BENCH_MODEL"),
                        help="an exported Qwen3-1.7B-shaped model dir (or $MNNBUILD_BENCH_MODEL)")  # fmt: skip
    parser.add_argument("--arch", default="v79")
    parser.add_argument("--work", type=Path, default=None, help="dir for artifacts and caches (default: a temp dir)")
    parser.add_argument("--label", default=None)
    parser.add_argument("--name", default=None, help="the spec's name (default: the model dir's, lower case)")
    parser.add_argument("--skip-verify-alone", action="store_true", help="leave out step 2 (verify alone)")
    parser.add_argument("--bundle-rounds", type=int, default=1, help="step 5's rounds (medians kept)")
    args = parser.parse_args()
    if args.model_dir is None or not (args.model_dir / "llm.mnn").is_file():
        raise SystemExit("--model-dir: expected an exported model dir (llm.mnn, llm.mnn.weight, ...)")
    model_dir = args.model_dir.resolve()
    name = args.name or model_dir.name.lower().replace(".", "-").replace("_", "-")
    task = f"{name}-{args.arch}"
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-cache-tiers-"))
    work.mkdir(parents=True, exist_ok=True)
    models = work / "models"
    models.mkdir(exist_ok=True)
    spec = f'name = "{name}"\nsource = {{ local = "{model_dir}" }}\nchunk_size = 128\ntargets = ["{args.arch}"]\n'
    (models / f"{name}.toml").write_text(spec)

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.setdefault("TMPDIR", str(work))  # moto spills objects to temp files: on the work dir's disk
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server._server.server_address[:2]
    s3 = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "NO_PROXY": "127.0.0.1",
    }
    os.environ.update(s3)
    base = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    base |= {"MNNBUILD_MODELS_PATH": str(models), "MNNBUILD_LOG_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}
    try:
        import s3fs

        s3fs.S3FileSystem().mkdir(BUCKET)

        def env(root: str, local: str | None, remote: bool = True) -> dict[str, str]:
            e = {
                **base,
                "MNNBUILD_ARTIFACTS": str(work / root),
                "MNNBUILD_CACHE": str(work / local) if local else "off",
            }
            return e | ({"MNNBUILD_CACHE_REMOTE": REMOTE} if remote else {})

        result: dict[str, Any] = {"model": model_dir.name, "arch": args.arch}
        local_cache = ArtifactCache(str(work / "cache-a"))

        seconds, out = doit([f"verify:{task}", f"report:{task}"], env("cold", "cache-a"))
        remote_usage = ArtifactCache(REMOTE).usage()
        result["cold"] = {
            "wall_s": seconds,
            "stored_local_bytes": local_cache.usage().total_bytes,
            "stored_remote_bytes": remote_usage.total_bytes,
            "remote_bytes_by_stage": remote_usage.bytes_by_stage(),
            "stage_seconds": {
                f"{d.parent.name}/{d.name}" if d.parent.name in ("context", "twin") else d.name: o.get("seconds")
                for d, o in origins(work / "cold")
                if o.get("origin") == "built"
            },
            "summary": out.split("build summary:")[-1].strip().splitlines()[0],
        }

        if not args.skip_verify_alone:
            verify_dir = work / "cold" / name / args.arch / "verify"
            forget = [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), "forget", f"verify:{task}"]
            subprocess.run(forget, env=env("cold", None, remote=False), check=True, capture_output=True)
            shutil.rmtree(verify_dir)
            seconds, _ = doit([f"verify:{task}"], env("cold", None, remote=False))
            timings = json.loads((verify_dir / "verify.json").read_text())["timings"]
            result["verify"] = {
                "wall_s": seconds,
                "simulator_pass_s": timings.get("bundle_pass"),
                "ratio": round(seconds / timings["bundle_pass"], 2) if timings.get("bundle_pass") else None,
                "timings": timings,
            }

        for label, root, local in (
            ("warm_verify_local", "warm-local", "cache-a"),
            ("warm_verify_remote", "warm-remote", "cache-b"),
        ):
            seconds, out = doit([f"verify:{task}"], env(root, local))
            result[label] = {
                "wall_s": seconds,
                **moved(work / root, local_cache if local == "cache-a" else ArtifactCache(REMOTE)),
            }

        rounds: list[tuple[float, float]] = []
        bundle_dir = work / "warm-bundle" / name / args.arch / "bundle"
        for _ in range(max(args.bundle_rounds, 1)):
            for root in ("warm-bundle", "bundle-copy"):  # the last round's stay: bytes moved are read from its root
                shutil.rmtree(work / root, ignore_errors=True)
            os.sync()  # neither pays for the writeback of the other
            seconds, _ = doit([f"bundle:{task}"], env("warm-bundle", "cache-a"))
            os.sync()
            rounds.append((seconds, copy_once(bundle_dir, work / "bundle-copy")))
        seconds, copy_s = (sorted(r[i] for r in rounds)[len(rounds) // 2] for i in (0, 1))
        result["warm_bundle"] = {
            "wall_s": seconds,
            "copy_s": copy_s,
            "ratio": round(seconds / max(copy_s, 1e-3), 2),
            "rounds": [{"wall_s": w, "copy_s": c} for w, c in rounds],
            "bundle_bytes": sum(p.stat().st_size for p in bundle_dir.rglob("*") if p.is_file()),
            **moved(work / "warm-bundle", local_cache),
        }
    finally:
        server.stop()

    rows = [
        ["cold verify report (fills both tiers)", result["cold"]["wall_s"], "", ""],
        *([["verify alone / its simulator pass", result["verify"]["wall_s"], result["verify"]["simulator_pass_s"],
            result["verify"]["ratio"]]] if "verify" in result else []),
        ["warm verify, local tier (bytes moved)", result["warm_verify_local"]["wall_s"],
         result["warm_verify_local"]["bytes"], result["warm_verify_local"]["full_restore_bytes"]],
        ["warm verify, remote tier (bytes moved)", result["warm_verify_remote"]["wall_s"],
         result["warm_verify_remote"]["bytes"], result["warm_verify_remote"]["full_restore_bytes"]],
        ["warm bundle / copy once", result["warm_bundle"]["wall_s"], result["warm_bundle"]["copy_s"],
         result["warm_bundle"]["ratio"]],
    ]  # fmt: skip
    print_table(["run", "wall s", "vs", "ratio / full-restore bytes"], rows)
    path = add_result("cache_tiers", args.label or model_dir.name, result)
    sys.stdout.write(f"wrote {path}\n")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
