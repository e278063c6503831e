"""Tiny image datasets on disk, in the real layouts, for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image


def write_image(path: Path, rng: np.random.Generator, size: int = 32, fmt: str = "JPEG") -> None:
    """A random RGB image of size x size pixels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, fmt)


def make_folder_tree(
    root: Path, domains: Sequence[str], classes: Sequence[str], per_class: int = 3, size: int = 32, seed: int = 0
) -> Path:
    """root/<domain>/<class>/<i>.jpg, `per_class` random images each; returns root."""
    rng = np.random.default_rng(seed)
    for domain in domains:
        for name in classes:
            for i in range(per_class):
                write_image(root / domain / name / f"{domain}_{name}_{i}.jpg", rng, size)
    return root


def make_fake_camelyon17(data_dir: Path, per_hospital: int = 4, size: int = 16, seed: int = 0) -> Path:
    """WILDS' Camelyon17 layout: camelyon17_v1.0/metadata.csv, RELEASE_v1.0.txt and patches/."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    root = data_dir / "camelyon17_v1.0"
    rows = []
    for center in range(5):
        for k in range(per_hospital):
            patient, node, x, y = f"{10 * center + k // 2:03d}", k % 2, 100 + k, 200 + center
            rows.append({"patient": patient, "node": node, "x_coord": x, "y_coord": y, "tumor": int(rng.integers(2)),
                         "slide": 2 * center + k // 2, "center": center, "split": int(k == per_hospital - 1)})
            write_image(root / f"patches/patient_{patient}_node_{node}/patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png",
                        rng, size, "PNG")
    pd.DataFrame(rows).to_csv(root / "metadata.csv")
    (root / "RELEASE_v1.0.txt").write_text("fake")
    return root


FMOW_COUNTRIES = {"CHN": "Asia", "FRA": "Europe", "KEN": "Africa", "USA": "Americas", "AUS": "Oceania"}


def make_fake_fmow(data_dir: Path, per_region: int = 5, size: int = 16, seed: int = 0) -> Path:
    """WILDS' FMoW layout: fmow_v1.1/rgb_metadata.csv, country_code_mapping.csv, RELEASE_v1.1.txt, images/."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    root = data_dir / "fmow_v1.1"
    codes = list(FMOW_COUNTRIES) + ["XXX"]  # an unmapped country: region 'Other'
    years = ["2010", "2012", "2014", "2016", "2017"]
    splits = ["train", "val", "test", "train", "test"]
    rows = []
    for k in range(per_region):
        for code in codes:
            i = len(rows)
            rows.append({"split": splits[(i + k) % 5], "img_filename": f"x_{i}.jpg", "category": ["airport", "zoo", "dam"][i % 3],
                         "country_code": code, "timestamp": f"{years[(i * 7 + k) % 5]}-03-0{1 + i % 9}T10:00:00Z"})
            write_image(root / "images" / f"rgb_img_{i}.png", rng, size, "PNG")
    rows.append({"split": "seq", "img_filename": "seq.jpg", "category": "zoo", "country_code": "FRA",
                 "timestamp": "2015-01-01T00:00:00Z"})
    write_image(root / "images" / f"rgb_img_{len(rows) - 1}.png", rng, size, "PNG")
    pd.DataFrame(rows).to_csv(root / "rgb_metadata.csv", index=False)
    pd.DataFrame({"alpha-3": list(FMOW_COUNTRIES), "region": list(FMOW_COUNTRIES.values())}).to_csv(
        root / "country_code_mapping.csv", index=False)
    (root / "RELEASE_v1.1.txt").write_text("fake")
    return root


SVIRO_VEHICLES = ("aclass", "escape", "hilux", "i3", "lexus", "tesla", "tiguan", "tucson", "x5", "zoe")


def make_sviro_tree(data_dir: Path, classes: Sequence[str] = ("0", "1", "2"), per_class: int = 2, size: int = 16,
                    seed: int = 0) -> Path:
    """DomainBed's SVIRO layout: sviro/<vehicle>/<class>/<image>.png, small grayscale images; returns sviro/."""
    rng = np.random.default_rng(seed)
    root = data_dir / "sviro"
    for vehicle in SVIRO_VEHICLES:
        for name in classes:
            for i in range(per_class):
                path = root / vehicle / name / f"{vehicle}_{name}_{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8), "L").save(path)
    return root


def make_spawrious_tree(data_dir: Path, per_group: int = 2, counts: dict[str, int] | None = None, size: int = 8,
                        seed: int = 0) -> Path:
    """The Spawrious tarball's layout: spawrious224/{0,1}/<location>/<breed>/<image>, `per_group` images in each
    folder (`counts` overrides it for folders named '<folder>/<location>/<breed>'), with names in an order
    that differs from creation order, and one non-image file per folder; returns spawrious224/."""
    rng = np.random.default_rng(seed)
    root = data_dir / "spawrious224"
    counts = counts or {}
    for folder in ("0", "1"):
        for location in ("beach", "desert", "dirt", "jungle", "mountain", "snow"):
            for breed in ("bulldog", "corgi", "dachshund", "labrador"):
                where = f"{folder}/{location}/{breed}"
                n = counts.get(where, per_group)
                order = rng.permutation(n)
                for i in order:
                    ext = ("png", "jpg", "jpeg")[int(i) % 3]
                    write_image(root / where / f"{location}_{breed}_{int(i):04d}.{ext}", rng, size,
                                "PNG" if ext == "png" else "JPEG")
                (root / where / "notes.txt").parent.mkdir(parents=True, exist_ok=True)
                (root / where / "notes.txt").write_text("not an image")
    return root


def use_archive(monkeypatch, name: str, *archives) -> None:
    """Make `domaingen download --dataset name` fetch `archives` instead of its recorded ones."""
    from dataclasses import replace

    from domaingen.datasets import download as dl

    monkeypatch.setitem(dl.DOWNLOADS, name, replace(dl.DOWNLOADS[name], archives=tuple(archives)))
