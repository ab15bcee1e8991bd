"""Importing mamba-ssm's SSD kernels, and what running them under the Triton interpreter needs.

Import: mamba-ssm 2.3.2.post1's package __init__ imports `selective_scan_cuda` (the Mamba-1 CUDA extension)
unconditionally. Built as this project builds it (MAMBA_SKIP_CUDA_BUILD=TRUE: its SSD kernels are pure Triton,
the extension is skipped), that import fails and takes the SSD kernels down with it. So, only when the real
extension is missing, a placeholder module stands in for it: any use of it raises ImportError saying why. The SSD
kernels never touch it.

Interpreter: on CPU tensors with TRITON_INTERPRET=1, `interpreter_mode()` trims every upstream autotuner to its
first config (the interpreter would run each config in turn), turns `torch.cuda.device(None)` (upstream wraps
each launch in `torch.cuda.device(x.device.index)`, which raises on CPU tensors) into a no-op and answers the
backward's `torch.cuda.get_device_properties(<a CPU device>)` with one SM — all only for the duration of the call,
then restored. The GPU path never enters it: a GPU test checks the autotune configs
are intact.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types

import torch

from impls import interpreter
from impls.declaration import declared

VERSION_REQUIRED = declared("mamba_ssm").pin("mamba-ssm")  # impls/mamba_ssm/__init__.py PACKAGES
SSD_MODULES = ("ssd_chunk_state", "ssd_state_passing", "ssd_bmm", "ssd_chunk_scan", "ssd_combined")

interpreter_calls = 0  # how many calls went through interpreter_mode (a GPU test asserts it stays 0 there)


class _MissingExtension(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(
            "selective_scan_cuda: mamba-ssm was built without its CUDA extension (MAMBA_SKIP_CUDA_BUILD=TRUE); "
            "only its Triton SSD kernels are usable here"
        )


def _stand_in_for_missing_extension() -> None:
    if "selective_scan_cuda" in sys.modules:
        return
    try:
        importlib.import_module("selective_scan_cuda")
    except ImportError:
        sys.modules["selective_scan_cuda"] = _MissingExtension("selective_scan_cuda")


def load() -> types.SimpleNamespace:
    """The upstream SSD modules by short name; raises ImportError with the reason when mamba-ssm is missing."""
    _stand_in_for_missing_extension()
    mods = {name: importlib.import_module(f"mamba_ssm.ops.triton.{name}") for name in SSD_MODULES}
    return types.SimpleNamespace(**mods)


def version() -> str | None:
    try:
        from importlib.metadata import version as _v

        return _v("mamba_ssm")
    except Exception:
        return None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreter_refuses(problem) -> str:
    """Why `problem` cannot run in the interpreter here ("" where it can): impls/interpreter.py."""
    return interpreter.refuses(problem, interpreting())


def autotuners(mods: types.SimpleNamespace):
    import triton

    for module in vars(mods).values():
        for value in vars(module).values():
            if isinstance(value, triton.runtime.Autotuner):
                yield value


@contextlib.contextmanager
def interpreter_mode(mods: types.SimpleNamespace):
    global interpreter_calls
    interpreter_calls += 1
    saved = [(tuner, tuner.configs) for tuner in autotuners(mods)]
    real_device, real_properties = torch.cuda.device, torch.cuda.get_device_properties

    def device(index):
        return contextlib.nullcontext() if index is None else real_device(index)

    def properties(where=None):  # the backward sizes a grid by the SM count: one SM for a CPU tensor
        if isinstance(where, torch.device) and where.type == "cpu":
            return types.SimpleNamespace(multi_processor_count=1, name="cpu (Triton interpreter)")
        return real_properties(where)

    try:
        for tuner, configs in saved:
            tuner.configs = configs[:1]
        torch.cuda.device, torch.cuda.get_device_properties = device, properties
        yield
    finally:
        torch.cuda.device, torch.cuda.get_device_properties = real_device, real_properties
        for tuner, configs in saved:
            tuner.configs = configs
