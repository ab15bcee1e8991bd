"""The cuTile (NVIDIA CUDA Tile, `cuda.tile`) backend, registered as "cutile".

Importing this package never needs cuda.tile: the kernels are imported on the first stage call, and
`CutileBackend.available()` says why the backend cannot run when cuda.tile is missing.
"""

from impls.cutile.backend import CutileBackend  # noqa: F401  (registers "cutile")
from impls.cutile.switches import CutileSwitches  # noqa: F401

# The declaration, read without importing this package (impls/declaration.py, docs/add-a-backend.md).
BACKEND = "cutile"
# result column v_<key> -> (distribution, pin or None: recorded only)
PACKAGES = {"torch": ("torch", ">=2.11"), "cuda_tile": ("cuda-tile", "1.7.0"),
            "tileiras": ("nvidia-cuda-tileiras", None)}
