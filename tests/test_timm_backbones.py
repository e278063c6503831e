"""timm models as featurizers, DomainBed HEAD's backbone names, and their bad input (tiny models, no weights downloaded)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from domaingen.cli import main as cli_main
from domaingen.errors import DomaingenError
from domaingen.networks import backbone_of, build_featurizer, check_backbone, describe_backbone, timm_models
from domaingen.run.reload import evaluate_run, load_run
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from imagetree import make_folder_tree

timm = pytest.importorskip("timm", reason="timm backbones need the [timm] extra: pip install timm")

PACS_DOMAINS = ["art_painting", "cartoon", "photo", "sketch"]
TINY = {"pretrained": False, "image_size": 32, "batch_size": 2, "num_workers": 0}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_folder_tree(root / "PACS", PACS_DOMAINS, ["dog", "horse"], per_class=5)
    return root


def reference_model(name: str, size: int = 32) -> torch.nn.Module:
    """The same timm model built directly, with its 1000-class head (what a weights file holds)."""
    kwargs = {"img_size": size} if timm.models.get_pretrained_cfg(name).fixed_input_size else {}
    return timm.create_model(name, pretrained=False, **kwargs)


@pytest.mark.parametrize("name", ["resnet10t", "test_vit"])
def test_features_are_the_models_pooled_output(name):
    torch.manual_seed(0)
    net = build_featurizer((3, 32, 32), {"backbone": f"timm:{name}", "pretrained": False})
    reference = reference_model(name)
    reference.load_state_dict(net.model.state_dict(), strict=False)  # the head stays the reference's own
    reference.eval(), net.eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = reference.forward_head(reference.forward_features(x), pre_logits=True)
        assert torch.allclose(net(x), expected, atol=1e-6)
    assert net.n_outputs == reference.num_features == expected.shape[1]


def test_batchnorm_is_frozen_unless_asked_and_dropout_follows_the_family():
    frozen = build_featurizer((3, 32, 32), {"backbone": "timm:resnet10t", "pretrained": False, "resnet_dropout": 0.5,
                                            "vit_dropout": 0.1})
    bns = [m for m in frozen.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    before = [bn.running_mean.clone() for bn in bns]
    frozen.train()
    frozen(torch.randn(4, 3, 32, 32))
    assert bns and all(not bn.training for bn in bns)
    assert all(torch.equal(b, bn.running_mean) for b, bn in zip(before, bns))
    assert frozen.dropout.p == 0.5  # a CNN takes resnet_dropout
    thawed = build_featurizer((3, 32, 32), {"backbone": "timm:resnet10t", "pretrained": False, "freeze_bn": False})
    thawed.train()
    bn = next(m for m in thawed.modules() if isinstance(m, torch.nn.BatchNorm2d))
    start = bn.running_mean.clone()
    thawed(torch.randn(4, 3, 32, 32))
    assert bn.training and not torch.equal(start, bn.running_mean)
    vit = build_featurizer((3, 32, 32), {"backbone": "timm:test_vit", "pretrained": False, "resnet_dropout": 0.5,
                                         "vit_dropout": 0.1, "vit_attn_tune": True})
    assert vit.dropout.p == 0.1  # a ViT takes vit_dropout
    trainable = {n for n, p in vit.model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in vit.model.named_parameters() if "attn" in n} and trainable


def test_a_weights_file_the_test_writes_is_loaded_without_its_head(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    torch.manual_seed(1)
    reference = reference_model("resnet10t")
    save_file(reference.state_dict(), str(tmp_path / "resnet10t.c3_in1k.safetensors"))
    monkeypatch.setenv("DOMAINGEN_WEIGHTS", str(tmp_path))
    net = build_featurizer((3, 32, 32), {"backbone": "timm:resnet10t", "pretrained": True})
    own = net.model.state_dict()
    assert own.keys() == {k for k in reference.state_dict() if not k.startswith("fc.")}
    assert all(torch.equal(own[k], reference.state_dict()[k]) for k in own)
    # a torch file named by the architecture alone is found too
    (tmp_path / "resnet10t.c3_in1k.safetensors").unlink()
    torch.save(reference.state_dict(), tmp_path / "resnet10t.pth")
    net = build_featurizer((3, 32, 32), {"backbone": "timm:resnet10t", "pretrained": True})
    assert torch.equal(net.model.conv1[0].weight, reference.conv1[0].weight)


def test_a_weights_file_of_another_architecture_is_refused_naming_the_file_and_first_missing_key(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    wrong = tmp_path / "resnet10t.c3_in1k.safetensors"
    save_file(reference_model("test_vit").state_dict(), str(wrong))
    monkeypatch.setenv("DOMAINGEN_WEIGHTS", str(tmp_path))
    first_key = next(iter(timm.create_model("resnet10t", num_classes=0).state_dict()))
    with pytest.raises(DomaingenError) as info:
        check_backbone({"backbone": "timm:resnet10t", "pretrained": True, "image_size": 32})
    message = str(info.value)
    assert str(wrong) in message and f"'{first_key}'" in message and "\n" not in message


def test_unknown_timm_name_lists_the_closest_names_and_writes_nothing(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    hparams = json.dumps({**TINY, "backbone": "timm:resnet10x"})
    code = cli_main(["train", "--dataset", "PACS", "--algorithm", "ERM", "--test_envs", "3", "--data_dir", str(data_dir),
                     "--output_dir", str(out), "--steps", "1", "--hparams", hparams])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert "unknown timm model 'resnet10x'" in err and "resnet10t" in err and len(err.splitlines()) == 1


def test_timm_missing_gives_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "timm" else real(name, *a))
    with pytest.raises(DomaingenError, match=r"pip install 'domaingen-bench\[timm\]'"):
        check_backbone({"backbone": "resnet50_augmix"})


def test_no_weights_and_no_network_say_which_file_to_put_where(tmp_path, monkeypatch):
    monkeypatch.delenv("DOMAINGEN_WEIGHTS", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the hub client reads HF_HUB_OFFLINE when it is imported: without its constant set too, the
    # download would wait through the retries of a machine without network (about 47 s)
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DomaingenError) as info:
        build_featurizer((3, 32, 32), {"backbone": "timm:resnet10t", "pretrained": True})
    message = str(info.value)
    assert "resnet10t.c3_in1k.safetensors" in message and "huggingface.co/timm/resnet10t.c3_in1k" in message
    assert "$DOMAINGEN_WEIGHTS" in message and '"pretrained": false' in message


@pytest.mark.parametrize("hparams, expected", [
    ({"backbone": "resnet50"}, "resnet50"),
    ({"backbone": "resnet50", "resnet18": True}, "resnet18"),
    ({"backbone": "resnet50", "resnet18": True, "resnet50_augmix": True}, "resnet50_augmix"),  # DomainBed's precedence
    ({"backbone": "resnet50", "vit": True, "dinov2": True, "resnet50_augmix": True}, "dinov2"),
    ({"backbone": "timm:resnet10t"}, "timm:resnet10t"),
    ({}, None),
])
def test_domainbed_head_flags_choose_the_backbone(hparams, expected):
    assert backbone_of(hparams) == expected


@pytest.mark.parametrize("hparams, fragment", [
    ({"vit": True}, "set vit and dinov2 both true"),
    ({"dinov2": True}, "set vit and dinov2 both true"),
    ({"backbone": "timm:resnet10t", "resnet50_augmix": True}, "name two backbones"),
    ({"backbone": "resnet18", "vit_attn_tune": True}, "set vit_attn_tune false"),
    ({"backbone": "resnet34"}, "unknown backbone 'resnet34'"),
])
def test_inconsistent_backbone_choices_are_refused_in_one_line(hparams, fragment):
    with pytest.raises(DomaingenError, match=fragment) as info:
        check_backbone(hparams)
    assert "\n" not in str(info.value)


def test_dinov2_features_are_domainbeds_four_class_tokens_and_mean_patch_token():
    net = timm_models.TimmFeaturizer((3, 32, 32), "test_vit", pretrained=False, features="dinov2").eval()
    vit = net.model
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # the blocks run by hand: DomainBed's get_intermediate_layers(n=4, return_class_token=True)
        h = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
        outs = []
        for block in vit.blocks:
            h = block(h)
            outs.append(vit.norm(h))
        last4 = outs[-4:]
        expected = torch.cat([o[:, 0] for o in last4] + [last4[-1][:, vit.num_prefix_tokens:].mean(1)], dim=1)
        assert torch.allclose(net(x), expected, atol=1e-5)
    assert net.n_outputs == 5 * vit.num_features


@pytest.mark.parametrize("backbone", ["timm:resnet10t", "timm:test_vit"])
def test_a_timm_backbone_trains_on_a_pacs_tree_and_reloads(data_dir, tmp_path, backbone):
    out = tmp_path / "run"
    outcome = train(TrainConfig(dataset="PACS", algorithm="ERM", output_dir=str(out), test_envs=[3],
                                data_dir=str(data_dir), hparams={**TINY, "backbone": backbone}, steps=2,
                                checkpoint_freq=1))
    assert outcome.state == "done"
    last = RunDirectory(out).records()[-1]
    loaded = load_run(out, checkpoint="last")
    assert isinstance(loaded.algorithm.featurizer, timm_models.TimmFeaturizer)
    again = evaluate_run(loaded)
    recorded = {k: v for k, v in last.items() if k.endswith("_acc")}
    assert recorded and {k: again[k] for k in recorded} == pytest.approx(recorded)
    assert describe_backbone(last["hparams"]) == f"{backbone}, BatchNorm frozen"


def test_table_captions_name_the_backbone_and_batchnorm_rule(data_dir, tmp_path, capsys):
    for name, extra in (("a", {"backbone": "timm:resnet10t"}), ("b", {"backbone": "timm:resnet10t", "freeze_bn": False})):
        train(TrainConfig(dataset="PACS", algorithm="ERM", output_dir=str(tmp_path / name / "run"), test_envs=[3],
                          data_dir=str(data_dir), hparams={**TINY, **extra}, steps=1, checkpoint_freq=1))
    assert cli_main(["collect", "--input_dir", str(tmp_path / "a"), "--selection", "oracle"]) == 0
    assert "data: PACS-40; backbone timm:resnet10t, BatchNorm frozen; protocol: domainbed)" in capsys.readouterr().out
    assert cli_main(["collect", "--input_dir", str(tmp_path / "b"), "--selection", "oracle"]) == 0
    assert "; backbone timm:resnet10t, BatchNorm updating; protocol: domainbed)" in capsys.readouterr().out
    # DomainBed's own records: 2021 (no freeze_bn, ResNet always frozen) and HEAD (AugMix, updating)
    assert describe_backbone({"resnet18": False, "resnet_dropout": 0.0}) == "resnet50, BatchNorm frozen"
    assert describe_backbone({"resnet18": False, "resnet50_augmix": True, "freeze_bn": False, "resnet_dropout": 0.0}) \
        == "resnet50_augmix, BatchNorm updating"
