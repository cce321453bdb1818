"""The outputs of every session this node's engines finished, for prompt lookup to draft from
(`engine/core/speculation.py`): one file per tokenizer under `$FLEET_HOME/cache/speculation/`, so the decode and
mixed workers of a node — and a worker started later, or restarted — draft from each other's outputs too (a session
that moved, or the next turn of an agent's conversation, finds what it will repeat there).

The file is token ids (uint32), a finished sequence's output after another, each followed by SEPARATOR; an engine
appends one under a file lock, in one write. It is bounded: past MAX_TOKENS the appender renames it to `.old`
(dropping the one before), so the node keeps between MAX_TOKENS and twice that. Each reader keeps the tokens it has
read and an index of their 3-grams (key: the three ids in one integer) to the position after the latest one, as
sorted numpy arrays (~20 bytes a token, ~40 MB at the bound), the new tokens merged in when the file grew (at most
every REFRESH_S seconds), all again when it was rotated.
"""

import hashlib
import os
import time
from pathlib import Path

import numpy as np
from filelock import FileLock

SEPARATOR = 0xFFFFFFFF
MAX_TOKENS = 1 << 20
REFRESH_S = 1.0
NGRAM = 3  # a match across sessions wants a longer cue than one within a sequence
_BITS = 21  # a token id's bits in a key (vocabularies up to 2M ids)


def outputs_path(home: Path, tokenizer_file: Path) -> Path:
    """The node's outputs file for the models that share this tokenizer."""
    digest = hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()[:16]
    return home / "cache" / "speculation" / f"outputs-{digest}.tokens"


class NodeOutputs:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(f"{path}.lock")
        self._tokens = np.zeros(0, dtype=np.uint32)
        self._keys = np.zeros(0, dtype=np.int64)  # sorted 3-gram keys
        self._after = np.zeros(0, dtype=np.int64)  # per key: the position after its latest occurrence
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file read
        self._offset = 0  # bytes of it read
        self._checked = 0.0
        self._identity_changed = False  # the next read starts the index again
        self.refresh(force=True)

    def record(self, tokens: list[int]) -> None:
        """Append a finished sequence's output (nothing for one of fewer than NGRAM + 1 tokens)."""
        if len(tokens) <= NGRAM:
            return
        data = np.array([*tokens, SEPARATOR], dtype=np.uint32).tobytes()
        with self._lock:
            if self.path.exists() and self.path.stat().st_size // 4 >= MAX_TOKENS:
                os.replace(self.path, self.path.with_suffix(".old"))
            with self.path.open("ab") as out:
                out.write(data)

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest recorded occurrence of `tokens`' last NGRAM, up to the end
        of that output; [] when none was recorded."""
        if len(tokens) < NGRAM or not len(self._keys):
            return []
        key = _key(np.array(tokens[-NGRAM:], dtype=np.int64))
        at = int(np.searchsorted(self._keys, key))
        if at == len(self._keys) or self._keys[at] != key:
            return []
        start = int(self._after[at])
        follow = self._tokens[start:start + limit]
        end = np.flatnonzero(follow == SEPARATOR)
        return follow[:end[0] if len(end) else len(follow)].astype(np.int64).tolist()

    def refresh(self, force: bool = False) -> None:
        """Read what other engines appended (at most every REFRESH_S seconds unless forced)."""
        now = time.monotonic()
        if not force and now - self._checked < REFRESH_S:
            return
        self._checked = now
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return
        identity = (stat.st_dev, stat.st_ino)
        if identity != self._identity or stat.st_size < self._offset:  # rotated: read it all again, .old first
            old = self.path.with_suffix(".old")
            self._tokens = _read(old, 0) if old.exists() else np.zeros(0, dtype=np.uint32)
            self._identity, self._offset, self._identity_changed = identity, 0, True
        if stat.st_size == self._offset and not self._identity_changed:
            return
        new = _read(self.path, self._offset)
        self._offset += new.size * 4
        if self._identity_changed:
            self._keys, self._after = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        start = 0 if self._identity_changed else self._tokens.size
        self._identity_changed = False
        self._tokens = np.concatenate([self._tokens, new])
        self._index(start)

    def _index(self, start: int) -> None:
        """Add the 3-grams followed by a token at `start` or after to the index (a later occurrence replaces an
        earlier one's position): the new keys sorted, merged into the sorted arrays (a copy of them, not a sort)."""
        first = max(0, start - NGRAM)
        tokens = self._tokens[first:].astype(np.int64)
        if tokens.size <= NGRAM:
            return
        grams = np.lib.stride_tricks.sliding_window_view(tokens, NGRAM)[:-1]  # each with a token after it
        valid = ~(grams == SEPARATOR).any(axis=1) & (tokens[NGRAM:] != SEPARATOR)
        keys, after = _key(grams[valid]), np.flatnonzero(valid) + NGRAM + first
        order = np.lexsort((after, keys))  # by key, then position: each key's last row is its latest occurrence
        keys, after = keys[order], after[order]
        last = np.append(keys[1:] != keys[:-1], True)
        keys, after = keys[last], after[last]
        at = np.searchsorted(self._keys, keys)
        known = at < self._keys.size
        known[known] = self._keys[at[known]] == keys[known]
        self._after[at[known]] = after[known]
        self._keys = np.insert(self._keys, at[~known], keys[~known])
        self._after = np.insert(self._after, at[~known], after[~known])


def _key(grams: np.ndarray) -> np.ndarray:
    """[..., NGRAM] int64 token ids -> one int64 key each."""
    key = np.zeros(grams.shape[:-1], dtype=np.int64)
    for i in range(NGRAM):
        key = (key << _BITS) | grams[..., i]
    return key


def _read(path: Path, offset: int) -> np.ndarray:
    """The whole uint32 tokens of `path` from byte `offset` (a partial last token left for the next read)."""
    with path.open("rb") as src:
        src.seek(offset)
        data = src.read()
    return np.frombuffer(data[:len(data) // 4 * 4], dtype=np.uint32).copy()
