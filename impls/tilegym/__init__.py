"""TileGym 1.5.1's cuTile Mamba-2 forward behind the contract (backend "tilegym"); an external peer.

Importing this package imports neither TileGym nor cuda.tile and never touches the GPU: `loader.load()` reads
TileGym's mamba2 module on first use (see loader.py for why it is not imported the usual way).
"""

from impls.tilegym.backend import TilegymBackend  # noqa: F401  (registers "tilegym")

# The declaration, read without importing this package (impls/declaration.py, docs/add-a-backend.md).
BACKEND = "tilegym"
# result column v_<key> -> (distribution, pin or None: recorded only)
PACKAGES = {"torch": ("torch", ">=2.11"), "cuda_tile": ("cuda-tile", "1.7.0"), "tilegym": ("tilegym", "1.5.1"),
            "tileiras": ("nvidia-cuda-tileiras", None)}
