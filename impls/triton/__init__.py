"""The Triton backend ("triton"): Mamba-2 SSD forward stages written in Triton the way the cuTile backend is
written (same stages, layouts and operand orders). Importing this package registers the backend.

`import triton` inside this package is an absolute import: it reaches the real Triton, not this package.

Files: backend.py (the Backend class: stages wired to switches and tuning), one file per stage (chunk_cumsum.py,
fwd_pass_state.py, compute_out.py; fused.py for stages 2 and 3 in one kernel; descriptors.py, their TMA helpers;
backward/, the backward's kernels, one file each),
and the configuration, one concern per module: switches.py (TritonSwitches and its help strings), stages.py (the
tuned stages and their launch fields), fallbacks.py (fixed configurations per architecture), space.py (the search
space and its size per stage), clamp.py (pinned fields, block sizes clamped to the problem), smem.py (the
shared-memory model), occupancy.py (the register cap), target.py (interpreter or GPU), tune.py (what
impls/tuning.py needs), launcher.py (every launch, through Triton or through the kernel it compiled: switch
launch_path) and grid.py (host-side integer helpers). aot.py, ptx_hashes.py and expressible.py compile for sm_90
without a GPU.
"""

from impls.triton.backend import TritonBackend  # noqa: F401  (registers "triton")

# The declaration, read without importing this package (impls/declaration.py, docs/add-a-backend.md).
BACKEND = "triton"
# result column v_<key> -> (distribution, pin or None: recorded only)
PACKAGES = {"torch": ("torch", ">=2.11"), "triton": ("triton", "3.6.*")}
