"""`--precision auto`: bf16 where the hardware computes it natively, fp32 elsewhere.

bf16 autocast pays off on a CUDA GPU with native bf16 (Ampere and later) and on
a CPU with AMX (`amx_bf16`) or AVX-512 bf16 (`avx512_bf16`) instructions;
without them a CPU emulates bf16 and runs slower than in fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

PRECISIONS = ("fp32", "bf16")  # what a run computes in
REQUESTED_PRECISIONS = PRECISIONS + ("auto",)  # what a user may ask for
NATIVE_BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of the first processor in /proc/cpuinfo's text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / arm64
            return set(value.split())
    return set()


def read_cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """This machine's CPU flags (empty where /proc/cpuinfo does not exist, e.g. macOS)."""
    try:
        return cpu_flags(Path(path).read_text())
    except OSError:
        return set()


def auto_precision(device_type: str, flags: Iterable[str], cuda_native_bf16: bool = False) -> str:
    """What `auto` means on a device: bf16 on native-bf16 CUDA or a CPU with AMX / AVX-512 bf16, else fp32."""
    if device_type == "cuda":
        return "bf16" if cuda_native_bf16 else "fp32"
    if device_type == "cpu":
        return "bf16" if NATIVE_BF16_CPU_FLAGS & set(flags) else "fp32"
    return "fp32"


def cuda_has_native_bf16() -> bool:
    """Whether the current CUDA device computes bf16 natively (not through emulation)."""
    import torch

    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch without the argument counted only native support
        return bool(torch.cuda.is_bf16_supported())


def resolve_precision(requested: str, device_type: str) -> str:
    """fp32 / bf16 as asked, or what `auto` means on this machine's `device_type`."""
    if requested != "auto":
        return requested
    native = cuda_has_native_bf16() if device_type == "cuda" else False
    return auto_precision(device_type, read_cpu_flags() if device_type == "cpu" else (), native)


def emulated_bf16_warning(precision: str, device_type: str, flags: Iterable[str] = (),
                          cuda_native_bf16: bool = True) -> str | None:
    """The one-line warning for a run computing in bf16 where the hardware emulates it; None elsewhere."""
    if precision != "bf16":
        return None
    if device_type == "cpu" and not NATIVE_BF16_CPU_FLAGS & set(flags):
        return ("bf16 on a CPU without AMX or AVX-512 bf16 (amx_bf16, avx512_bf16) is emulated and runs "
                "slower than fp32; --precision auto picks fp32 here")
    if device_type == "cuda" and not cuda_native_bf16:
        return "bf16 on a GPU without native bf16 (before Ampere) is emulated; --precision auto picks fp32 here"
    return None


def bf16_emulation_warning_here(precision: str, device_type: str) -> str | None:
    """`emulated_bf16_warning` for this machine's hardware (its CPU flags, or its GPU's bf16 support)."""
    if precision != "bf16":
        return None
    flags = read_cpu_flags() if device_type == "cpu" else ()
    native = cuda_has_native_bf16() if device_type == "cuda" else True
    return emulated_bf16_warning(precision, device_type, flags, native)
