"""PACS and DomainNet on tiny generated folder trees: layout, classes, bad input, training end to end."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest
import torch

from domaingen.run import training
from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS, split_environments
from domaingen.datasets.images import PACS
from domaingen.datasets.loading import FileExamples, InfiniteTrainingBatches, resolve_workers
from domaingen.errors import DataNotFoundError, DomaingenError
from domaingen.networks import ResNet, build_featurizer
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from domaingen.testing import VOLATILE_FIELDS
from imagetree import make_folder_tree

PACS_DOMAINS = ["art_painting", "cartoon", "photo", "sketch"]
DOMAINNET_DOMAINS = ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]
CLASSES = ["giraffe", "dog", "horse"]  # not in sorted order on purpose
SMALL = {"backbone": "resnet18", "pretrained": False, "image_size": 32, "batch_size": 4, "num_workers": 0}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_folder_tree(root / "PACS", PACS_DOMAINS, CLASSES, per_class=3)
    make_folder_tree(root / "DomainNet", DOMAINNET_DOMAINS, CLASSES[:2], per_class=2, seed=1)
    return root


def copy_pacs(data_dir, tmp_path):
    shutil.copytree(data_dir / "PACS", tmp_path / "PACS")
    return tmp_path


@pytest.mark.parametrize("name, domains, n_classes, per_class", [
    ("PACS", PACS_DOMAINS, 3, 3), ("DomainNet", DOMAINNET_DOMAINS, 2, 2)])
def test_environments_and_classes_follow_the_folders(data_dir, name, domains, n_classes, per_class):
    dataset = DATASETS.get(name)(str(data_dir), [0], SMALL)
    root = data_dir / name
    assert [env.name for env in dataset.environments] == domains
    expected_classes = sorted(os.listdir(root / domains[0]))
    assert dataset.classes == expected_classes and dataset.num_classes == n_classes
    assert dataset.input_shape == (3, 32, 32)
    for env in dataset.environments:
        assert len(env) == n_classes * per_class
        for path, label in zip(env.paths, env.y.tolist()):
            # the label is the position of the file's class folder in the sorted class list
            assert os.path.basename(os.path.dirname(path)) == expected_classes[label]
            assert os.path.dirname(os.path.dirname(path)) == str(root / env.name)
    assert dataset.data_source == f"{name}-{len(domains) * n_classes * per_class}"


def test_published_protocol_constants():
    assert PACS.CHECKPOINT_FREQ == 300 and DATASETS.get("DomainNet").CHECKPOINT_FREQ == 1000
    space = PACS.hparam_space()
    assert space["lr"].default == 5e-5 and space["batch_size"].default == 32 and space["image_size"].default == 224
    assert str(space["batch_size"].sampler) == "int(2^U(3,5.5))"
    assert str(DATASETS.get("DomainNet").hparam_space()["batch_size"].sampler) == "int(2^U(3,5))"
    assert str(space["resnet_dropout"].sampler) == "choice{0.0,0.1,0.5}"


def test_eval_batch_is_resized_and_normalised(data_dir):
    dataset = PACS(str(data_dir), [0], SMALL)
    examples = dataset.examples()
    env = dataset.environments[2]
    x, y = examples[(2, 4, None)]
    from PIL import Image

    raw = np.asarray(Image.open(env.paths[4]).convert("RGB"), dtype=np.float32) / 255.0
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    expected = ((raw - mean) / std).transpose(2, 0, 1)  # 32x32 already: resize keeps the pixels
    np.testing.assert_allclose(x.numpy(), expected, atol=1e-5)
    assert y == int(env.y[4])


def test_training_augmentation_depends_only_on_its_seed(data_dir):
    dataset = PACS(str(data_dir), [0], SMALL)
    examples = dataset.examples()
    torch.manual_seed(1)
    a, _ = examples[(0, 1, 12345)]
    state = torch.get_rng_state()
    b, _ = examples[(0, 1, 12345)]
    c, _ = examples[(0, 1, 54321)]
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(state, torch.get_rng_state())  # the caller's generator is untouched
    assert a.shape == (3, 32, 32)


def test_training_batches_resume_where_they_stopped():
    splits = [(0, [5, 6, 7]), (2, [0, 1])]
    stream = iter(InfiniteTrainingBatches(splits, 4, seed=3))
    batches = [next(stream) for _ in range(5)]
    resumed = iter(InfiniteTrainingBatches(splits, 4, seed=3, start=3))
    assert next(resumed) == batches[3] and next(resumed) == batches[4]
    first = batches[0]
    assert [k[0] for k in first] == [0] * 4 + [2] * 4
    assert {k[1] for k in first[:4]} <= {5, 6, 7} and {k[1] for k in first[4:]} <= {0, 1}


def test_missing_domain_folder_is_named(data_dir, tmp_path):
    root = copy_pacs(data_dir, tmp_path)
    shutil.rmtree(root / "PACS" / "photo")
    with pytest.raises(DataNotFoundError) as info:
        PACS(str(root), [0], SMALL)
    message = str(info.value)
    assert "domain folder(s) photo missing" in message and str(root / "PACS") in message
    assert f"domaingen download --dataset pacs --data_dir {root}" in message


def test_missing_dataset_folder_says_how_to_download(tmp_path):
    with pytest.raises(DataNotFoundError, match="domaingen download --dataset domainnet"):
        DATASETS.get("DomainNet")(str(tmp_path), [0], SMALL)


def test_classes_that_differ_between_domains_are_an_error(data_dir, tmp_path):
    root = copy_pacs(data_dir, tmp_path)
    shutil.rmtree(root / "PACS" / "sketch" / "dog")
    (root / "PACS" / "sketch" / "zebra").mkdir()
    with pytest.raises(DomaingenError) as info:
        PACS(str(root), [0], SMALL)
    assert "class folders differ between domains" in str(info.value)
    assert "sketch lacks dog and has extra zebra" in str(info.value)


def test_corrupt_images_are_skipped_with_a_counted_warning(data_dir, tmp_path, caplog):
    root = copy_pacs(data_dir, tmp_path)
    (root / "PACS" / "cartoon" / "dog" / "broken.jpg").write_bytes(b"not an image at all")
    (root / "PACS" / "photo" / "horse" / "empty.png").write_bytes(b"")
    (root / "PACS" / "photo" / "horse" / "notes.txt").write_text("ignored: not an image extension")
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        dataset = PACS(str(root), [0], SMALL)
    assert [len(env) for env in dataset.environments] == [9, 9, 9, 9]
    assert dataset.skipped_files == 2
    assert "skipped 2 unreadable image file(s)" in caplog.text


def test_image_damaged_after_its_header_is_replaced_at_load_time(data_dir, tmp_path, caplog):
    root = copy_pacs(data_dir, tmp_path)
    dataset = PACS(str(root), [0], SMALL)
    victim = dataset.environments[1].paths[0]
    data = open(victim, "rb").read()
    open(victim, "wb").write(data[: len(data) // 3])  # a truncated JPEG: the header reads, the pixels do not
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        x, y = dataset.examples()[(1, 0, None)]
    assert "skipping unreadable image" in caplog.text and victim in caplog.text
    assert y == int(dataset.environments[1].y[1])  # the next example stood in


def test_worker_count_is_capped_by_the_machine(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert resolve_workers("auto") == 2 and resolve_workers(1) == 1 and resolve_workers(64) == 2
    with pytest.raises(DomaingenError, match="num_workers"):
        resolve_workers("many")


def test_resnet_exposes_named_blocks_and_freezes_batchnorm():
    net = build_featurizer((3, 32, 32), {"backbone": "resnet18", "pretrained": "false", "freeze_bn": True})
    assert isinstance(net, ResNet) and net.n_outputs == 512
    assert isinstance(net.resnet.fc, torch.nn.Identity)
    assert {"resnet.layer3", "resnet.layer4"} <= {name for name, _ in net.named_modules()}
    net.train()
    bn = net.resnet.bn1
    before = bn.running_mean.clone()
    net(torch.randn(4, 3, 32, 32) + 3.0)
    assert torch.equal(bn.running_mean, before) and not bn.training
    thawed = build_featurizer((3, 32, 32), {"backbone": "resnet18", "pretrained": False, "freeze_bn": False})
    thawed.train()
    thawed(torch.randn(4, 3, 32, 32) + 3.0)
    assert thawed.resnet.bn1.training and not torch.equal(thawed.resnet.bn1.running_mean, before)
    assert build_featurizer((3, 32, 32), {"backbone": "resnet50", "pretrained": False}).n_outputs == 2048


def test_random_initialisation_is_announced(caplog):
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        build_featurizer((3, 32, 32), {"backbone": "resnet18", "pretrained": False})
    assert "random initialisation (pretrained=false)" in caplog.text


def test_missing_imagenet_weights_say_where_to_put_them(tmp_path, monkeypatch):
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    monkeypatch.delenv("DOMAINGEN_WEIGHTS", raising=False)

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.__class__, "get_state_dict", offline)
    with pytest.raises(DomaingenError) as info:
        build_featurizer((3, 32, 32), {"backbone": "resnet18", "pretrained": True})
    message = str(info.value)
    assert "resnet18-f37072fd.pth" in message and str(tmp_path / "hub") in message
    assert '"pretrained": false' in message and "network is unreachable" in message


def test_weights_path_from_the_environment_is_loaded(tmp_path, monkeypatch):
    torch.manual_seed(0)
    reference = torchvision_resnet18_state()
    torch.save(reference, tmp_path / "resnet18-f37072fd.pth")
    monkeypatch.setenv("DOMAINGEN_WEIGHTS", str(tmp_path))
    net = build_featurizer((3, 32, 32), {"backbone": "resnet18", "pretrained": True})
    assert torch.equal(net.resnet.conv1.weight, reference["conv1.weight"])
    monkeypatch.setenv("DOMAINGEN_WEIGHTS", str(tmp_path / "absent.pth"))
    with pytest.raises(DomaingenError, match="absent.pth is not a file"):
        build_featurizer((3, 32, 32), {"backbone": "resnet18", "pretrained": True})


def torchvision_resnet18_state():
    import torchvision

    return torchvision.models.resnet18(weights=None).state_dict()


def config(out, data_dir, **kw) -> TrainConfig:
    base = dict(dataset="PACS", algorithm="ERM", output_dir=str(out), test_envs=[3], data_dir=str(data_dir),
                hparams=dict(SMALL), steps=3, checkpoint_freq=2)
    base.update(kw)
    return TrainConfig(**base)




def stable(records):
    return [{k: v for k, v in r.items() if k not in VOLATILE_FIELDS} for r in records]


def test_erm_trains_and_evaluates_end_to_end(data_dir, tmp_path):
    # paired: every split evaluated with the plain transform, as the direct computation below reads them
    cfg = config(tmp_path / "run", data_dir, protocol="paired")
    outcome = train(cfg)
    assert outcome.state == "done"
    records = RunDirectory(tmp_path / "run").records()
    assert [r["step"] for r in records] == [0, 2]
    last = records[-1]
    assert {f"env{i}_{s}_acc" for i in range(4) for s in ("in", "out")} <= set(last)
    assert last["data_source"] == "PACS-36" and last["hparams"]["backbone"] == "resnet18"
    # recorded accuracy equals a direct computation: the checkpoint's model on images read in-process
    run = training.resolve(cfg)
    dataset = PACS(str(data_dir), [3], run.hparams)
    dataset.examples()  # sets the evaluation transform on the environments
    model = ALGORITHMS.get("ERM")(dataset.input_shape, 3, 3, run.hparams)
    model.load_checkpoint_state(torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["algorithm"])
    model.eval()
    for i, (split_in, split_out) in enumerate(split_environments(dataset, 0.2, trial_seed=0)):
        for name, split in (("in", split_in), ("out", split_out)):
            x, y = split.batch(slice(None))
            with torch.no_grad():
                predicted = model.predict(x).argmax(1)
            assert last[f"env{i}_{name}_acc"] == pytest.approx((predicted == y).float().mean().item())


def test_worker_processes_give_the_same_run_and_resume_exactly(data_dir, tmp_path, monkeypatch):
    straight = train(config(tmp_path / "straight", data_dir, steps=4)).records
    calls = {"n": 0}
    real_evaluate = training.evaluate

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # after the checkpoint at step 0, during the one at step 2
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    two_workers = {**SMALL, "num_workers": 2}
    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed", data_dir, steps=4, hparams=two_workers))
    monkeypatch.setattr(training, "evaluate", real_evaluate)
    resumed = train(config(tmp_path / "resumed", data_dir, steps=4, hparams=two_workers)).records
    drop = VOLATILE_FIELDS | {"hparams"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == \
        [{k: v for k, v in r.items() if k not in drop} for r in straight]
