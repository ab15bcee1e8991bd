"""The cuTile (NVIDIA CUDA Tile, `cuda.tile`) backend, registered as "cutile".

Importing this package never needs cuda.tile: the kernels are imported on the first stage call, and
`CutileBackend.available()` says why the backend cannot run when cuda.tile is missing.
"""

from impls.cutile.backend import CutileBackend  # noqa: F401  (registers "cutile")
from impls.cutile.switches import CutileSwitches  # noqa: F401
