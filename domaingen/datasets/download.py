"""`domaingen download`: fetch a dataset from its official source into the layout the loaders read.

Downloads go to `<file>.part` and continue from its end (an HTTP Range request) when
rerun; a finished file is checked against its checksum where one is known, and a
zip archive's own CRCs are checked before it is extracted. DomainNet's duplicate
files (DomainBed's list) are removed after extraction.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from domaingen.errors import DomaingenError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
TIMEOUT_S = 60


@dataclass(frozen=True)
class Archive:
    """One file to fetch. `md5` None: no checksum is published; zip archives are then checked by their CRCs."""

    url: str
    filename: str
    md5: str | None = None


# DomainBed's PACS archive (Google Drive; the folder inside is 'kfold').
PACS_ARCHIVE = Archive(
    "https://drive.usercontent.google.com/download?id=1JFr8f805nMUelQWWmfnJR3y4_SYoN5Pd&export=download&confirm=t",
    "PACS.zip",
)
DOMAINNET_BASE = "http://csr.bu.edu/ftp/visda/2019/multi-source/"
DOMAINNET_ARCHIVES = tuple(
    Archive(DOMAINNET_BASE + ("groundtruth/" if domain in ("clipart", "painting") else "") + f"{domain}.zip", f"{domain}.zip")
    for domain in ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
)
# DomainBed's list of DomainNet files that duplicate others (paths relative to the DomainNet folder).
DOMAINNET_DUPLICATES = Archive(
    "https://raw.githubusercontent.com/facebookresearch/DomainBed/main/domainbed/misc/domain_net_duplicates.txt",
    "domain_net_duplicates.txt",
)
# DomainBed's sources for OfficeHome, VLCS and TerraIncognita (its download.py). No checksum is
# published for them: the archives are checked by their own CRCs (zip) and the extracted
# folders against the layout the dataset reads (verify_layout).
OFFICEHOME_ARCHIVE = Archive(
    "https://drive.usercontent.google.com/download?id=1uY0pj7oFsjMxRwaD3Sxy0jgel0fsYXLC&export=download&confirm=t",
    "office_home.zip",
)
VLCS_ARCHIVE = Archive(
    "https://drive.usercontent.google.com/download?id=1skwblH1_okBwxWxmRsp9_qi15hyPpxg8&export=download&confirm=t",
    "VLCS.tar.gz",
)
TERRA_IMAGES = Archive(
    "https://lilablobssc.blob.core.windows.net/caltechcameratraps/eccv_18_all_images_sm.tar.gz",
    "eccv_18_all_images_sm.tar.gz",
)
TERRA_ANNOTATIONS = Archive(
    "https://lilablobssc.blob.core.windows.net/caltechcameratraps/labels/caltech_camera_traps.json.zip",
    "caltech_camera_traps.json.zip",
)
# DomainBed's selection from Caltech Camera Traps: four locations, ten categories
TERRA_LOCATIONS = ("100", "38", "43", "46")
TERRA_CATEGORIES = ("bird", "bobcat", "cat", "coyote", "dog", "empty", "opossum", "rabbit", "raccoon", "squirrel")
DATASETS = ("mnist", "pacs", "domainnet", "officehome", "vlcs", "terraincognita", "camelyon17", "fmow")


def file_md5(path: Path) -> str:
    """The md5 hex digest of a file."""
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _offline_error(url: str, dest: Path, exc: BaseException) -> DomaingenError:
    reason = " ".join(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}".split())[:200]
    return DomaingenError(
        f"cannot download {url} ({reason}); check the network connection and rerun (a partial download "
        f"continues), or fetch the file by hand to {dest}"
    )


def fetch(archive: Archive, folder: Path) -> Path:
    """Download `archive` into `folder` (resuming a `.part` file), verify it, and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / archive.filename
    if dest.exists() and (archive.md5 is None or file_md5(dest) == archive.md5):
        log.info("%s is already here", dest)
        return dest
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(archive.url, headers={"User-Agent": "domaingen"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            resumed = offset > 0 and getattr(response, "status", None) == 206
            if offset and not resumed:
                log.info("%s ignored the range request; downloading %s from the start", archive.url, dest.name)
                offset = 0
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length else None
            with open(part, "ab" if resumed else "wb") as out, tqdm(
                total=total, initial=offset, unit="B", unit_scale=True, desc=dest.name, disable=None
            ) as bar:
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    bar.update(len(block))
    except (urllib.error.URLError, OSError) as exc:  # offline, refused, reset, timed out
        raise _offline_error(archive.url, dest, exc) from None
    if archive.md5 is not None:
        got = file_md5(part)
        if got != archive.md5:
            part.unlink()
            raise DomaingenError(
                f"checksum mismatch for {dest.name} from {archive.url}: expected md5 {archive.md5}, got {got}; "
                "the file was removed, rerun to download it again"
            )
    part.replace(dest)
    return dest


def extract(path: Path, into: Path) -> None:
    """Unpack a zip or tar archive into `into`; a zip's CRCs are checked first."""
    into.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            if bad is not None:
                raise DomaingenError(f"{path} is damaged ({bad} fails its CRC); delete it and rerun the download")
            archive.extractall(into)
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as archive:
            try:
                archive.extractall(into, filter="data")
            except tarfile.FilterError as exc:  # a member that would land outside `into`, a device file...
                raise DomaingenError(f"{path} holds an unsafe member ({exc}); it was not extracted further") from None
    else:
        raise DomaingenError(f"{path} is neither a zip nor a tar archive; delete it and rerun the download")


def remove_listed(root: Path, listing: Path) -> int:
    """Delete the files `listing` names (one path relative to `root` per line); returns how many were removed."""
    removed = 0
    for line in listing.read_text().splitlines():
        target = root / line.strip()
        if line.strip() and target.is_file():
            target.unlink()
            removed += 1
    return removed


def download_pacs(data_dir: Path) -> str:
    target = data_dir / "PACS"
    if target.is_dir():
        return f"{target} already exists; nothing to do"
    archive = fetch(PACS_ARCHIVE, data_dir / "downloads")
    staging = data_dir / "downloads" / "PACS-extract"
    extract(archive, staging)
    inner = staging / "kfold" if (staging / "kfold").is_dir() else staging
    shutil.move(str(inner), str(target))
    shutil.rmtree(staging, ignore_errors=True)
    archive.unlink()
    return f"PACS is in {target}"


def download_domainnet(data_dir: Path) -> str:
    target = data_dir / "DomainNet"
    for source in DOMAINNET_ARCHIVES:
        domain = source.filename.removesuffix(".zip")
        if (target / domain).is_dir():
            log.info("%s already exists; skipping its download", target / domain)
            continue
        archive = fetch(source, data_dir / "downloads")
        extract(archive, target)
        archive.unlink()
    listing = fetch(DOMAINNET_DUPLICATES, data_dir / "downloads")
    removed = remove_listed(target, listing)
    return f"DomainNet is in {target}; removed {removed} duplicate files"


def verify_layout(dataset: str, data_dir: Path) -> str:
    """Check that the folders of `dataset` (an ImageFolderDataset) are where it reads them, without
    reading images: every domain folder present, the same class folders in each, the published
    number of classes. Returns a summary line; raises DomaingenError naming what is wrong."""
    from domaingen.datasets import DATASETS as TABLE
    from domaingen.datasets.images import list_classes

    cls = TABLE.get(dataset)
    root = data_dir / cls.DATASET_DIR
    folders = {}
    for env in cls.ENVIRONMENTS:
        found = [root / f for f in cls.folder_names(env) if (root / f).is_dir()]
        if not found:
            raise DomaingenError(f"after extraction, {root} lacks the domain folder {cls.folder_names(env)[0]}; "
                                 f"the archive is not the one expected: delete {root} and rerun the download")
        folders[env] = found[0]
    classes = {env: list_classes(path) for env, path in folders.items()}
    first = cls.ENVIRONMENTS[0]
    for env, names in classes.items():
        if names != classes[first] or (cls.NUM_CLASSES and len(names) != cls.NUM_CLASSES):
            raise DomaingenError(f"after extraction, {folders[env]} has {len(names)} class folders, not the "
                                 f"{cls.NUM_CLASSES or len(classes[first])} expected; delete {root} and rerun the download")
    return f"{dataset} is in {root} ({len(cls.ENVIRONMENTS)} domains, {len(classes[first])} classes)"


def _fetch_and_unpack(archive: Archive, data_dir: Path, staging_name: str) -> Path:
    staging = data_dir / "downloads" / staging_name
    path = fetch(archive, data_dir / "downloads")
    extract(path, staging)
    path.unlink()
    return staging


def download_officehome(data_dir: Path) -> str:
    target = data_dir / "office_home"
    if target.is_dir():
        return f"{target} already exists; nothing to do"
    staging = _fetch_and_unpack(OFFICEHOME_ARCHIVE, data_dir, "office_home-extract")
    inner = staging / "OfficeHomeDataset_10072016"
    shutil.move(str(inner if inner.is_dir() else staging), str(target))
    if (target / "Real World").is_dir() and not (target / "Real_World").exists():
        (target / "Real World").rename(target / "Real_World")  # DomainBed's folder name, no space
    shutil.rmtree(staging, ignore_errors=True)
    return verify_layout("OfficeHome", data_dir)


def download_vlcs(data_dir: Path) -> str:
    target = data_dir / "VLCS"
    if target.is_dir():
        return f"{target} already exists; nothing to do"
    staging = _fetch_and_unpack(VLCS_ARCHIVE, data_dir, "VLCS-extract")
    inner = staging / "VLCS"
    shutil.move(str(inner if inner.is_dir() else staging), str(target))
    shutil.rmtree(staging, ignore_errors=True)
    return verify_layout("VLCS", data_dir)


def sort_terra_incognita(annotations: dict, images: Path, target: Path) -> int:
    """Copy the camera-trap images of DomainBed's four locations and ten categories into
    target/location_<L>/<category>/<file>, as DomainBed's download script does (an image with
    several annotations goes into each of their categories). Returns the number of files written."""
    categories = {c["id"]: c["name"] for c in annotations["categories"]}
    labels: dict[str, list[str]] = {}
    for annotation in annotations["annotations"]:
        labels.setdefault(annotation["image_id"], []).append(categories[annotation["category_id"]])
    written = 0
    for image in annotations["images"]:
        location = str(image["location"])
        if location not in TERRA_LOCATIONS:
            continue
        for category in labels.get(image["id"], []):
            if category not in TERRA_CATEGORIES:
                continue
            destination = target / f"location_{location}" / category / Path(image["file_name"]).name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(images / image["file_name"], destination)
            written += 1
    return written


def download_terraincognita(data_dir: Path) -> str:
    import json

    target = data_dir / "terra_incognita"
    if target.is_dir():
        return f"{target} already exists; nothing to do"
    labels = _fetch_and_unpack(TERRA_ANNOTATIONS, data_dir, "terra-annotations")
    images = _fetch_and_unpack(TERRA_IMAGES, data_dir, "terra-images")
    listing = sorted(labels.rglob("*.json"))
    if not listing:
        raise DomaingenError(f"{TERRA_ANNOTATIONS.filename} holds no .json annotation file; delete {labels} and rerun")
    inner = images / "eccv_18_all_images_sm"
    staging = data_dir / "downloads" / "terra-sorted"
    shutil.rmtree(staging, ignore_errors=True)
    sort_terra_incognita(json.loads(listing[0].read_text()), inner if inner.is_dir() else images, staging)
    shutil.move(str(staging), str(target))
    shutil.rmtree(images, ignore_errors=True)
    shutil.rmtree(labels, ignore_errors=True)
    return verify_layout("TerraIncognita", data_dir)


def download_wilds(name: str) -> Callable[[Path], str]:
    def run(data_dir: Path) -> str:
        try:
            from wilds import get_dataset
        except ImportError:
            raise DomaingenError(f"downloading {name} needs the wilds package: pip install 'domaingen-bench[wilds]'") from None
        try:
            dataset = get_dataset(dataset=name, root_dir=str(data_dir), download=True)
        except (urllib.error.URLError, OSError) as exc:
            raise _offline_error(f"WILDS' {name} archive", data_dir, exc) from None
        return f"{name} is in {dataset.data_dir}"

    return run


def download_mnist(data_dir: Path) -> str:
    from domaingen.datasets.mnist import load_mnist

    digits = load_mnist(str(data_dir), download=True)  # torchvision checks the files' md5
    return f"MNIST ({len(digits.labels)} digits) is in {data_dir / 'MNIST' / 'raw'}"


DOWNLOADERS: dict[str, Callable[[Path], str]] = {
    "mnist": download_mnist,
    "pacs": download_pacs,
    "domainnet": download_domainnet,
    "officehome": download_officehome,
    "vlcs": download_vlcs,
    "terraincognita": download_terraincognita,
    "camelyon17": download_wilds("camelyon17"),
    "fmow": download_wilds("fmow"),
}


def download(name: str, data_dir: str) -> str:
    """Fetch dataset `name` into `data_dir`; returns a one-line summary for the user."""
    if name not in DOWNLOADERS:
        raise DomaingenError(f"unknown dataset '{name}' to download; valid: {', '.join(DOWNLOADERS)}")
    return DOWNLOADERS[name](Path(data_dir).expanduser())
