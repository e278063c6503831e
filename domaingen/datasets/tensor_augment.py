"""DomainBed's image transforms on uint8 tensors (torchvision.transforms.v2), for the decoded-image cache.

`tensor_train_transform(size)` takes a (3, size, size) uint8 tensor and applies DomainBed's
augmentation: RandomResizedCrop(size, scale=(0.7, 1.0)), RandomHorizontalFlip, ColorJitter(0.3,
0.3, 0.3, 0.3), RandomGrayscale(0.1), then ImageNet normalisation. Its random parameters are
drawn from torch's global generator by the same calls, in the same order, as the PIL pipeline
of `loading.train_transform`, so under one seed both draw the same crop box (for inputs of the
same size), flip, jitter factors and order, and grey decision.

What differs from the PIL path:

- the pixels are converted to float after the flip, so the four colour adjustments round once,
  at the end, where PIL rounds to uint8 after each (differences of a grey level or two);
- the training loader (`CachedExamples`) normalises with `normalize_into`, one multiply-add written
  into a slot of a channels-last batch, equal to Normalize within float rounding (about 1e-6);
- hue is rotated by `adjust_hue_hexcone`, the same HSV (hexcone) rotation as torchvision's
  `adjust_hue` in closed form (equal to it within 1e-5, and four times faster);
- **named departure: crops of the square cache.** The crop is drawn on the cached image, which
  is the original resized to size x size, not on the original. For a square original this is
  the same distribution (a box of relative area s and aspect ratio r in one is a box of area s
  and ratio r in the other), at the cache's resolution. For an original of aspect ratio
  a = width / height, a box of aspect ratio r in the squashed image is a box of aspect ratio
  r * a in the original, so the object's aspect is distorted by r * a (evaluation's resize
  distorts it by a) where the PIL path distorts it by r; the relative area distribution is
  unchanged. Detail finer than the cache's resolution is lost, since crops are enlarged from it.
"""

from __future__ import annotations

from typing import Any

import torch
from torchvision.transforms import functional as F1
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from domaingen.datasets.base import IMAGENET_MEAN, IMAGENET_STD


# where each channel's hue plateau (the hues at which it is the minimum) is centred, in sixths of a turn
_CHANNEL_CENTRES = torch.tensor([3.0, 5.0, 1.0]).view(3, 1, 1)


def adjust_hue_hexcone(image: torch.Tensor, hue_factor: float) -> torch.Tensor:
    """A float image (..., 3, H, W) in [0, 1] with its HSV hue turned by `hue_factor` (in [-0.5, 0.5]).

    The hexcone model, as torchvision's `adjust_hue`: value (the maximum) and the minimum are
    kept, the hue h (sixths of a turn) moves by 6 * hue_factor, and each channel is
    max - (max - min) * clamp(2 - d, 0, 1), with d the circular distance from h to the centre of
    the hues at which that channel is the minimum.
    """
    r, g, b = image.unbind(-3)
    maxc = torch.maximum(torch.maximum(r, g), b)
    minc = torch.minimum(torch.minimum(r, g), b)
    delta = maxc - minc
    # hue in sixths of a turn, in [-1, 5): the channel holding the maximum picks the sector
    hue = torch.where(maxc == r, g - b,
                      torch.where(maxc == g, (b - r).add_(delta, alpha=2), (r - g).add_(delta, alpha=4)))
    hue = hue.div_(torch.clamp_min(delta, 1e-12)).add_(6.0 * hue_factor)
    distance = (hue.unsqueeze(-3) - _CHANNEL_CENTRES.to(image.dtype)).abs_()
    distance = torch.minimum(distance, (6.0 - distance).abs_())  # circular, for hue in [-4, 8)
    minus_weight = distance.sub_(2.0).clamp_(-1.0, 0.0)  # -clamp(2 - distance, 0, 1)
    return torch.addcmul(maxc.unsqueeze(-3), delta.unsqueeze(-3), minus_weight)


class HexconeColorJitter(v2.ColorJitter):
    """v2.ColorJitter (same parameters, drawn the same way) whose hue step on float images is
    `adjust_hue_hexcone`."""

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if not (isinstance(inpt, torch.Tensor) and inpt.is_floating_point()):
            return super().transform(inpt, params)
        output = inpt.contiguous()  # an uncropped channels-last image: its planes are strided, and slower
        for fn_id in params["fn_idx"].tolist():
            if fn_id == 0 and params["brightness_factor"] is not None:
                output = F.adjust_brightness(output, params["brightness_factor"])
            elif fn_id == 1 and params["contrast_factor"] is not None:
                output = F.adjust_contrast(output, params["contrast_factor"])
            elif fn_id == 2 and params["saturation_factor"] is not None:
                output = F.adjust_saturation(output, params["saturation_factor"])
            elif fn_id == 3 and params["hue_factor"] is not None:
                output = adjust_hue_hexcone(output, params["hue_factor"])
        return output


def tensor_augmentation(size: int) -> v2.Compose:
    """DomainBed's training augmentation on a (3, H, W) uint8 tensor before normalisation: a (3, size, size)
    float image in [0, 1]."""
    return v2.Compose([
        v2.RandomResizedCrop(size, scale=(0.7, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        HexconeColorJitter(0.3, 0.3, 0.3, 0.3),
        v2.RandomGrayscale(p=0.1),
    ])


def tensor_train_transform(size: int) -> v2.Compose:
    """DomainBed's training augmentation on a (3, H, W) uint8 tensor, output size x size, ImageNet-normalised."""
    return v2.Compose([*tensor_augmentation(size).transforms, v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


_SCALE = torch.tensor([1.0 / s for s in IMAGENET_STD]).view(3, 1, 1)
_SHIFT = torch.tensor([-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]).view(3, 1, 1)


def normalize_into(image: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out` (any memory layout, such as a slot of a channels-last batch) set to the ImageNet normalisation of
    the float (3, H, W) `image`, as one multiply-add: image / std - mean / std."""
    return torch.addcmul(_SHIFT, image, _SCALE, out=out)


def tensor_eval_transform(image: torch.Tensor) -> torch.Tensor:
    """A (3, H, W) uint8 tensor already at the evaluation size, as ToTensor and Normalize make it
    (so equal, value for value, to the PIL path's output for the same resized pixels)."""
    return F1.normalize(image.to(torch.float32).div(255), IMAGENET_MEAN, IMAGENET_STD)
