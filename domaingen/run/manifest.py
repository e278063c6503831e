"""`manifest.json`: what a run was computed with, so two tables made months apart can be told apart.

Written once, when the run starts (after its model and data are built, before its first
step), and checked when it resumes. It holds:

- `domaingen`: the package's version and, when it runs from a git checkout, the commit and
  whether tracked files were modified (`dirty`);
- `libraries`: Python, torch, torchvision, numpy, and timm or wilds when the run's model or
  dataset uses them;
- `device`: its type; on a CPU the model name and the instruction-set flags that decide
  its speed and `--precision auto` (AVX2, AVX-512, AVX-512 bf16, AMX); on a GPU its name,
  memory, compute capability, CUDA and cuDNN versions;
- `threads` (torch's intra-op threads) and `resolved_precision`.

No host name, user name or path. A run resumed with another torch version or on another
device class (CPU model or GPU name) warns in one line and appends the change to
`resumes` (with the step it resumed from); the rest stays as the run started. A run restarted
from step 0 (its earlier attempt left no checkpoint, so none of its records survive) is a new
run: its manifest is written anew, with no `resumes`.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

import domaingen
from domaingen.run.precision import read_cpu_flags
from domaingen.run.rundir import RunDirectory, atomic_write_bytes

MANIFEST = "manifest.json"
FORMAT = 1
# the flags that decide a CPU's speed here and what `--precision auto` picks
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
# optional libraries listed when the run's model or dataset comes from them
OPTIONAL_LIBRARIES = ("timm", "wilds")
# what a resumed run compares with where it started
CHECKED = ("torch", "device_class")
UNKNOWN = "unknown (no manifest.json)"


def git_state(package_dir: Path | None = None) -> dict[str, Any] | None:
    """{'commit', 'dirty'} of the git checkout the package runs from; None when it is not in one
    (an installed wheel, or git missing). Dirty counts tracked files only: sweep outputs do not."""
    package_dir = Path(package_dir or Path(domaingen.__file__).parent).resolve()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        if top / package_dir.name != package_dir:  # a venv inside some other repository
            return None
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ('model name' in /proc/cpuinfo, else platform.processor())."""
    try:
        for line in Path(cpuinfo_path).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_info(device: torch.device) -> dict[str, Any]:
    """The device a run computes on: a CPU's model and flags, or a GPU's name, memory and CUDA stack."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {
            "type": "cuda",
            "name": props.name,
            "memory_gb": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "count": torch.cuda.device_count(),
        }
    flags = read_cpu_flags()
    return {"type": device.type, "name": cpu_model(), "flags": [f for f in CPU_FLAGS if f in flags],
            "machine": platform.machine()}


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed as a distribution
        loaded = sys.modules.get(module)
        return getattr(loaded, "__version__", None)


def used_libraries(objects: Iterable[Any]) -> list[str]:
    """The optional libraries (timm, wilds) that any of these objects' classes, or an
    nn.Module's submodules, come from (domaingen's WILDS datasets count as wilds)."""
    classes: list[type] = []
    for obj in objects:
        classes += list(type(obj).__mro__)
        if isinstance(obj, torch.nn.Module):
            classes += [type(m) for m in obj.modules()]
    modules = {cls.__module__ for cls in classes}
    used = []
    for name in OPTIONAL_LIBRARIES:
        if any(m == name or m.startswith(f"{name}.") or m == f"domaingen.datasets.{name}" for m in modules):
            used.append(name)
    return used


def build_manifest(device: torch.device, resolved_precision: str, uses: Iterable[str] = ()) -> dict[str, Any]:
    """The manifest of a run starting now in this process on `device`."""
    libraries = {"python": platform.python_version(), "torch": torch.__version__,
                 "torchvision": _version("torchvision"), "numpy": _version("numpy")}
    libraries.update({name: _version(name) for name in uses})
    info = device_info(device)
    return {
        "format": FORMAT,
        "domaingen": {"version": domaingen.__version__, **(git_state() or {})},
        "libraries": libraries,
        "device": info,
        "device_class": device_class(info),
        "threads": torch.get_num_threads(),
        "resolved_precision": resolved_precision,
    }


def device_class(info: Mapping[str, Any]) -> str:
    """'cuda: NVIDIA H100 80GB HBM3' or 'cpu: AMD EPYC 9B45': what a resumed run must match."""
    return f"{info.get('type', '?')}: {info.get('name', '?')}"


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's manifest, or None when it has none or it is unreadable."""
    try:
        manifest = json.loads((Path(run_dir) / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _write(rundir: RunDirectory, manifest: Mapping[str, Any]) -> None:
    atomic_write_bytes(rundir.file(MANIFEST), (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def record_manifest(rundir: RunDirectory, current: Mapping[str, Any], start_step: int) -> str | None:
    """Write `current` as the run's manifest when it has none; on a resume, compare the torch version
    and device class with where the run started, append a change to `resumes`, and return the one-line
    warning (None when nothing changed). A run resumed without a manifest gets one at the resume, with
    `started_at_step`. At step 0 nothing of an earlier attempt is kept, so `current` replaces the stored
    manifest: the device and commit it names are those that computed every record."""
    stored = read_manifest(rundir.path)
    if stored is None or start_step == 0:
        _write(rundir, {**current, **({"started_at_step": start_step} if start_step else {})})
        return None
    now = {"torch": current["libraries"]["torch"], "device_class": current["device_class"]}
    latest = {"torch": stored.get("libraries", {}).get("torch"), "device_class": stored.get("device_class")}
    for change in stored.get("resumes", []):  # compare with the last machine it ran on
        latest.update({k: change[k] for k in CHECKED if k in change})
    changed = {k: now[k] for k in CHECKED if now[k] != latest[k]}
    if not changed:
        return None
    stored.setdefault("resumes", []).append({"step": start_step, **changed})
    _write(rundir, stored)
    what = "; ".join(f"{k.replace('_', ' ')} {latest[k]} -> {now[k]}" for k in changed)
    return f"{rundir.path} resumed at step {start_step} with a different {what} (recorded in {MANIFEST})"


def code_version(manifest: Mapping[str, Any] | None) -> str:
    """'0.2.0 @ 1a2b3c4d5e6f' (+ ' dirty'), '0.2.0' outside git, or UNKNOWN without a manifest."""
    if not manifest:
        return UNKNOWN
    info = manifest.get("domaingen", {})
    text = str(info.get("version", "?"))
    if info.get("commit"):
        text += f" @ {info['commit'][:12]}" + (" dirty" if info.get("dirty") else "")
    return text


def torch_version(manifest: Mapping[str, Any] | None) -> str:
    """The torch version a run started with (UNKNOWN without a manifest)."""
    return str(manifest.get("libraries", {}).get("torch", "?")) if manifest else UNKNOWN


def device_text(manifest: Mapping[str, Any] | None) -> str:
    """The device class a run started on, with the CPU flags that matter or the GPU's memory."""
    if not manifest:
        return UNKNOWN
    info = manifest.get("device", {})
    extra = " ".join(info.get("flags", [])) if info.get("type") == "cpu" else (
        f"{info.get('memory_gb')} GB, CUDA {info.get('cuda')}, cuDNN {info.get('cudnn')}")
    return manifest.get("device_class", device_class(info)) + (f" ({extra})" if extra else "")
