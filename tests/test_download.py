"""`domaingen download` against local servers and file:// URLs: checksums, resume, extraction, offline."""

from __future__ import annotations

import hashlib
import http.server
import socket
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from domaingen.datasets import download as dl
from domaingen.cli.main import main
from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from imagetree import make_folder_tree, use_archive

SMALL = {"backbone": "resnet18", "pretrained": False, "image_size": 32, "num_workers": 0}


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves `payload` and honours 'Range: bytes=N-'; remembers the Range headers it saw."""

    payload = b""
    ranges: list[str] = []

    def do_GET(self):  # noqa: N802 (the http.server API)
        start = 0
        header = self.headers.get("Range")
        type(self).ranges.append(header)
        if header:
            start = int(header.removeprefix("bytes=").split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(self.payload) - 1}/{len(self.payload)}")
        else:
            self.send_response(200)
        body = self.payload[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    RangeHandler.payload = bytes(range(256)) * 1000
    RangeHandler.ranges = []
    httpd = http.server.HTTPServer(("127.0.0.1", 0), RangeHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_a_partial_download_is_continued(server, tmp_path):
    payload = RangeHandler.payload
    (tmp_path / "blob.bin.part").write_bytes(payload[:100_000])
    path = dl.fetch(dl.Archive(f"{server}/blob.bin", "blob.bin", md5(payload)), tmp_path)
    assert path.read_bytes() == payload
    assert RangeHandler.ranges == ["bytes=100000-"]
    assert not (tmp_path / "blob.bin.part").exists()


def test_a_checksum_mismatch_is_an_error_and_keeps_nothing(tmp_path):
    source = tmp_path / "served.zip"
    source.write_bytes(b"these are not the bytes you are looking for")
    archive = dl.Archive(source.as_uri(), "PACS.zip", md5(b"the right bytes"))
    with pytest.raises(DomaingenError) as info:
        dl.fetch(archive, tmp_path / "downloads")
    assert "checksum mismatch for PACS.zip" in str(info.value) and md5(b"the right bytes") in str(info.value)
    assert list((tmp_path / "downloads").iterdir()) == []


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/PACS.zip"  # nothing listens there any more: connection refused


def test_offline_is_one_clear_line_without_a_traceback(tmp_path, monkeypatch, capsys):
    use_archive(monkeypatch, "pacs", dl.Archive(closed_port_url(), "PACS.zip"))
    code = main(["-q", "download", "--dataset", "pacs", "--data_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("domaingen: error: cannot download http://127.0.0.1:")
    assert "check the network connection" in lines[0] and "Traceback" not in err


def zip_folder(folder: Path, archive: Path, arcroot: str) -> bytes:
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(folder.rglob("*")):
            z.write(path, Path(arcroot) / path.relative_to(folder))
    return archive.read_bytes()


def test_pacs_is_extracted_into_the_layout_the_loader_reads(tmp_path, monkeypatch, capsys):
    domains = ["art_painting", "cartoon", "photo", "sketch"]
    classes = ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]  # the layout check wants all 7
    tree = make_folder_tree(tmp_path / "src", domains, classes, per_class=1, size=8)
    data = zip_folder(tree, tmp_path / "served.zip", "kfold")
    use_archive(monkeypatch, "pacs", dl.Archive((tmp_path / "served.zip").as_uri(), "PACS.zip", md5(data)))
    data_dir = tmp_path / "data"
    assert main(["-q", "download", "--dataset", "pacs", "--data_dir", str(data_dir)]) == 0
    assert f"PACS is in {data_dir / 'PACS'}" in capsys.readouterr().out
    dataset = DATASETS.get("PACS")(str(data_dir), [0], SMALL)
    assert [len(env) for env in dataset.environments] == [7, 7, 7, 7]
    assert not (data_dir / "downloads" / "PACS.zip").exists()


def test_domainnet_duplicates_are_removed(tmp_path, monkeypatch):
    domains = ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]
    tree = make_folder_tree(tmp_path / "src", domains, ["cat", "tree"], per_class=3)
    archives = []
    for domain in domains:
        data = zip_folder(tree / domain, tmp_path / f"{domain}-served.zip", domain)
        archives.append(dl.Archive((tmp_path / f"{domain}-served.zip").as_uri(), f"{domain}.zip", md5(data)))
    listing = tmp_path / "dups.txt"
    listing.write_text("clipart/cat/clipart_cat_0.jpg\nreal/tree/real_tree_2.jpg\nsketch/cat/not_there.jpg\n")
    monkeypatch.setattr(dl, "DOMAINNET_ARCHIVES", tuple(archives))
    monkeypatch.setattr(dl, "DOMAINNET_DUPLICATES", dl.Archive(listing.as_uri(), "domain_net_duplicates.txt"))
    message = dl.download("domainnet", str(tmp_path / "data"))
    assert message.endswith("removed 2 duplicate files")
    dataset = DATASETS.get("DomainNet")(str(tmp_path / "data"), [0], SMALL)
    assert [len(env) for env in dataset.environments] == [5, 6, 6, 6, 5, 6]
    assert not (tmp_path / "data" / "DomainNet" / "clipart" / "cat" / "clipart_cat_0.jpg").exists()


def test_a_damaged_zip_is_refused_before_extraction(tmp_path):
    tree = make_folder_tree(tmp_path / "src", ["photo"], ["dog"], per_class=1)
    data = bytearray(zip_folder(tree, tmp_path / "a.zip", "kfold"))
    data[len(data) // 2] ^= 0xFF  # inside the image's stored bytes
    (tmp_path / "a.zip").write_bytes(bytes(data))
    with pytest.raises(DomaingenError, match="is damaged"):
        dl.extract(tmp_path / "a.zip", tmp_path / "out")


def test_wilds_download_without_wilds_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wilds", None)  # makes `import wilds` raise ImportError
    with pytest.raises(DomaingenError, match=r"pip install 'domaingen-bench\[wilds\]'"):
        dl.download("camelyon17", str(tmp_path))


def test_extract_keeps_tar_members_inside_the_target(tmp_path):
    import tarfile

    (tmp_path / "f.txt").write_text("x")
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        tar.add(tmp_path / "f.txt", arcname="../escape.txt")
    with pytest.raises(DomaingenError, match="unsafe member"):
        dl.extract(tmp_path / "a.tar", tmp_path / "out" / "inner")
    assert not (tmp_path / "out" / "escape.txt").exists()
