"""The Triton backend's launch paths (switch launch_path, impls/triton/launcher.py).

In this process (the interpreter): the cached path's key is at least as fine as Triton's own specialisation, the
host descriptors it passes carry what TensorDescriptor carries, and the switch is refused where nothing is compiled.
In a subprocess without the interpreter (instruments/triton/launch_paths.py: real sm_90 compilation, the driver call
recorded): the forward passes the driver the same arguments by both paths, on a hit without Triton's run.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

import impls  # noqa: E402
from impls.triton import descriptors, launcher  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def stand_in_driver(monkeypatch):
    """The key reads the active driver, which on a machine without a GPU is not there: a stand-in."""
    monkeypatch.setattr(launcher, "driver", SimpleNamespace(active=SimpleNamespace()))


def _pool() -> list:
    """Arguments of every kind the backend passes, with the cases where Triton's specialisation changes."""
    storage = {dt: torch.empty(4096, dtype=dt) for dt in (torch.bfloat16, torch.float32)}
    tensors = [storage[torch.bfloat16][:64], storage[torch.bfloat16][1:65], storage[torch.bfloat16][8:72],
               storage[torch.float32][:64], storage[torch.float32][2:66], storage[torch.float32][4:68],
               torch.nn.Parameter(storage[torch.float32][:64], requires_grad=False),
               torch.nn.Parameter(storage[torch.float32][1:65], requires_grad=False)]
    ints = [0, 1, 2, 15, 16, 17, 32, -16, 2**31 - 1, 2**31, 2**31 + 16, 2**40, -(2**31) - 1]
    descs = [TensorDescriptor.from_tensor(storage[torch.bfloat16][:1024].view(32, 32), [16, 16]),
             TensorDescriptor.from_tensor(storage[torch.bfloat16][8:1032].view(32, 32), [16, 16]),
             TensorDescriptor.from_tensor(storage[torch.bfloat16][:1024].view(32, 32), [32, 16]),
             TensorDescriptor.from_tensor(storage[torch.float32][:1024].view(32, 32), [16, 16])]
    light = [launcher.HostDescriptor(storage[torch.bfloat16][:1024].view(32, 32), (16, 16)),
             launcher.HostDescriptor(storage[torch.bfloat16][:1024].view(32, 32), (32, 16))]
    return tensors + ints + descs + light + [0.5, 1.0, -0.0, 0.0, True, False, None]


def _specialisation(a) -> tuple:
    full = a.full() if isinstance(a, launcher.HostDescriptor) else a
    return native_specialize_impl(CUDABackend, full, False, True, True)


def _key(*args, **kwargs):
    return launcher.signature("k", 0, 1, args, kwargs)


def test_cached_key_at_least_as_fine_as_triton():
    """Every pair of arguments of the pool that the key tells apart no further (same key at the same position)
    Triton specialises the same, so a hit launches the kernel Triton would have chosen (the key is per argument:
    this covers every argument list); and the key does tell apart many of them."""
    pool = _pool()
    same_key = 0
    for a, b in itertools.combinations(pool, 2):
        if _key(a) == _key(b):
            same_key += 1
            assert _specialisation(a) == _specialisation(b), (a, b)
    assert 5 <= same_key < len(pool) * (len(pool) - 1) // 8  # aligned tensors, equal floats...: not vacuous


def test_key_tells_apart_what_triton_does():
    bf = torch.empty(256, dtype=torch.bfloat16)
    key = lambda *args, **kw: _key(*args, **(kw or {"B": 16}))  # noqa: E731
    assert key(bf[:64], 16) == key(bf[8:72], 16)  # both 16-byte aligned
    assert key(bf[:64], 16) != key(bf[1:65], 16)  # alignment
    assert key(bf[:64], 16) != key(bf.float()[:64], 16)  # dtype
    assert key(bf[:64], 16) != key(bf[:64], 17)  # a scalar's value
    assert key(bf[:64], 1) != key(bf[:64], True)  # int 1 and True are different arguments
    assert key(bf[:64], 16) != key(bf[:64], 16, B=32)  # a constexpr
    assert key(bf[:64], 16) != key(bf[:64], 16, B=16, num_warps=8)  # a launch option
    # keyword values equal in Python but not to Triton (its key is the text of the specialisation)
    assert key(bf[:64], EXP2=True) != key(bf[:64], EXP2=1) != key(bf[:64], EXP2=1.0)
    assert key(bf[:64], SCALE=0.0) != key(bf[:64], SCALE=-0.0)


def test_key_follows_the_knobs_triton_reads_at_each_launch(monkeypatch):
    from triton import knobs

    bf = torch.empty(64, dtype=torch.bfloat16)
    before = _key(bf)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert _key(bf) != before


def test_key_refuses_an_unknown_argument():
    with pytest.raises(TypeError, match="launch_path='cached'.*list"):
        _key([1, 2])


def _kernel_signature(x_ptr, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
    pass


def test_runtime_parameter_by_keyword_is_refused():
    """Only constexprs may come by keyword in the cached path (a runtime value kept in the entry would be reused);
    the tail is the constexprs by keyword, then the defaults, in the kernel's order."""
    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_kernel_signature)  # the class Triton's jit gives outside the interpreter
    with pytest.raises(TypeError, match="runtime parameter 'scale' is passed by keyword"):
        launcher._tail(kernel, 2, {"scale": 0.5, "BLOCK": 16})
    assert launcher._tail(kernel, 3, {"BLOCK": 16}) == (16, False)
    assert launcher._tail(kernel, 3, {"BLOCK": 16, "FLAG": True}) == (16, True)
    with pytest.raises(TypeError, match="'BLOCK' has no value"):
        launcher._tail(kernel, 3, {})


def test_host_descriptor_carries_what_tensordescriptor_does():
    x = torch.empty(2, 64, 4, 32, dtype=torch.bfloat16)
    light = descriptors.host({"x": (x, (1, 16, 1, 32))}, "cached")["x"]
    full = descriptors.host({"x": (x, (1, 16, 1, 32))})["x"]
    assert isinstance(light, launcher.HostDescriptor) and isinstance(full, TensorDescriptor)
    made = light.full()
    for field in ("shape", "strides", "block_shape", "padding"):
        assert list(getattr(light, field)) == list(getattr(full, field)) == list(getattr(made, field)), field
    assert light.base is full.base is made.base is x


@pytest.mark.parametrize("path", ["triton", "cached"])
def test_host_descriptors_refuse_the_same_tensors(path):
    odd = torch.empty(2, 64, 4, 33, dtype=torch.bfloat16)[..., :32]  # strides not 16-byte multiples
    with pytest.raises(ValueError, match="x: strides"):
        descriptors.host({"x": (odd, (1, 16, 1, 32))}, path)


def test_host_descriptor_refuses_an_empty_dimension():
    with pytest.raises(ValueError, match="x: shape .* empty dimension"):
        descriptors.host({"x": (torch.empty(0, 64, dtype=torch.bfloat16), (16, 16))}, "cached")


def test_cached_refused_under_the_interpreter():
    with pytest.raises(ValueError, match="launch_path='cached'.*interpreter"):
        impls.get_backend("triton", launch_path="cached")


def test_unknown_path_refused():
    with pytest.raises(ValueError, match="launch_path.*'fast'"):
        launcher.launch(None, (1,), path="fast")


@pytest.mark.parametrize("hooked", ["launch_enter_hook", "launch_exit_hook"])
def test_launch_metadata_only_with_a_hook(monkeypatch, hooked):
    """Launch metadata is made when an enter or an exit hook is set (the launcher hands it to both), not without."""
    from triton import knobs
    from triton.knobs import HookChain

    made = []
    compiled = SimpleNamespace(launch_metadata=lambda grid, stream, *args: made.append(args) or "meta")
    chains = {name: HookChain() for name in ("launch_enter_hook", "launch_exit_hook")}
    for name, chain in chains.items():
        monkeypatch.setattr(knobs.runtime, name, chain)
    assert launcher._hooks(compiled, (1,), 0, (1, 2))[0] is None and not made
    chains[hooked].add(lambda metadata: None)
    assert launcher._hooks(compiled, (1,), 0, (1, 2))[0] == "meta" and made == [(1, 2)]


SWITCH_SETS = {
    "searched-tma-host-serial": "tma=true,tma_descriptors=host,state_pass=serial",
    "defaults": "",
    "tma-device-shared-cb": "tma=true,cb_mode=shared",
    "fused": "fuse_state_out=true",
    "fused-chunk-host-shared-cb": ("fuse_state_out=true,fused_program=chunk,tma=true,tma_descriptors=host,"
                                   "cb_mode=shared"),
}
CASES = [(sw, "plain") for sw in SWITCH_SETS] + [
    ("defaults", "z-init-seq_idx-Dchannel"), ("searched-tma-host-serial", "z-init-seq_idx-Dchannel"),
    ("defaults", "varlen-fp32"), ("fused", "varlen-fp32")]


@pytest.mark.parametrize("switches,problem", CASES, ids=[f"{sw}-{p}" for sw, p in CASES])
def test_both_paths_pass_the_driver_the_same(switches, problem):
    """instruments/triton/launch_paths.py in a process without the interpreter: the kernels compile for sm_90, the
    driver call is recorded; optional operands (z, initial states, seq_idx, per-channel D, cu_seqlens) and fp16/fp32
    change the launches' arguments and specialisations."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "instruments.triton.launch_paths", SWITCH_SETS[switches], problem],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["launches"] >= 2
    assert got["miss_equal"] and got["miss_runs"] == got["launches"]  # first call: every launch through Triton
    assert got["hit_equal"] and got["hit_runs"] == 0  # second: none through Triton, same driver arguments
    assert got["new_inputs_equal"]  # new tensors reach the driver (nothing of the first call's is reused)
    if "tma=true" not in SWITCH_SETS[switches]:
        assert got["misaligned_equal"] and got["misaligned_new_entries"] >= 1 and got["misaligned_runs"] >= 1
