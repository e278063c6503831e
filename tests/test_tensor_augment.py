"""DomainBed's augmentation on uint8 tensors (the image cache's path) against the PIL path, on statistics.

Each statistic is read from the outputs of both pipelines on synthetic images whose content makes it
measurable (a grey level gives the brightness factor, a colour's chroma and hue give the jitter's
product and hue shift, two halves give the flip, ...), with independent seeds for the two paths, and
compared with the distribution DomainBed's parameters define and with each other.
"""

from __future__ import annotations

import colorsys
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as F

from domaingen.datasets.loading import train_transform
from domaingen.datasets.tensor_augment import (IMAGENET_MEAN, IMAGENET_STD, HexconeColorJitter, adjust_hue_hexcone,
                                               tensor_train_transform)

SIZE = 32
N = 300
MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


def seeded(transform, image, seed: int) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return transform(image)


def outputs(pixels: np.ndarray, path: str, n: int = N, size: int = SIZE) -> torch.Tensor:
    """(n, 3, size, size) un-normalised outputs in [0, 1] of one path's training augmentation on the
    (H, W, 3) uint8 `pixels`; the tensor path's seeds are offset from the PIL path's, so the samples
    are independent."""
    if path == "pil":
        transform, image, offset = train_transform(size), Image.fromarray(pixels), 0
    else:
        transform, image, offset = tensor_train_transform(size), torch.from_numpy(pixels).permute(2, 0, 1), 10_000
    return torch.stack([seeded(transform, image, offset + k) for k in range(n)]) * STD + MEAN


def uniform_image(rgb, size: int = SIZE) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, dtype=np.uint8), (size, size, 3)).copy()


def halves(left, right, size: int = SIZE) -> np.ndarray:
    pixels = uniform_image(left, size)
    pixels[:, size // 2:] = right
    return pixels


def check_moments(values: torch.Tensor, mean: float, std: float, low: float, high: float, tol: float) -> None:
    assert values.mean().item() == pytest.approx(mean, abs=tol)
    assert values.std().item() == pytest.approx(std, abs=tol)
    assert values.min().item() >= low - 0.01 and values.max().item() <= high + 0.01


def uniform_moments(low: float, high: float) -> tuple[float, float]:
    return (low + high) / 2, (high - low) / math.sqrt(12)


@pytest.mark.parametrize("factor", [-0.5, -0.3, -0.07, 0.0, 0.11, 0.3, 0.5])
def test_the_closed_form_hue_equals_torchvisions(factor):
    image = torch.rand(2, 3, 17, 19, generator=torch.Generator().manual_seed(1))
    image[0, :, :3] = 0.5  # grey pixels: no hue
    image[1, 0, :2] = image[1, 1, :2]  # ties between the maximum channels
    assert torch.allclose(adjust_hue_hexcone(image, factor), F.adjust_hue(image, factor), atol=1e-5)


def test_both_paths_draw_the_same_parameters_from_one_seed():
    """ColorJitter's factors and order, the flip and the grey decision come from the same calls in the same
    order: on a square image of the output size, the two paths give nearly the same pixels."""
    rng = np.random.default_rng(0)
    small = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))
    pixels = np.array(small.resize((SIZE, SIZE), Image.BICUBIC))
    pil = torch.stack([seeded(train_transform(SIZE), Image.fromarray(pixels), k) for k in range(20)])
    tensor = torch.stack([seeded(tensor_train_transform(SIZE), torch.from_numpy(pixels).permute(2, 0, 1), k)
                          for k in range(20)])
    # rounding (PIL rounds to uint8 after each step) and resampling differ; other draws would differ by ~1
    differences = ((pil - tensor) * STD).abs().flatten(1).mean(1)
    assert differences.max().item() < 0.03
    jitter, v1 = HexconeColorJitter(0.3, 0.3, 0.3, 0.3), T.ColorJitter(0.3, 0.3, 0.3, 0.3)
    for seed in range(5):
        torch.manual_seed(seed)
        params = jitter.make_params([])
        torch.manual_seed(seed)
        order, *factors = v1.get_params(v1.brightness, v1.contrast, v1.saturation, v1.hue)
        assert params["fn_idx"].tolist() == order.tolist()
        assert [params[f"{k}_factor"] for k in ("brightness", "contrast", "saturation", "hue")] == factors


@pytest.mark.parametrize("path", ["pil", "tensor"])
def test_brightness_factor_is_uniform_in_0_7_to_1_3(path):
    # a grey level is changed by brightness alone (contrast, saturation, hue and grey leave it)
    factors = outputs(uniform_image((128, 128, 128)), path).mean((1, 2, 3)) / (128 / 255)
    check_moments(factors, *uniform_moments(0.7, 1.3), 0.7, 1.3, tol=0.03)


@pytest.mark.parametrize("path", ["pil", "tensor"])
def test_brightness_times_contrast_scales_the_difference_of_two_greys(path):
    # brightness and contrast each scale the difference between two grey levels by their factor
    out = outputs(halves((77, 77, 77), (128, 128, 128)), path)
    edge = SIZE // 8
    difference = (out[..., -edge:].mean((1, 2, 3)) - out[..., :edge].mean((1, 2, 3))).abs()
    product = difference / (51 / 255)
    check_moments(product, 1.0, math.sqrt(1.03 ** 2 - 1), 0.49, 1.69, tol=0.05)


def hsv(out: torch.Tensor) -> np.ndarray:
    """(n, 3) HSV (colorsys) of each output's mean colour."""
    return np.array([colorsys.rgb_to_hsv(*rgb) for rgb in out.mean((2, 3)).tolist()])


@pytest.mark.parametrize("path", ["pil", "tensor"])
def test_chroma_and_hue_of_a_colour_follow_the_jitter_factors(path):
    colour = (153, 102, 77)
    out = outputs(uniform_image(colour), path)
    grey = (out.amax(1) - out.amin(1)).amax((1, 2)) < 2 / 255
    assert grey.float().mean().item() == pytest.approx(0.1, abs=0.05)  # RandomGrayscale(p=0.1)
    out = out[~grey]
    # brightness, contrast and saturation each scale max - min by their factor; hue keeps it
    chroma = (out.amax(1) - out.amin(1)).mean((1, 2)) / ((153 - 77) / 255)
    check_moments(chroma, 1.0, math.sqrt(1.03 ** 3 - 1), 0.34, 2.2, tol=0.06)
    # none of them moves the hue; the hue factor does, by itself
    shift = (hsv(out)[:, 0] - colorsys.rgb_to_hsv(*(c / 255 for c in colour))[0] + 0.5) % 1 - 0.5
    check_moments(torch.tensor(shift), *uniform_moments(-0.3, 0.3), -0.3, 0.3, tol=0.03)


@pytest.mark.parametrize("path", ["pil", "tensor"])
def test_half_of_the_images_are_flipped(path):
    out = outputs(halves((0, 0, 0), (255, 255, 255)), path, n=200)
    flipped = out[..., :SIZE // 2].mean((1, 2, 3)) > out[..., SIZE // 2:].mean((1, 2, 3))
    assert flipped.float().mean().item() == pytest.approx(0.5, abs=0.1)


def crop_boxes(path: str, n: int = N, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(relative area, aspect ratio) of the boxes RandomResizedCrop takes, read from crops of a coordinate ramp."""
    ramp = np.zeros((size, size, 3), dtype=np.uint8)
    ramp[..., 0] = np.arange(size)[None, :] * 4  # x in the red channel, y in the green one
    ramp[..., 1] = np.arange(size)[:, None] * 4
    if path == "pil":
        crop, image, offset = train_transform(size).transforms[0], Image.fromarray(ramp), 0
    else:
        crop, image, offset = tensor_train_transform(size).transforms[0], torch.from_numpy(ramp).permute(2, 0, 1), 10_000
    areas, ratios = [], []
    for k in range(n):
        out = seeded(crop, image, offset + k)
        out = np.asarray(out) if path == "pil" else out.permute(1, 2, 0).numpy()
        # output pixel i samples the box at (i + 1/2) * w / size: the first and last are (size - 1) * w / size apart
        scale = size / (size - 1)
        w = (float(out[0, -1, 0]) - float(out[0, 0, 0])) / 4 * scale
        h = (float(out[-1, 0, 1]) - float(out[0, 0, 1])) / 4 * scale
        areas.append(w * h / size ** 2)
        ratios.append(w / h)
    return torch.tensor(areas), torch.tensor(ratios)


def test_crop_area_and_aspect_ratio_have_the_pil_paths_distribution():
    pil_area, pil_ratio = crop_boxes("pil")
    area, ratio = crop_boxes("tensor")
    for values in (pil_area, area):
        assert values.min().item() >= 0.67 and values.max().item() <= 1.005  # w and h are rounded to pixels
    for values in (pil_ratio.log(), ratio.log()):
        assert values.min().item() >= math.log(3 / 4) - 0.05 and values.max().item() <= math.log(4 / 3) + 0.05
    assert area.mean().item() == pytest.approx(pil_area.mean().item(), abs=0.015)
    assert area.std().item() == pytest.approx(pil_area.std().item(), abs=0.015)
    assert ratio.log().mean().item() == pytest.approx(pil_ratio.log().mean().item(), abs=0.03)
    assert ratio.log().std().item() == pytest.approx(pil_ratio.log().std().item(), abs=0.03)
    # boxes of aspect r with 0 < w, h <= size and area s ~ U(0.7, 1): about U(0.7, 1) where they fit
    assert 0.78 < area.mean().item() < 0.85


def test_the_tensor_path_returns_normalised_float_images_of_the_output_size():
    image = torch.from_numpy(uniform_image((10, 200, 30), 40)).permute(2, 0, 1)
    out = seeded(tensor_train_transform(24), image, 3)
    assert out.dtype == torch.float32 and out.shape == (3, 24, 24) and out.is_contiguous()
    un = out * STD + MEAN
    assert un.min().item() >= -1e-5 and un.max().item() <= 1 + 1e-5
