"""Where a download comes from, and how an extracted tree is checked before it is used.

A file has an ordered list of sources: its original URL first, then mirrors, among them
Hugging Face Hub dataset repositories pinned to a revision (`HubSource`, whose URL
`huggingface_hub` builds; `$HF_ENDPOINT` chooses another endpoint). They are tried in
turn; each failure is one logged line and the next source is tried.

A tree is described by its file count and the SHA-256 of its sorted relative paths and
sizes (`TreeDigest`). `install` builds a dataset's tree in a temporary folder beside its
destination, verifies it there (against a recorded digest where one is known, and the
dataset's own layout check), records its manifest under `<data_dir>/.domaingen/` and only
then renames it into place: a partial or different tree is refused in one line and
nothing half-extracted is left behind. `check_installed` compares a tree with its
recorded manifest and names the first path that differs.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from domaingen.errors import DomaingenError

log = logging.getLogger(__name__)

RECORDS_DIR = ".domaingen"


@dataclass(frozen=True)
class UrlSource:
    """A plain HTTP(S) or file URL."""

    address: str

    def url(self) -> str:
        return self.address

    def describe(self) -> str:
        return self.address

    def headers(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class HubSource:
    """A file of a Hugging Face Hub dataset repository at a pinned revision (a commit hash)."""

    repo_id: str
    filename: str
    revision: str

    def url(self) -> str:
        try:
            from huggingface_hub import constants, hf_hub_url
        except ImportError:
            raise DomaingenError("the Hugging Face mirror needs huggingface_hub: pip install huggingface_hub") from None
        return hf_hub_url(self.repo_id, self.filename, repo_type="dataset", revision=self.revision,
                          endpoint=os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)

    def describe(self) -> str:
        return f"huggingface.co/datasets/{self.repo_id} {self.filename} @ {self.revision[:12]}"

    def headers(self) -> dict[str, str]:
        try:  # a token, where the user has one (gated mirrors)
            from huggingface_hub.utils import build_hf_headers

            return {k: v for k, v in build_hf_headers().items() if k.lower() == "authorization"}
        except Exception:  # noqa: BLE001 (no token or no library: anonymous access)
            return {}


Source = UrlSource | HubSource


@dataclass(frozen=True)
class TreeDigest:
    """A tree's file count and the SHA-256 of its sorted (relative path, size) lines."""

    files: int
    sha256: str


def tree_entries(root: Path) -> list[tuple[str, int]]:
    """(relative POSIX path, size in bytes) of every file under `root`, sorted by path."""
    entries = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            entries.append((path.relative_to(root).as_posix(), path.stat().st_size))
    return sorted(entries)


def digest_of(entries: Sequence[tuple[str, int]]) -> TreeDigest:
    """The TreeDigest of sorted entries: SHA-256 over one 'path<TAB>size<LF>' line per file."""
    sha = hashlib.sha256()
    for path, size in entries:
        sha.update(f"{path}\t{size}\n".encode())
    return TreeDigest(len(entries), sha.hexdigest())


def first_difference(found: Sequence[tuple[str, int]], expected: Sequence[tuple[str, int]]) -> str:
    """The first entry, in path order, where two sorted manifests differ, in words."""
    have, want = dict(found), dict(expected)
    for path in sorted(set(have) | set(want)):
        if path not in have:
            return f"{path} is missing"
        if path not in want:
            return f"{path} is not in the record"
        if have[path] != want[path]:
            return f"{path} has {have[path]} bytes, not {want[path]}"
    return "no difference"


def check_digest(root: Path, expected: TreeDigest, what: str) -> list[tuple[str, int]]:
    """The entries of `root`, after checking them against `expected`; a mismatch is one line naming its first part."""
    entries = tree_entries(root)
    found = digest_of(entries)
    if found.files != expected.files:
        raise DomaingenError(f"{what} is not the expected tree: it holds {found.files} files, not {expected.files}; "
                             "it was not installed (try another source, or delete the download and rerun)")
    if found.sha256 != expected.sha256:
        raise DomaingenError(f"{what} is not the expected tree: its paths and sizes hash to {found.sha256[:16]}..., "
                             f"not {expected.sha256[:16]}...; it was not installed (try another source)")
    return entries


def record_path(data_dir: Path, name: str) -> Path:
    return data_dir / RECORDS_DIR / f"{name}.tree.json.gz"


def write_record(data_dir: Path, name: str, entries: Sequence[tuple[str, int]]) -> None:
    """Store a tree's manifest so that later checks can name what changed."""
    path = record_path(data_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = digest_of(entries)
    body = {"files": digest.files, "sha256": digest.sha256, "entries": [list(e) for e in entries]}
    with gzip.open(path, "wt") as handle:
        json.dump(body, handle)


def read_record(data_dir: Path, name: str) -> list[tuple[str, int]] | None:
    path = record_path(data_dir, name)
    if not path.is_file():
        return None
    with gzip.open(path, "rt") as handle:
        return [(p, int(s)) for p, s in json.load(handle)["entries"]]


def check_installed(data_dir: Path, name: str, target: Path) -> str:
    """'verified' when `target` matches its recorded manifest; else what differs, first mismatch named."""
    if not target.exists():
        return "absent"
    recorded = read_record(data_dir, name)
    if recorded is None:
        return "present, not verified (installed without a record)"
    found = tree_entries(target)
    if found == recorded:
        return f"present, verified ({len(found)} files)"
    return f"present, DIFFERS from its record: {first_difference(found, recorded)}"


def install(data_dir: Path, name: str, target: Path, build: Callable[[Path], Path],
            expected: TreeDigest | None = None, check: Callable[[Path], None] | None = None) -> list[tuple[str, int]]:
    """Build a tree with `build(staging)` (which returns the folder holding it), verify it, record it and
    rename it to `target`. Any failure removes the staging folder, so nothing half-built remains."""
    data_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", suffix=".partial", dir=target.parent))
    try:
        tree = build(staging)
        entries = check_digest(tree, expected, f"the extracted {name}") if expected else tree_entries(tree)
        if check is not None:
            check(tree)
        target.parent.mkdir(parents=True, exist_ok=True)
        tree.rename(target)
        write_record(data_dir, name, entries)
        return entries
    finally:
        shutil.rmtree(staging, ignore_errors=True)
