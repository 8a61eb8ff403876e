"""A worker's inputs (`mnnbuild.cluster.task`): its key check takes the digests the restore proved and still hashes a
file changed since, so a changed input cannot pass under the client's key; a task process keeps the upstream dirs it
restored for its next task, and restores one again when the key differs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mnnbuild.base.fsutil import KnownHashes
from mnnbuild.cluster.task import Ref, known_restored, place_input, worker_root
from mnnbuild.pipeline.cache import REMOTE, ArtifactCache, CacheTiers, Tier, cache_key


def test_the_key_check_uses_the_restored_digests_and_hashes_a_changed_file_again(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"weights" * 1000)
    (src / "m.json").write_text("{}")
    key = hashlib.sha256(b"partition").hexdigest()
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store("partition", key, src, link=False)
    tiers = CacheTiers([Tier(REMOTE, cache)])
    scratch = tmp_path / "scratch"
    ref = Ref("partition", key, "m/partition")
    hit = tiers.restore("partition", key, scratch / ref.rel)
    assert hit is not None
    hashes = KnownHashes()
    known_restored(tiers, hit.tier, ref, scratch, hashes)
    restored = scratch / ref.rel / "w.bin"
    assert hashes.sha256(restored) == hashlib.sha256(b"weights" * 1000).hexdigest()
    files = [restored, scratch / ref.rel / "m.json"]
    assert cache_key("context", "{}", files, hashes) == cache_key("context", "{}", files)

    restored.unlink()  # a restored link replaced by other bytes: its stamp moves, so it is hashed, not trusted
    restored.write_bytes(b"changed" * 1000)
    assert hashes.sha256(restored) == hashlib.sha256(b"changed" * 1000).hexdigest()
    assert cache_key("context", "{}", files, hashes) == cache_key("context", "{}", files)


def test_a_task_process_keeps_its_inputs_restored_and_restores_another_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNNBUILD_WORKER_DIR", str(tmp_path / "worker"))
    cache = ArtifactCache(str(tmp_path / "cache"))
    keys = []
    for content in (b"one" * 1000, b"two" * 1000):
        src = tmp_path / content[:3].decode()
        src.mkdir()
        (src / "w.bin").write_bytes(content)
        keys.append(hashlib.sha256(content).hexdigest())
        cache.store("partition", keys[-1], src, link=False)
    tiers = CacheTiers([Tier(REMOTE, cache)])
    root = worker_root()
    first = place_input(tiers, Ref("partition", keys[0], "m/partition"), root)
    assert first == 3000
    assert place_input(tiers, Ref("partition", keys[0], "m/partition"), root) == 0  # kept: not restored again
    assert place_input(tiers, Ref("partition", keys[1], "m/partition"), root) == 3000  # another key: replaced
    assert (root / "m/partition/w.bin").read_bytes() == b"two" * 1000
    assert place_input(tiers, Ref("partition", hashlib.sha256(b"none").hexdigest(), "m/partition"), root) is None
