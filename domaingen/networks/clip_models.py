"""CLIP-like models (open_clip) as featurizers, and the text classifier of their zero-shot prediction.

The backbone `clip:MODEL` or `clip:MODEL:TAG` names an open_clip model and its pretrained
weights (`clip:ViT-B-32`, `clip:ViT-B-32:laion2b_s34b_b79k`; without a tag, `openai` where the
model has it, else its first tag). The featurizer is the image tower: its features are the
projected image embedding (width `embed_dim`), unnormalised; the zero-shot classifier is the
text tower's embedding of each class's prompts, normalised, averaged over the templates and
normalised again (Radford et al., 2021), and its logits are the model's logit scale times the
cosine similarity. `clip:domaingen-tiny` is a two-layer model of about 1.6M parameters with no
pretrained weights (`pretrained: false`), for tests. open_clip is an optional extra:
`pip install 'domaingen-bench[clip]'`.

Pretrained weights, in this order: `$DOMAINGEN_WEIGHTS` (a weights file, or a folder holding
`MODEL-TAG.safetensors` / `.bin` / `.pt`, or `MODEL-TAG/open_clip_model.safetensors`), else the
Hugging Face hub cache (downloaded there by open_clip when absent). On a machine without
network set `HF_HUB_OFFLINE=1` so the hub client reads its cache without retrying downloads.

Inputs: images are resized (bilinear) to the model's image size; one channel is repeated to
three, two channels (ColoredMNIST's red and green) get an empty blue channel. Inputs keep the
dataset's normalisation (ImageNet's mean and std for image datasets), not CLIP's own, as the
timm backbones do.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.errors import DomaingenError

log = logging.getLogger(__name__)

WEIGHTS_ENV = "DOMAINGEN_WEIGHTS"
INSTALL = "pip install 'domaingen-bench[clip]' (or: pip install open_clip_torch)"
PREFIX = "clip:"
TINY = "domaingen-tiny"
CONFIGS = Path(__file__).parent / "clip_configs"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
DEFAULT_TEMPLATES = ("a photo of a {}.",)


def require_open_clip() -> Any:
    """The open_clip module with domaingen's model configs added; raises DomaingenError when it is missing."""
    if importlib.util.find_spec("open_clip") is None:
        raise DomaingenError(f"CLIP backbones need the open_clip package, which is not installed; {INSTALL}")
    import open_clip

    if TINY not in open_clip.list_models():
        open_clip.add_model_config(CONFIGS)
    return open_clip


def is_clip(backbone: str | None) -> bool:
    """Whether `backbone` names a CLIP model (`clip:MODEL[:TAG]`)."""
    return isinstance(backbone, str) and backbone.startswith(PREFIX)


def parse(backbone: str) -> tuple[str, str | None]:
    """(model, tag) of `clip:MODEL[:TAG]`; the tag is None when not given. Raises for an unknown model."""
    model, _, tag = backbone[len(PREFIX):].partition(":")
    known = require_open_clip().list_models()
    if model not in known:
        close = difflib.get_close_matches(model, known, n=5, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else f"valid models: {', '.join(known)}"
        raise DomaingenError(f"unknown CLIP model '{model}' in backbone '{backbone}'; {hint}")
    return model, tag or None


def resolve_tag(model: str, tag: str | None) -> str:
    """The pretrained tag to load: `tag`, else `openai` where the model has it, else its first tag."""
    tags = require_open_clip().list_pretrained_tags_by_model(model)
    if not tags:
        raise DomaingenError(f"open_clip has no pretrained weights for CLIP model '{model}'; train it from random "
                             """initialisation with --hparams '{"pretrained": false}'""")
    if tag is None:
        return "openai" if "openai" in tags else tags[0]
    if tag not in tags:
        raise DomaingenError(f"CLIP model '{model}' has no pretrained tag '{tag}'; valid tags: {', '.join(tags)}")
    return tag


def weights_file(model: str, tag: str) -> Path | None:
    """The weights file $DOMAINGEN_WEIGHTS gives for `model`-`tag`, None when the variable is unset.

    Raises DomaingenError saying which file to put where when it is set but holds none.
    """
    given = os.environ.get(WEIGHTS_ENV)
    if not given:
        return None
    path = Path(given).expanduser()
    if path.is_file():
        return path
    stem = f"{model}-{tag}"
    if path.is_dir():
        candidates = [path / f"{stem}{suffix}" for suffix in WEIGHT_SUFFIXES]
        candidates += [path / stem / "open_clip_model.safetensors", path / stem / "open_clip_pytorch_model.bin"]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
    raise DomaingenError(f"${WEIGHTS_ENV} is {given}, but it holds no weights for CLIP {model} ({tag}); put "
                         f"{stem}.safetensors ({download_hint(model, tag)}) there")


def download_hint(model: str, tag: str) -> str:
    """Where open_clip's weights of `model`-`tag` are published, for messages."""
    from open_clip.pretrained import get_pretrained_cfg

    cfg = get_pretrained_cfg(model, tag) or {}
    if cfg.get("hf_hub"):
        return f"the open_clip_model.safetensors of https://huggingface.co/{cfg['hf_hub'].rstrip('/')}"
    return cfg.get("url") or "open_clip's pretrained weights"


def check_weights(backbone: str, pretrained: bool) -> None:
    """Raise, before a run writes anything, for an unknown model or tag, or $DOMAINGEN_WEIGHTS without its file."""
    model, tag = parse(backbone)
    if pretrained:
        weights_file(model, resolve_tag(model, tag))


def create(backbone: str, pretrained: bool) -> nn.Module:
    """The open_clip model `backbone` names (both towers), with its pretrained weights unless `pretrained` is false."""
    open_clip = require_open_clip()
    model, tag = parse(backbone)
    if not pretrained:
        log.warning("%s starts from random initialisation (pretrained=false); accuracies are not comparable with "
                    "the published pretrained numbers", backbone)
        return open_clip.create_model(model, pretrained=None)
    tag = resolve_tag(model, tag)
    from open_clip.pretrained import get_pretrained_cfg

    quick_gelu = bool((get_pretrained_cfg(model, tag) or {}).get("quick_gelu", False))
    path = weights_file(model, tag)
    try:
        if path is not None:
            return open_clip.create_model(model, pretrained=str(path), force_quick_gelu=quick_gelu)
        return open_clip.create_model(model, pretrained=tag)
    except Exception as exc:  # offline, proxy, disk, a file of another model: the user's fix is the same
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise DomaingenError(
            f"pretrained weights of CLIP {model} ({tag}) not found and could not be loaded ({reason}); put "
            f"{model}-{tag}.safetensors ({download_hint(model, tag)}) in a folder and point ${WEIGHTS_ENV} at it, "
            """or train from random initialisation with --hparams '{"pretrained": false}'""") from None


def as_rgb(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Images of 1, 2 or 3 channels as 3-channel images of height and width `size` (see the module docstring)."""
    channels = x.shape[1]
    if channels == 1:
        x = x.expand(-1, 3, -1, -1)
    elif channels == 2:
        x = torch.cat([x, torch.zeros_like(x[:, :1])], dim=1)
    if tuple(x.shape[-2:]) != tuple(size):
        x = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)
    return x


def prompt_text(name: str) -> str:
    """A class name as prompts read it: folder names' underscores as spaces ('Alarm_Clock' -> 'Alarm Clock')."""
    return name.replace("_", " ").strip()


class CLIPFeaturizer(nn.Module):
    """The image tower of a CLIP model: images -> its projected image embedding (width `n_outputs`).

    The text tower is kept outside the module tree (so it is neither trained, checkpointed nor
    averaged): `text_classifier` uses it to embed class names.
    """

    def __init__(self, input_shape: Sequence[int], backbone: str, pretrained: bool = True) -> None:
        super().__init__()
        if len(input_shape) != 3 or input_shape[0] not in (1, 2, 3):
            raise DomaingenError(f"a CLIP backbone needs images of 1, 2 or 3 channels, got shape {tuple(input_shape)}")
        clip = create(backbone, pretrained)
        self.backbone = backbone
        self.visual = clip.visual
        self.image_size = tuple(getattr(clip.visual, "image_size", (224, 224)))
        self.logit_scale = float(clip.logit_scale.detach().exp())
        self.n_outputs = int(require_open_clip().get_model_config(parse(backbone)[0])["embed_dim"])
        self._text = [clip]  # a list: not a submodule
        self.train()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.visual(as_rgb(x, self.image_size))

    @torch.no_grad()
    def text_classifier(self, class_names: Sequence[str], templates: Sequence[str]) -> torch.Tensor:
        """(classes, n_outputs): per class, the normalised mean of its prompts' normalised text embeddings."""
        open_clip = require_open_clip()
        clip = self._text[0]
        tokenizer = open_clip.get_tokenizer(parse(self.backbone)[0])
        device = next(self.visual.parameters()).device
        clip.to(device)
        rows = []
        for name in class_names:
            tokens = tokenizer([t.format(prompt_text(name)) for t in templates]).to(device)
            embedded = F.normalize(clip.encode_text(tokens).float(), dim=-1)
            rows.append(F.normalize(embedded.mean(0), dim=0))
        return torch.stack(rows)


def check_templates(value: Any) -> tuple[str, ...]:
    """The prompt templates of `clip_prompt`: one string, or templates separated by '|', each with one '{}'."""
    templates = tuple(t.strip() for t in str(value).split("|") if t.strip())
    bad = [t for t in templates if t.count("{}") != 1]
    if not templates or bad:
        raise DomaingenError(f"clip_prompt must be templates separated by '|', each with one '{{}}' for the class "
                             f"name (e.g. \"a photo of a {{}}.|a sketch of a {{}}.\"), got {value!r}")
    return templates
