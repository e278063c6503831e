"""timm models as featurizers: any `timm:NAME`, DomainBed HEAD's AugMix ResNet-50 and its DINOv2 ViT-B/14.

The features are the model's pooled output (`num_classes=0`, width `num_features`);
models with a fixed input size (ViTs) are built at the run's image size, their position
embeddings resampled by timm when weights load. timm is an optional extra:
`pip install 'domaingen-bench[timm]'`.

Pretrained weights, in this order: `$DOMAINGEN_WEIGHTS` (a weights file, or a folder
holding `<name>.safetensors` / `.pth` / `.bin`, `<name>/model.safetensors`, or the file
named in the model's download URL; `<name>` is `architecture.tag`, e.g.
`resnet50.ram_in1k`), else timm's own cache (the Hugging Face hub cache), else downloaded
by timm. A file whose keys do not fit the architecture is refused naming the file and the
first missing key; the classifier head's keys are dropped (the head is domaingen's). On a
machine without network (a cluster's compute nodes), set `HF_HUB_OFFLINE=1`: the hub client
otherwise spends about 45 s in every job retrying the download (measured with huggingface_hub
2.4 on a machine without network and without the weights cached) before it fails.

Departures from DomainBed, stated: DomainBed loads DINOv2 from torch hub
(facebookresearch/dinov2, `dinov2_vitb14`) and interpolates its position embedding at
every forward; here the same weights come through timm (`vit_base_patch14_dinov2.lvd142m`)
with the embedding resampled once to `image_size`. Inputs are normalised with ImageNet's
mean and std, as DomainBed does for every backbone, whatever the model's own
pretrained configuration says (CLIP models were trained with other statistics).
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from domaingen.errors import DomaingenError

log = logging.getLogger(__name__)

WEIGHTS_ENV = "DOMAINGEN_WEIGHTS"
INSTALL = "pip install 'domaingen-bench[timm]' (or: pip install timm)"
# DomainBed HEAD's named backbones and the timm models behind them
AUGMIX_RESNET50 = "resnet50.ram_in1k"
DINOV2_VITB14 = "vit_base_patch14_dinov2.lvd142m"
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".bin", ".pt")


def require_timm() -> Any:
    """The timm module; raises DomaingenError with the install command when it is missing."""
    if importlib.util.find_spec("timm") is None:
        raise DomaingenError(f"timm backbones need the timm package, which is not installed; {INSTALL}")
    import timm

    return timm


def check_model_name(name: str) -> None:
    """Raise DomaingenError for a name timm does not know, listing the closest names it does."""
    timm = require_timm()
    arch, _, tag = name.partition(".")
    known = timm.list_models(pretrained=True) if tag else timm.list_models()
    if (name if tag else arch) in known:
        return
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5) or difflib.get_close_matches(
        arch, timm.list_models(), n=5, cutoff=0.5)
    hint = f"closest timm names: {', '.join(close)}" if close else "see timm.list_models() for the names timm knows"
    raise DomaingenError(f"unknown timm model '{name}'; {hint}")


def create_options(name: str, input_shape: Sequence[int]) -> dict[str, Any]:
    """`timm.create_model`'s arguments for a headless model on inputs of `input_shape` (C, H, W):
    the input channels, and the image size for models with a fixed input size (ViTs)."""
    timm = require_timm()
    options: dict[str, Any] = {"num_classes": 0, "in_chans": int(input_shape[0])}
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is not None and cfg.fixed_input_size:
        options["img_size"] = tuple(int(s) for s in input_shape[1:])
    return options


def create(name: str, input_shape: Sequence[int]) -> nn.Module:
    """`timm.create_model(name)` without weights and without a head, for inputs of `input_shape` (C, H, W)."""
    check_model_name(name)
    return require_timm().create_model(name, pretrained=False, **create_options(name, input_shape))


def full_name(model: nn.Module, name: str) -> str:
    """`architecture.tag` of a timm model (the default tag when `name` gives none)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    arch, tag = cfg.get("architecture"), cfg.get("tag")
    return f"{arch}.{tag}" if arch and tag else name


def weights_file(model: nn.Module, name: str) -> Path | None:
    """The weights file $DOMAINGEN_WEIGHTS gives for this model, None when the variable is unset.

    Raises DomaingenError saying which file to put where when it is set but holds none.
    """
    given = os.environ.get(WEIGHTS_ENV)
    if not given:
        return None
    path = Path(given).expanduser()
    full = full_name(model, name)
    if path.is_file():
        return path
    if not path.is_dir():
        raise DomaingenError(f"${WEIGHTS_ENV} is {given}, which is neither a file nor a folder; "
                             f"point it at {full}.safetensors or at a folder holding it")
    url = (getattr(model, "pretrained_cfg", None) or {}).get("url") or ""
    candidates = [path / f"{stem}{suffix}" for stem in dict.fromkeys((full, name)) for suffix in WEIGHT_SUFFIXES]
    candidates += [path / full / "model.safetensors", path / full / "pytorch_model.bin"]
    if url:
        candidates.append(path / url.rsplit("/", 1)[-1])
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise DomaingenError(f"${WEIGHTS_ENV} is {given}, but it holds no weights for {full}; put {full}.safetensors "
                         f"({download_hint(model)}) there")


def download_hint(model: nn.Module) -> str:
    """Where the model's pretrained weights are published, for messages."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if cfg.get("hf_hub_id"):
        return f"the model.safetensors of https://huggingface.co/{cfg['hf_hub_id']}"
    return cfg.get("url") or "timm's pretrained weights"


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a .safetensors or a torch file (a checkpoint's 'state_dict'/'model' entry unwrapped)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise DomaingenError(f"{path} holds no state dict (a mapping of names to tensors); give a weights file")
    return state


def fit_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """`state` restricted to `model`'s keys: the classifier head dropped, a first convolution with other
    input channels adapted as timm does; raises DomaingenError naming `path` and the first missing or
    misshapen key."""
    from timm.models import adapt_input_conv

    cfg = getattr(model, "pretrained_cfg", None) or {}
    heads = cfg.get("classifier") or ()
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    own = model.state_dict()
    fitted: dict[str, torch.Tensor] = {}
    first_conv = f"{cfg.get('first_conv')}.weight"
    for key, target in own.items():
        if key not in state:
            raise DomaingenError(f"{path} does not fit {full_name(model, type(model).__name__)}: it has no "
                                 f"'{key}' (the first of the model's keys it lacks); give that model's weights")
        value = state[key]
        if key == first_conv and value.dim() == 4 and value.shape[1] != target.shape[1]:
            value = adapt_input_conv(target.shape[1], value)
        if tuple(value.shape) != tuple(target.shape):
            raise DomaingenError(f"{path} does not fit {full_name(model, type(model).__name__)}: '{key}' has shape "
                                 f"{tuple(value.shape)}, the model's {tuple(target.shape)}; give that model's weights")
        fitted[key] = value
    leftover = [k for k in state if k not in own and not any(k.startswith(h + ".") or k == h for h in heads)]
    if leftover:
        log.warning("%s: %d keys the model does not use were left out (first: %s)", path, len(leftover), leftover[0])
    return fitted


def load_pretrained(model: nn.Module, name: str, input_shape: Sequence[int]) -> None:
    """Load pretrained weights into `model` (see the module docstring for where they come from)."""
    path = weights_file(model, name)
    if path is not None:
        model.load_state_dict(fit_state_dict(model, read_state_dict(path), path))
        log.info("loaded %s weights from %s", full_name(model, name), path)
        return
    timm = require_timm()
    try:
        loaded = timm.create_model(name, pretrained=True, **create_options(name, input_shape))
    except Exception as exc:  # offline, proxy, disk, a hub client that fails to import: the fix is the same
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        full = full_name(model, name)
        raise DomaingenError(
            f"pretrained weights of {full} not found and could not be downloaded ({reason}); put {full}.safetensors "
            f"({download_hint(model)}) in a folder and point ${WEIGHTS_ENV} at it, "
            """or train from random initialisation with --hparams '{"pretrained": false}'""") from None
    model.load_state_dict(loaded.state_dict())


def check_weights(name: str, input_shape: Sequence[int]) -> None:
    """Raise before a run writes anything when $DOMAINGEN_WEIGHTS gives no file that fits `name`.

    Builds the model on the meta device (no memory), so the check costs a key comparison.
    """
    with torch.device("meta"):
        model = create(name, input_shape)
    path = weights_file(model, name)
    if path is not None:
        fit_state_dict(model, read_state_dict(path), path)


def freeze_batchnorm(module: nn.Module) -> None:
    """Put every BatchNorm layer of `module` in eval mode: running statistics frozen, affine weights trained."""
    for child in module.modules():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            child.eval()


def is_vit(model: nn.Module) -> bool:
    """Whether a timm model is a vision transformer (its dropout is `vit_dropout`, not `resnet_dropout`)."""
    return hasattr(model, "blocks") and hasattr(model, "patch_embed")


class TimmFeaturizer(nn.Module):
    """A timm model without its head, then dropout: the features are its pooled output.

    `features` selects what is returned: "pooled" (the model's pooled output, width
    `num_features`) or "dinov2" (DomainBed's DinoV2 featurizer: the class tokens of the
    last four blocks and the mean patch token of the last, normalised, concatenated: 5 x
    the width). With `freeze_bn` the model's BatchNorm layers stay in eval mode; with
    `attn_only` only parameters whose name holds 'attn' train (DomainBed's `vit_attn_tune`).
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        name: str,
        pretrained: bool = True,
        freeze_bn: bool = True,
        dropout: float | None = None,
        resnet_dropout: float = 0.0,
        vit_dropout: float = 0.0,
        features: str = "pooled",
        attn_only: bool = False,
    ) -> None:
        super().__init__()
        self.model = create(name, input_shape)
        self.name = name
        if pretrained:
            load_pretrained(self.model, name, input_shape)
        else:
            log.warning("%s starts from random initialisation (pretrained=false); accuracies are not "
                        "comparable with the published pretrained numbers", name)
        self.features = features
        width = int(self.model.num_features)
        self.n_outputs = 5 * width if features == "dinov2" else width
        if dropout is None:
            dropout = vit_dropout if is_vit(self.model) else resnet_dropout
        self.dropout = nn.Dropout(float(dropout))
        if attn_only:
            tuned = [p for n, p in self.model.named_parameters() if "attn" in n]
            if not tuned:
                raise DomaingenError(f"vit_attn_tune trains attention parameters only, but {name} has none; "
                                     "set vit_attn_tune false")
            for param_name, param in self.model.named_parameters():
                param.requires_grad_("attn" in param_name)
        self.freeze_bn = freeze_bn
        self.train()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.features == "dinov2":
            return self.dropout(self._dinov2_features(x))
        return self.dropout(self.model(x))

    def _dinov2_features(self, x: torch.Tensor) -> torch.Tensor:
        layers = self.model.forward_intermediates(x, indices=4, norm=True, output_fmt="NLC",
                                                 return_prefix_tokens=True, intermediates_only=True)
        class_tokens = [prefix[:, 0] for _, prefix in layers]
        return torch.cat(class_tokens + [layers[-1][0].mean(1)], dim=1)

    def train(self, mode: bool = True) -> "TimmFeaturizer":
        super().train(mode)
        if self.freeze_bn:
            freeze_batchnorm(self.model)
        return self
