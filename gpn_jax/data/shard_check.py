"""Token shards verified by content on every load: each shard's sha256 and largest id, read in
one pass (shards in parallel threads; hashlib and numpy release the GIL on large buffers).

The digests key the unigram-count cache (a shard rewritten with the same size and mtime is a
new key, so nothing cached for the old bytes is reused), the largest ids are checked against
the vocabulary, and a prepared corpus's train and held-out shards are proven disjoint: no
file in both (by resolved path and by inode) and no held-out shard's bytes among the train
shards'.
"""

import concurrent.futures
import dataclasses
import hashlib
import os

import numpy as np

from gpn_jax.io.untrusted import bad_file

_CHUNK_TOKENS = 1 << 24


@dataclasses.dataclass(frozen=True)
class ShardScan:
    """What one pass over a shard found."""

    path: str
    sha256: str
    tokens: int
    max_id: int  # -1 for an empty shard


def scan_shard(path: str, array) -> ShardScan:
    """The sha256 of `array`'s bytes (a shard's memory map) and its largest id."""
    h, top = hashlib.sha256(), -1
    for lo in range(0, len(array), _CHUNK_TOKENS):
        part = np.ascontiguousarray(array[lo : lo + _CHUNK_TOKENS])
        h.update(memoryview(part).cast("B"))
        top = max(top, int(part.max()))
    return ShardScan(path, h.hexdigest(), len(array), top)


def scan_shards(paths: list[str], arrays: list) -> list[ShardScan]:
    """`scan_shard` of every shard, several at once."""
    if len(paths) <= 1:
        return [scan_shard(p, a) for p, a in zip(paths, arrays, strict=True)]
    workers = min(len(paths), os.cpu_count() or 1, 8)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(scan_shard, paths, arrays))


def check_ids(scans: list[ShardScan], vocab_size: int) -> None:
    """ValueError naming the first shard holding an id >= `vocab_size`."""
    for s in scans:
        if s.max_id >= vocab_size:
            raise ValueError(
                f"{s.path}: token id {s.max_id} >= vocab_size {vocab_size}; vocab_size must "
                "exceed the largest token id (or the shard is not of this vocabulary)"
            )


def digest_key(scans: list[ShardScan], *extra) -> str:
    """A cache key naming these shards' bytes (in order) and `extra`."""
    parts = [(s.sha256, s.tokens) for s in scans]
    return hashlib.sha256(repr((parts, extra)).encode()).hexdigest()[:20]


def check_disjoint(manifest: str, train: list[ShardScan], heldout: list[ShardScan]) -> None:
    """A one-line error if a held-out shard is also a train shard: the same file (resolved
    path or inode) or the same bytes (empty shards aside)."""
    fix = "a shard belongs to one split only; re-run gpn-prepare into a new --output"

    def identity(path: str):
        st = os.stat(path)
        return st.st_dev, st.st_ino

    files = {os.path.realpath(s.path): s for s in train}
    inodes = {identity(s.path): s for s in train}
    digests = {s.sha256: s for s in train if s.tokens}
    for h in heldout:
        same = files.get(os.path.realpath(h.path)) or inodes.get(identity(h.path))
        how = "the same file as"
        if same is None and h.tokens and h.sha256 in digests:
            same, how = digests[h.sha256], "the same bytes as"
        if same is not None:
            raise bad_file(
                manifest, f"held-out shard {h.path} is {how} train shard {same.path}", fix
            )
