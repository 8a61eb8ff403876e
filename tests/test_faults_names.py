"""Trust, third round: names read from records (an origin record's cache key, ``npu_postreat.json``'s binaries, a
bundle manifest's model name, a bundle config handed to MNN's engine) never lead a read, write or delete outside
the artifact root, the cache or the bundle; malformed records are one line, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnnbuild.pipeline.cache import ArtifactCache, CacheTiers, Tier
from mnnbuild.pipeline.origin import write_origin


def _cache_with_entry(tmp_path: Path, stage: str = "io") -> ArtifactCache:
    cache = ArtifactCache(str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    cache.store(stage, "k", src)
    return cache


def test_an_origin_records_cache_key_cannot_delete_a_file_outside_the_cache(tmp_path: Path) -> None:
    """A deferred dir's origin record names its cache key, which became ``<cache>/<stage>/<key>.json``: the key
    ``../../victim/notes`` read the user's ``victim/notes.json``, found it no entry and "discarded" it."""
    from mnnbuild.pipeline.deferred import materialize
    from mnnbuild.stages.chain import CHAIN

    cache = _cache_with_entry(tmp_path, "fetch")
    victim = tmp_path / "victim" / "notes.json"
    victim.parent.mkdir()
    victim.write_text('{"mine": true}\n')
    out_dir = tmp_path / "art" / "m" / "model"
    out_dir.mkdir(parents=True)
    write_origin(out_dir, "fetch", {"origin": "cache", "deferred": True, "key": "../../victim/notes"})
    with pytest.raises(Exception):  # noqa: B017,PT011 - what matters: the file is left, and nothing is written
        materialize(CHAIN["fetch"], out_dir, CacheTiers([Tier("local", cache)]))
    assert victim.read_text() == '{"mine": true}\n', "a file outside the cache was deleted"


@pytest.mark.parametrize("key", ["../../victim/notes", "a/b", "/abs"])
def test_a_cache_key_that_is_no_entry_name_is_refused_by_the_cache(tmp_path: Path, key: str) -> None:
    """The cache names an entry ``<stage>/<key>.json``; a key with a ``/`` writes, reads or deletes elsewhere."""
    cache = _cache_with_entry(tmp_path)
    (tmp_path / "victim").mkdir()
    victim = tmp_path / "victim" / "notes.json"
    victim.write_text("not an entry")
    src = tmp_path / "src"
    assert cache.store("io", key, src) == 0
    assert not cache.has("io", key)
    assert cache.restore("io", key, tmp_path / "out") is None
    assert victim.read_text() == "not an entry"
    assert not (tmp_path / "abs.json").exists() and not Path("/abs.json").exists()
