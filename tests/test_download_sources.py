"""Download sources tried in turn, verified trees, resume, and `download --list`, against a local HTTP server
standing in for an original URL and a Hugging Face Hub mirror (no network)."""

from __future__ import annotations

import http.server
import logging
import socket
import tarfile
import threading
from pathlib import Path

import pytest

from domaingen.cli.main import main
from domaingen.datasets import DATASETS
from domaingen.datasets import download as dl
from domaingen.datasets.sources import HubSource, TreeDigest, UrlSource, digest_of, tree_entries
from imagetree import make_spawrious_tree, use_archive

SMALL = {"featurizer": "MLP", "pretrained": False, "image_size": 8, "batch_size": 4, "num_workers": 0}
REPO, REVISION = "someone/spawrious-mirror", "0123456789abcdef0123456789abcdef01234567"


class Files(http.server.BaseHTTPRequestHandler):
    """Serves `files` (path -> bytes), honours 'Range: bytes=N-', and sends only the first `cut[path]`
    bytes of a file (announcing all of them) to stand in for a dropped connection."""

    files: dict[str, bytes] = {}
    cut: dict[str, int] = {}
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802 (the http.server API)
        header = self.headers.get("Range")
        type(self).seen.append((self.path, header))
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        start = int(header.removeprefix("bytes=").split("-")[0]) if header else 0
        self.send_response(206 if header else 200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        limit = self.cut.pop(self.path, None)
        self.wfile.write(body[start:limit] if limit is not None else body[start:])

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch):
    Files.files, Files.cut, Files.seen = {}, {}, []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_port}"
    monkeypatch.setenv("HF_ENDPOINT", url)  # the Hub mirror is this server too
    yield url
    httpd.shutdown()
    httpd.server_close()


def dead_url(name: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"  # nothing listens there any more: connection refused


@pytest.fixture(scope="module")
def spawrious_tarball(tmp_path_factory):
    """(tarball bytes, the tree's digest) of a generated spawrious224/ tree, packed as the published tarball."""
    src = tmp_path_factory.mktemp("src")
    root = make_spawrious_tree(src, per_group=1)
    with tarfile.open(src / "s.tar.gz", "w:gz") as tar:
        tar.add(root, arcname="spawrious224")
    return (src / "s.tar.gz").read_bytes(), digest_of(tree_entries(root))


def hub_path(filename: str) -> str:
    return f"/datasets/{REPO}/resolve/{REVISION}/{filename}"


def leftovers(data_dir: Path) -> list[str]:
    """Whatever a refused download left in data_dir besides the (empty) downloads folder."""
    return sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.name != "downloads")


def test_the_hub_url_is_pinned_to_the_revision(server):
    assert HubSource(REPO, "a.tar.gz", REVISION).url() == f"{server}{hub_path('a.tar.gz')}"


def test_a_dead_first_source_falls_through_to_the_hub_mirror(server, spawrious_tarball, tmp_path, caplog, capsys):
    data, digest = spawrious_tarball
    Files.files[hub_path("spawrious224.tar.gz")] = data
    use_archive(monkeypatch := pytest.MonkeyPatch(), "spawrious",
                dl.Archive(dead_url("spawrious224.tar.gz"), "spawrious224.tar.gz",
                           mirrors=(HubSource(REPO, "spawrious224.tar.gz", REVISION),)))
    try:
        with caplog.at_level(logging.WARNING, logger="domaingen.datasets.download"):
            assert main(["-q", "download", "--dataset", "spawrious", "--data_dir", str(tmp_path)]) == 0
    finally:
        monkeypatch.undo()
    notes = [r.getMessage() for r in caplog.records if r.name == "domaingen.datasets.download"]
    assert len(notes) == 1 and notes[0].startswith("source 1 of 2 for spawrious224.tar.gz failed (http://127.0.0.1:")
    assert "\n" not in notes[0]
    assert Files.seen == [(hub_path("spawrious224.tar.gz"), None)]
    assert digest_of(tree_entries(tmp_path / "spawrious224")) == digest
    dataset = DATASETS.get("SpawriousO2O_easy")(str(tmp_path), [0], SMALL)
    assert [len(env) for env in dataset.environments] == [8, 8, 8]  # one image per group
    assert list((tmp_path / "downloads").iterdir()) == []
    capsys.readouterr()
    assert main(["download", "--list", "--data_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"spawrious (SpawriousO2O_*, SpawriousM2M_*): present, verified ({digest.files} files)" in out
    assert "pacs (PACS): absent" in out
    assert "  source 1: https://www.dropbox.com/s/e40j553480h3f3s/spawrious224.tar.gz?dl=1" in out


def test_a_corrupt_archive_is_refused_and_the_next_source_used(server, spawrious_tarball, tmp_path, monkeypatch):
    data, digest = spawrious_tarball
    Files.files["/bad.tar.gz"] = data[: len(data) // 2]  # a truncated gzip stream
    Files.files["/good.tar.gz"] = data
    use_archive(monkeypatch, "spawrious", dl.Archive(f"{server}/bad.tar.gz", "spawrious224.tar.gz",
                                                     mirrors=(UrlSource(f"{server}/good.tar.gz"),)))
    assert dl.download("spawrious", str(tmp_path)) == f"SpawriousO2O_*, SpawriousM2M_* is in {tmp_path / 'spawrious224'}"
    assert digest_of(tree_entries(tmp_path / "spawrious224")) == digest


def test_a_corrupt_archive_alone_is_one_line_and_leaves_nothing(server, spawrious_tarball, tmp_path, monkeypatch, capsys):
    data, _ = spawrious_tarball
    Files.files["/bad.tar.gz"] = data[: len(data) // 2]
    use_archive(monkeypatch, "spawrious", dl.Archive(f"{server}/bad.tar.gz", "spawrious224.tar.gz"))
    assert main(["-q", "download", "--dataset", "spawrious", "--data_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("domaingen: error: ")
    assert leftovers(tmp_path) == []  # no archive, no half-extracted tree, no record


def test_a_different_tree_is_refused_naming_the_first_mismatch(server, spawrious_tarball, tmp_path, monkeypatch, capsys):
    data, digest = spawrious_tarball
    Files.files["/s.tar.gz"] = data
    spec = dl.DOWNLOADS["spawrious"]
    from dataclasses import replace

    monkeypatch.setitem(dl.DOWNLOADS, "spawrious", replace(
        spec, archives=(dl.Archive(f"{server}/s.tar.gz", "s.tar.gz"),), tree=TreeDigest(digest.files + 1, digest.sha256)))
    assert main(["-q", "download", "--dataset", "spawrious", "--data_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"domaingen: error: the extracted spawrious is not the expected tree: it holds {digest.files} files, "
                   f"not {digest.files + 1}; it was not installed (try another source, or delete the download and rerun)"]
    assert leftovers(tmp_path) == []
    # the right count but other contents: the hash of paths and sizes differs
    monkeypatch.setitem(dl.DOWNLOADS, "spawrious", replace(
        spec, archives=(dl.Archive(f"{server}/s.tar.gz", "s.tar.gz"),), tree=TreeDigest(digest.files, "0" * 64)))
    assert main(["-q", "download", "--dataset", "spawrious", "--data_dir", str(tmp_path)]) == 2
    assert f"its paths and sizes hash to {digest.sha256[:16]}..., not {'0' * 16}..." in capsys.readouterr().err
    # the recorded digest: installed
    monkeypatch.setitem(dl.DOWNLOADS, "spawrious", replace(
        spec, archives=(dl.Archive(f"{server}/s.tar.gz", "s.tar.gz"),), tree=digest))
    assert main(["-q", "download", "--dataset", "spawrious", "--data_dir", str(tmp_path)]) == 0


def test_an_installed_tree_that_changed_is_listed_with_its_first_mismatch(server, spawrious_tarball, tmp_path,
                                                                          monkeypatch, capsys):
    data, _ = spawrious_tarball
    Files.files["/s.tar.gz"] = data
    use_archive(monkeypatch, "spawrious", dl.Archive(f"{server}/s.tar.gz", "s.tar.gz"))
    dl.download("spawrious", str(tmp_path))
    root = tmp_path / "spawrious224"
    first, second = sorted(p for p in root.rglob("*") if p.is_file())[:2]
    second.unlink()
    first.write_bytes(first.read_bytes() + b"x")
    rows = {row[0]: row for row in dl.listing(str(tmp_path))}
    size = first.stat().st_size
    assert rows["spawrious"][5] == (f"present, DIFFERS from its record: {first.relative_to(root).as_posix()} has "
                                    f"{size} bytes, not {size - 1}")
    assert dl.download("spawrious", str(tmp_path)).endswith("DIFFERS from its record: "
                                                            f"{first.relative_to(root).as_posix()} has {size} bytes, not {size - 1}")


def test_an_interrupted_download_is_resumed(server, spawrious_tarball, tmp_path, monkeypatch, capsys):
    data, digest = spawrious_tarball
    half = len(data) // 2
    Files.files["/s.tar.gz"], Files.cut["/s.tar.gz"] = data, half
    use_archive(monkeypatch, "spawrious", dl.Archive(f"{server}/s.tar.gz", "spawrious224.tar.gz"))
    assert main(["-q", "download", "--dataset", "spawrious", "--data_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"domaingen: error: cannot download {server}/s.tar.gz (")
    part = tmp_path / "downloads" / "spawrious224.tar.gz.part"
    assert part.read_bytes() == data[:half]
    assert main(["-q", "download", "--dataset", "spawrious", "--data_dir", str(tmp_path)]) == 0
    assert Files.seen == [("/s.tar.gz", None), ("/s.tar.gz", f"bytes={half}-")]
    assert digest_of(tree_entries(tmp_path / "spawrious224")) == digest
    assert not part.exists()


def test_an_unknown_dataset_lists_the_valid_ones(tmp_path, capsys):
    assert main(["-q", "download", "--dataset", "ImageNet", "--data_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["domaingen: error: unknown dataset 'ImageNet' to download; valid: mnist, pacs, domainnet, officehome, "
                   "vlcs, terraincognita, sviro, spawrious, camelyon17, fmow"]


def test_download_needs_a_dataset_or_list(tmp_path, capsys):
    assert main(["-q", "download", "--data_dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("domaingen: error: give --dataset NAME to download, or --list to see the "
                                               "datasets and their sources")


def test_an_unwritable_data_directory_from_the_environment_is_named(tmp_path, monkeypatch, capsys):
    import tempfile

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    for candidate in (locked, Path("/sys")):  # root ignores permissions; /sys refuses new files even to root
        try:
            with tempfile.TemporaryFile(dir=candidate):
                pass
        except OSError:
            break
    else:
        pytest.skip("no directory here refuses a new file")
    monkeypatch.setenv("DOMAINGEN_DATA", str(candidate / "data"))
    assert main(["-q", "download", "--dataset", "sviro"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"domaingen: error: --data_dir {candidate / 'data'}: cannot write in "
                                               f"{candidate} (")
    # listing only reads: it works on the same directory
    assert main(["-q", "download", "--list"]) == 0
