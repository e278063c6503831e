"""ImageFolderDataset: DomainBed's OfficeHome, VLCS and TerraIncognita on generated trees, their downloads
(offline, extraction, TerraIncognita's sorting), and a plugin's own folder dataset in a few lines."""

from __future__ import annotations

import json
import os
import socket
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from domaingen.datasets import download as dl
from domaingen import plugins
from domaingen.cli.main import main
from domaingen.datasets import DATASETS, ImageFolderDataset
from domaingen.datasets.images import PACS
from domaingen.run.rundir import RunDirectory
from imagetree import make_folder_tree, use_archive, write_image

SMALL = {"backbone": "resnet18", "pretrained": False, "image_size": 16, "batch_size": 4, "num_workers": 0}
# name -> (environments, folders, DATASET_DIR, published classes), DomainBed's
DOMAINBED = {
    "OfficeHome": (["A", "C", "P", "R"], ["Art", "Clipart", "Product", "Real_World"], "office_home", 65),
    "VLCS": (["C", "L", "S", "V"], ["Caltech101", "LabelMe", "SUN09", "VOC2007"], "VLCS", 5),
    "TerraIncognita": (["L100", "L38", "L43", "L46"], ["location_100", "location_38", "location_43", "location_46"],
                       "terra_incognita", 10),
}
CLASSES = ["zebra", "apple", "mug"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    for i, (name, (_, folders, directory, _)) in enumerate(DOMAINBED.items()):
        make_folder_tree(root / directory, folders, CLASSES, per_class=2, size=8, seed=i)
    return root


@pytest.mark.parametrize("name", list(DOMAINBED))
def test_environments_follow_domainbeds_folders_and_order(data_dir, name):
    envs, folders, directory, classes = DOMAINBED[name]
    cls = DATASETS.get(name)
    assert issubclass(cls, ImageFolderDataset) and cls.NUM_CLASSES == classes
    assert (cls.N_STEPS, cls.CHECKPOINT_FREQ) == (5001, 300)
    assert cls.hparam_space() == PACS.hparam_space()  # DomainBed's image hyperparameters
    dataset = cls(str(data_dir), [0], SMALL)
    assert [env.name for env in dataset.environments] == envs
    assert dataset.classes == sorted(CLASSES)
    for env, folder in zip(dataset.environments, folders):
        assert len(env) == 6
        for path, label in zip(env.paths, env.y.tolist()):
            assert Path(path).parent.parent == data_dir / directory / folder
            assert Path(path).parent.name == sorted(CLASSES)[label]
    assert dataset.data_source == f"{directory}-24"


def test_office_homes_real_world_folder_may_keep_its_space(data_dir, tmp_path):
    root = make_folder_tree(tmp_path / "office_home", ["Art", "Clipart", "Product", "Real World"], CLASSES[:2],
                            per_class=1, size=8)
    dataset = DATASETS.get("OfficeHome")(str(tmp_path), [0], SMALL)
    assert Path(dataset.environments[3].paths[0]).parent.parent == root / "Real World"


def test_a_missing_domain_folder_is_one_line_with_the_download_command(tmp_path, capsys):
    make_folder_tree(tmp_path / "VLCS", ["Caltech101", "LabelMe", "SUN09"], CLASSES, per_class=1, size=8)
    code = main(["-q", "train", "--dataset", "VLCS", "--algorithm", "ERM", "--data_dir", str(tmp_path),
                 "--output_dir", str(tmp_path / "run"), "--hparams", json.dumps(SMALL)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0] == (f"domaingen: error: VLCS: domain folder(s) VOC2007 missing in {tmp_path / 'VLCS'}; expected "
                      "<data_dir>/VLCS/<domain>/<class>/<image> with domain folders Caltech101, LabelMe, SUN09, "
                      f"VOC2007; get the data with `domaingen download --dataset vlcs --data_dir {tmp_path}`")
    assert not (tmp_path / "run").exists()


# --- a plugin's own folders ----------------------------------------------------------------------

PLUGIN = '''
from domaingen.datasets import DATASETS, ImageFolderDataset

@DATASETS.register("MyScans")
class MyScans(ImageFolderDataset):
    """Scans from three hospitals."""
    DATASET_DIR = "my_scans"
    ENVIRONMENTS = ("north", "south", "west")
'''


def test_a_plugin_dataset_is_a_few_lines_and_trains(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_data.py").write_text(PLUGIN)
    make_folder_tree(tmp_path / "data" / "my_scans", ["north", "south", "west"], ["benign", "malignant"],
                     per_class=3, size=8)
    hparams = json.dumps({**SMALL, "featurizer": "MLP"})
    try:
        code = main(["-q", "--plugins", "my_data.py", "train", "--dataset", "MyScans", "--algorithm", "ERM",
                     "--test_envs", "2", "--data_dir", "data", "--steps", "2", "--checkpoint_freq", "1",
                     "--hparams", hparams, "--output_dir", "run"])
        assert code == 0, capsys.readouterr().err
        record = RunDirectory(tmp_path / "run").records()[-1]
        assert record["data_source"] == "my_scans-18"
        assert {k for k in record if k.endswith("_acc")} == {f"env{i}_{s}_acc" for i in range(3) for s in ("in", "out")}
        assert record["hparams"]["lr"] == 5e-5 and record["hparams"]["batch_size"] == 4
        cls = DATASETS.get("MyScans")
        assert (cls.N_STEPS, cls.CHECKPOINT_FREQ, cls.hparam_space()) == (5001, 300, PACS.hparam_space())
    finally:
        DATASETS.unregister("MyScans")
        plugins.forget("my_data.py")
        sys.modules.pop("my_data", None)


# --- downloads -------------------------------------------------------------------------------------

def closed_port_url(name: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"  # nothing listens there any more: connection refused


@pytest.mark.parametrize("name, attribute", [("officehome", "OFFICEHOME_ARCHIVE"), ("vlcs", "VLCS_ARCHIVE"),
                                             ("terraincognita", "TERRA_ANNOTATIONS")])
def test_offline_is_one_line_like_pacs(tmp_path, monkeypatch, capsys, name, attribute):
    dead = dl.Archive(closed_port_url("x.zip"), getattr(dl, attribute).filename)
    if name == "terraincognita":
        monkeypatch.setattr(dl, attribute, dead)
    else:
        use_archive(monkeypatch, name, dead)
    code = main(["-q", "download", "--dataset", name, "--data_dir", str(tmp_path)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("domaingen: error: cannot download http://127.0.0.1:")
    assert "check the network connection" in lines[0]


def zip_tree(folder: Path, archive: Path, arcroot: str) -> Path:
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(folder.rglob("*")):
            z.write(path, Path(arcroot) / path.relative_to(folder))
    return archive


def tar_tree(folder: Path, archive: Path, arcroot: str) -> Path:
    with tarfile.open(archive, "w:gz") as t:
        t.add(folder, arcname=arcroot)
    return archive


def test_office_home_is_extracted_renamed_and_verified(tmp_path, monkeypatch, capsys):
    classes = [f"class_{k:02d}" for k in range(65)]
    tree = make_folder_tree(tmp_path / "src", ["Art", "Clipart", "Product", "Real World"], classes, per_class=1, size=8)
    archive = zip_tree(tree, tmp_path / "served.zip", "OfficeHomeDataset_10072016")
    use_archive(monkeypatch, "officehome", dl.Archive(archive.as_uri(), "office_home.zip"))
    data_dir = tmp_path / "data"
    assert main(["-q", "download", "--dataset", "officehome", "--data_dir", str(data_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"OfficeHome is in {data_dir / 'office_home'} (4 domains, 65 classes)"
    assert sorted(os.listdir(data_dir / "office_home")) == ["Art", "Clipart", "Product", "Real_World"]
    dataset = DATASETS.get("OfficeHome")(str(data_dir), [0], SMALL)
    assert [len(env) for env in dataset.environments] == [65] * 4
    assert list((data_dir / "downloads").iterdir()) == []


def test_vlcs_archive_lacking_a_domain_is_refused_after_extraction(tmp_path, monkeypatch, capsys):
    classes = ["bird", "car", "chair", "dog", "person"]
    tree = make_folder_tree(tmp_path / "src", ["Caltech101", "LabelMe", "SUN09"], classes, per_class=1, size=8)
    archive = tar_tree(tree, tmp_path / "served.tar.gz", "VLCS")
    use_archive(monkeypatch, "vlcs", dl.Archive(archive.as_uri(), "VLCS.tar.gz"))
    code = main(["-q", "download", "--dataset", "vlcs", "--data_dir", str(tmp_path / "data")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "lacks the domain folder VOC2007" in err[0] and "delete" in err[0]


def test_terra_incognita_is_sorted_as_domainbed_sorts_it(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(0)
    categories = list(dl.TERRA_CATEGORIES) + ["deer"]  # deer is not one of DomainBed's ten
    images, annotations, expected = [], [], {}
    for i in range(60):
        location = ["100", "38", "43", "46", "7"][i % 5]  # 7 is not one of DomainBed's four locations
        category = categories[(i // 5) % len(categories)]
        name = f"img_{i}.jpg"
        write_image(tmp_path / "src" / "eccv_18_all_images_sm" / name, rng, 8)
        images.append({"id": f"id{i}", "file_name": name, "location": int(location)})
        annotations.append({"image_id": f"id{i}", "category_id": categories.index(category)})
        if location != "7" and category != "deer":
            expected[f"location_{location}/{category}/{name}"] = True
    data = {"images": images, "annotations": annotations,
            "categories": [{"id": k, "name": c} for k, c in enumerate(categories)]}
    with zipfile.ZipFile(tmp_path / "labels.zip", "w") as z:
        z.writestr("caltech_images_20210113.json", json.dumps(data))
    tar_tree(tmp_path / "src" / "eccv_18_all_images_sm", tmp_path / "images.tar.gz", "eccv_18_all_images_sm")
    monkeypatch.setattr(dl, "TERRA_ANNOTATIONS", dl.Archive((tmp_path / "labels.zip").as_uri(), "labels.zip"))
    monkeypatch.setattr(dl, "TERRA_IMAGES", dl.Archive((tmp_path / "images.tar.gz").as_uri(), "images.tar.gz"))
    data_dir = tmp_path / "data"
    assert main(["-q", "download", "--dataset", "terraincognita", "--data_dir", str(data_dir)]) == 0
    root = data_dir / "terra_incognita"
    written = {str(p.relative_to(root)) for p in root.rglob("*.jpg")}
    assert written == set(expected)
    dataset = DATASETS.get("TerraIncognita")(str(data_dir), [0], SMALL)
    # 11 blocks of 5 images that are not deer, each with one image of each of the four locations kept
    assert sum(len(env) for env in dataset.environments) == len(expected) == 44
