"""TileGym 1.5.1's cuTile Mamba-2 forward behind the contract (backend "tilegym"); an external peer.

Importing this package imports neither TileGym nor cuda.tile and never touches the GPU: `loader.load()` reads
TileGym's mamba2 module on first use (see loader.py for why it is not imported the usual way).
"""

from impls.tilegym.backend import TilegymBackend  # noqa: F401  (registers "tilegym")
