"""`domaingen download`: fetch a dataset into the layout the loaders read; `--list` says what is where.

Each file has an ordered list of sources (its original URL first, then mirrors; see
`sources.py`), tried in turn with one logged line per failure. Downloads go to
`<file>.part` and continue from its end (an HTTP Range request) when rerun; a finished
file is checked against its checksum where one is known, and a zip archive's own CRCs are
checked before it is extracted. A dataset's tree is built and verified in a temporary
folder and renamed into place only when it passes (`sources.install`); its manifest is
recorded so that `--list` can say whether the tree is still the one installed.
DomainNet's duplicate files (DomainBed's list) are removed after extraction.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from domaingen.datasets.sources import HubSource, Source, TreeDigest, UrlSource, check_installed, install
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
    mirrors: tuple[Source, ...] = ()

    @property
    def sources(self) -> tuple[Source, ...]:
        """The original URL, then the mirrors, in the order they are tried."""
        return (UrlSource(self.url), *self.mirrors)


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
    # the same file in LILA's Google Cloud bucket, DomainBed's URL
    mirrors=(UrlSource("https://storage.googleapis.com/public-datasets-lila/caltechcameratraps/eccv_18_all_images_sm.tar.gz"),),
)
TERRA_ANNOTATIONS = Archive(
    "https://lilablobssc.blob.core.windows.net/caltechcameratraps/labels/caltech_camera_traps.json.zip",
    "caltech_camera_traps.json.zip",
)
# DomainBed's SVIRO archive (the folder inside is SVIRO_DOMAINBED)
SVIRO_ARCHIVE = Archive("https://sviro.kl.dfki.de/?wpdmdl=1731", "sviro_grayscale_rectangle_classification.zip")
# DomainBed's Spawrious tarball, then the Spawrious authors' own link to the entire dataset (the same
# spawrious224/{0,1}/ folders, plus their domain_adaptation_ds/), as their package downloads it
SPAWRIOUS_ARCHIVE = Archive(
    "https://www.dropbox.com/s/e40j553480h3f3s/spawrious224.tar.gz?dl=1", "spawrious224.tar.gz",
    mirrors=(UrlSource("https://www.dropbox.com/s/hofkueo8qvaqlp3/spawrious224__entire_dataset.tar.gz?dl=1"),),
)
# DomainBed's selection from Caltech Camera Traps: four locations, ten categories
TERRA_LOCATIONS = ("100", "38", "43", "46")
TERRA_CATEGORIES = ("bird", "bobcat", "cat", "coyote", "dog", "empty", "opossum", "rabbit", "raccoon", "squirrel")


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


def _download(source: Source, dest: Path, part: Path, md5: str | None) -> None:
    """Fetch one source into `part` (continuing it), check its md5, and rename it to `dest`."""
    url = source.url()
    offset = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "domaingen", **source.headers()})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            resumed = offset > 0 and getattr(response, "status", None) == 206
            if offset and not resumed:
                log.info("%s ignored the range request; downloading %s from the start", url, dest.name)
                offset = 0
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length else None
            with open(part, "ab" if resumed else "wb") as out, tqdm(
                total=total, initial=offset, unit="B", unit_scale=True, desc=dest.name, disable=None
            ) as bar:
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    bar.update(len(block))
            if total is not None and part.stat().st_size < total:  # the server closed the connection early
                raise ConnectionError(f"the connection closed after {part.stat().st_size} of {total} bytes")
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # offline, refused, reset, cut short
        raise _offline_error(url, dest, exc) from None
    if md5 is not None:
        got = file_md5(part)
        if got != md5:
            part.unlink()
            raise DomaingenError(
                f"checksum mismatch for {dest.name} from {url}: expected md5 {md5}, got {got}; "
                "the file was removed, rerun to download it again"
            )
    part.replace(dest)


def fetch(archive: Archive, folder: Path, accept: Callable[[Path], object] | None = None) -> Path:
    """Download `archive` into `folder` from its first source that works, and return its path.

    Each source is tried in turn (the original URL first); a failure is one logged line and
    the next source is tried. A partial download continues from its `.part` file (one per
    source). `accept(path)`, when given, uses the file (extracts and installs it): a file it
    refuses is deleted and the next source is tried. When every source fails, the error is
    the last failure's, or one line listing them all.
    """
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / archive.filename
    if dest.exists() and (archive.md5 is None or file_md5(dest) == archive.md5):
        log.info("%s is already here", dest)
        if accept is None:
            return dest
        try:
            accept(dest)
            return dest
        except DomaingenError as exc:
            dest.unlink()
            log.warning("%s was refused (%s); downloading it again", dest, exc)
    failures: list[str] = []
    sources = archive.sources
    for k, source in enumerate(sources):
        part = dest.with_name(dest.name + (".part" if k == 0 else f".{k}.part"))
        try:
            _download(source, dest, part, archive.md5)
            if accept is not None:
                accept(dest)
            return dest
        except DomaingenError as exc:
            if dest.exists():
                dest.unlink()
            failures.append(f"{source.describe()}: {exc}")
            if len(sources) > 1:
                log.warning("source %d of %d for %s failed (%s): %s", k + 1, len(sources), archive.filename,
                            source.describe(), exc)
            if len(sources) == 1:
                raise
    raise DomaingenError(f"no source of {archive.filename} worked ({len(sources)} tried; last: {failures[-1]})")


def extract(path: Path, into: Path) -> None:
    """Unpack a zip or tar archive into `into`; a zip's CRCs are checked first. A damaged archive is one error."""
    into.mkdir(parents=True, exist_ok=True)
    damaged = f"{path.name} is damaged"
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
                if bad is not None:
                    raise DomaingenError(f"{path} is damaged ({bad} fails its CRC); it is not used: rerun the download")
                archive.extractall(into)
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as archive:
                archive.extractall(into, filter="data")
        else:
            raise DomaingenError(f"{path} is neither a zip nor a tar archive; delete it and rerun the download")
    except tarfile.FilterError as exc:  # a member that would land outside `into`, a device file...
        raise DomaingenError(f"{path} holds an unsafe member ({exc}); it was not extracted further") from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as exc:  # truncated or corrupted
        raise DomaingenError(f"{damaged} ({type(exc).__name__}: {exc}); it is not used: rerun the download") from None


def remove_listed(root: Path, listing: Path) -> int:
    """Delete the files `listing` names (one path relative to `root` per line); returns how many were removed."""
    removed = 0
    for line in listing.read_text().splitlines():
        target = root / line.strip()
        if line.strip() and target.is_file():
            target.unlink()
            removed += 1
    return removed


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


def check_layout(dataset: str) -> Callable[[Path], None]:
    """A check that a folder holds `dataset`'s tree (an ImageFolderDataset), without reading images:
    every domain folder present, the same class folders in each, the published number of classes."""
    from domaingen.datasets import DATASETS as TABLE
    from domaingen.datasets.images import list_classes

    cls = TABLE.get(dataset)
    refused = "the archive is not the one expected; it was deleted and nothing was installed"

    def check(root: Path) -> None:
        folders = {}
        for env in cls.ENVIRONMENTS:
            found = [root / f for f in cls.folder_names(env) if (root / f).is_dir()]
            if not found:
                raise DomaingenError(f"after extraction, {dataset} lacks the domain folder {cls.folder_names(env)[0]}; "
                                     f"{refused}")
            folders[env] = found[0]
        classes = {env: list_classes(path) for env, path in folders.items()}
        first = cls.ENVIRONMENTS[0]
        for env, names in classes.items():
            if names != classes[first] or (cls.NUM_CLASSES and len(names) != cls.NUM_CLASSES):
                raise DomaingenError(f"after extraction, {dataset}'s {folders[env].name} has {len(names)} class "
                                     f"folders, not the {cls.NUM_CLASSES or len(classes[first])} expected; {refused}")

    return check


def verify_layout(dataset: str, data_dir: Path) -> str:
    """Check `dataset`'s folders under `data_dir` (see check_layout); returns a summary line."""
    from domaingen.datasets import DATASETS as TABLE
    from domaingen.datasets.images import list_classes

    cls = TABLE.get(dataset)
    root = data_dir / cls.DATASET_DIR
    check_layout(dataset)(root)
    classes = list_classes(root / next(f for f in cls.folder_names(cls.ENVIRONMENTS[0]) if (root / f).is_dir()))
    return f"{dataset} is in {root} ({len(cls.ENVIRONMENTS)} domains, {len(classes)} classes)"


def check_spawrious(root: Path) -> None:
    """Every (folder, location, breed) folder the six Spawrious benchmarks read holds an image."""
    from domaingen.datasets.spawrious import EXTENSIONS, SpawriousBenchmark

    for cls in SpawriousBenchmark.__subclasses__():
        for groups in cls.groups().values():
            for group in groups:
                folder = root / group.relative_dir()
                if not folder.is_dir() or not any(n.endswith(EXTENSIONS) for n in os.listdir(folder)):
                    raise DomaingenError(f"after extraction, Spawrious lacks images in {group.relative_dir()}; the "
                                         "archive is not the one expected; it was deleted and nothing was installed")


def install_archive(spec: "DownloadSpec", data_dir: Path) -> str:
    """Download `spec`'s archive from its first working source, extract it into a temporary folder,
    verify the tree and rename it to `<data_dir>/<spec.folder>`."""
    target = data_dir / spec.folder
    if target.exists():
        return f"{target} already exists: {check_installed(data_dir, spec.name, target)}"
    archive = spec.archives[0]

    def accept(path: Path) -> None:
        def build(staging: Path) -> Path:
            extract(path, staging)
            inner = staging / spec.inner if spec.inner and (staging / spec.inner).is_dir() else staging
            if spec.prepare is not None:
                spec.prepare(inner)
            return inner

        entries = install(data_dir, spec.name, target, build, spec.tree, spec.check)
        log.info("%s: %d files verified and installed", spec.name, len(entries))

    path = fetch(archive, data_dir / "downloads", accept)
    path.unlink()
    return spec.summary(data_dir)


def _real_world_without_space(root: Path) -> None:
    if (root / "Real World").is_dir() and not (root / "Real_World").exists():
        (root / "Real World").rename(root / "Real_World")  # DomainBed's folder name, no space


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
    if target.exists():
        return f"{target} already exists: {check_installed(data_dir, 'terraincognita', target)}"
    downloads = data_dir / "downloads"
    labels_zip = fetch(TERRA_ANNOTATIONS, downloads)
    images_tar = fetch(TERRA_IMAGES, downloads)

    def build(staging: Path) -> Path:
        extract(labels_zip, staging / "labels")
        listing = sorted((staging / "labels").rglob("*.json"))
        if not listing:
            raise DomaingenError(f"{TERRA_ANNOTATIONS.filename} holds no .json annotation file; it was deleted, rerun")
        extract(images_tar, staging / "images")
        inner = staging / "images" / "eccv_18_all_images_sm"
        sort_terra_incognita(json.loads(listing[0].read_text()), inner if inner.is_dir() else staging / "images",
                             staging / "sorted")
        return staging / "sorted"

    try:
        install(data_dir, "terraincognita", target, build, None, check_layout("TerraIncognita"))
    except DomaingenError:
        labels_zip.unlink()
        images_tar.unlink()
        raise
    labels_zip.unlink()
    images_tar.unlink()
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


@dataclass(frozen=True)
class DownloadSpec:
    """What `domaingen download --dataset NAME` fetches and what `--list` shows about it."""

    name: str
    datasets: str  # the dataset names it provides, for the listing
    folder: str  # under data_dir
    archives: tuple[Archive, ...]
    size: str
    licence: str
    run: Callable[[Path], str] | None = None  # a custom downloader; None: install_archive
    inner: str = ""  # the folder inside the archive that becomes `folder` ("" = the archive's top level)
    tree: TreeDigest | None = None  # the published tree's digest, where one is recorded
    check: Callable[[Path], None] | None = None
    prepare: Callable[[Path], None] | None = None

    def summary(self, data_dir: Path) -> str:
        from domaingen.datasets import DATASETS as TABLE, ImageFolderDataset

        dataset = self.datasets.split(",")[0].strip()
        if dataset in TABLE.names() and issubclass(TABLE.get(dataset), ImageFolderDataset):
            return verify_layout(dataset, data_dir)
        return f"{self.datasets} is in {data_dir / self.folder}"

    def fetch_into(self, data_dir: Path) -> str:
        return self.run(data_dir) if self.run is not None else install_archive(self, data_dir)


UNKNOWN_SIZE = "not recorded"
SPECS: tuple[DownloadSpec, ...] = (
    DownloadSpec("mnist", "ColoredMNIST, RotatedMNIST, IRMColoredMNIST", "MNIST", (), "11.6 MB (4 gzip files)",
                 "CC BY-SA 3.0 (LeCun, Cortes, Burges)", run=download_mnist),
    DownloadSpec("pacs", "PACS", "PACS", (PACS_ARCHIVE,), UNKNOWN_SIZE,
                 "no licence published by the authors; research use", inner="kfold", check=check_layout("PACS")),
    DownloadSpec("domainnet", "DomainNet", "DomainNet", DOMAINNET_ARCHIVES, UNKNOWN_SIZE,
                 "research and non-commercial use (the authors' terms)", run=download_domainnet),
    DownloadSpec("officehome", "OfficeHome", "office_home", (OFFICEHOME_ARCHIVE,), UNKNOWN_SIZE,
                 "research and non-commercial use only (the authors' terms)", inner="OfficeHomeDataset_10072016",
                 check=check_layout("OfficeHome"), prepare=_real_world_without_space),
    DownloadSpec("vlcs", "VLCS", "VLCS", (VLCS_ARCHIVE,), UNKNOWN_SIZE,
                 "images of Caltech101, LabelMe, SUN09, PASCAL VOC 2007: each source's terms", inner="VLCS",
                 check=check_layout("VLCS")),
    DownloadSpec("terraincognita", "TerraIncognita", "terra_incognita", (TERRA_ANNOTATIONS, TERRA_IMAGES),
                 UNKNOWN_SIZE, "Community Data License Agreement, permissive (Caltech Camera Traps on LILA)",
                 run=download_terraincognita),
    DownloadSpec("sviro", "SVIRO", "sviro", (SVIRO_ARCHIVE,), UNKNOWN_SIZE,
                 "CC BY-NC-SA 4.0 (DFKI; see sviro.kl.dfki.de)", inner="SVIRO_DOMAINBED", check=check_layout("SVIRO")),
    DownloadSpec("spawrious", "SpawriousO2O_*, SpawriousM2M_*", "spawrious224", (SPAWRIOUS_ARCHIVE,), UNKNOWN_SIZE,
                 "images generated with Stable Diffusion; code MIT (Lynch et al.); see github.com/aengusl/spawrious",
                 inner="spawrious224", check=check_spawrious),
    DownloadSpec("camelyon17", "Camelyon17, Camelyon17Official", "camelyon17_v1.0", (), UNKNOWN_SIZE,
                 "CC0 1.0 (WILDS)", run=download_wilds("camelyon17")),
    DownloadSpec("fmow", "FMoW, FMoWOfficial", "fmow_v1.1", (), UNKNOWN_SIZE,
                 "fMoW Challenge Public License (WILDS)", run=download_wilds("fmow")),
)
DOWNLOADS: dict[str, DownloadSpec] = {spec.name: spec for spec in SPECS}
DATASETS = tuple(DOWNLOADS)


def download(name: str, data_dir: str) -> str:
    """Fetch dataset `name` into `data_dir`; returns a one-line summary for the user."""
    key = name.lower()
    if key not in DOWNLOADS:
        raise DomaingenError(f"unknown dataset '{name}' to download; valid: {', '.join(DOWNLOADS)}")
    return DOWNLOADS[key].fetch_into(Path(data_dir).expanduser())


def listing(data_dir: str) -> list[list[str]]:
    """One row per downloadable dataset: name, datasets, sources (one per line), size, licence, state under `data_dir`."""
    root = Path(data_dir).expanduser()
    rows = []
    for spec in DOWNLOADS.values():
        sources = [source.describe() for archive in spec.archives for source in archive.sources]
        if not sources:
            sources = ["torchvision's MNIST mirrors"] if spec.name == "mnist" else [f"the wilds package ({spec.name})"]
        state = check_installed(root, spec.name, root / spec.folder)
        rows.append([spec.name, spec.datasets, "\n".join(sources), spec.size, spec.licence, state])
    return rows


def format_listing(rows: list[list[str]], data_dir: str) -> str:
    """`listing` as text: one block per dataset, its sources numbered in the order they are tried."""
    blocks = []
    for name, datasets, sources, size, licence, state in rows:
        lines = [f"{name} ({datasets}): {state}", f"  size: {size}; licence: {licence}"]
        lines += [f"  source {k}: {source}" for k, source in enumerate(sources.splitlines(), 1)]
        blocks.append("\n".join(lines))
    return f"datasets under {data_dir}:\n" + "\n".join(blocks)
