"""FLA (flash-linear-attention, fla-core 0.6.0) chunked simple GLA behind the contract (backend "fla"); an
external peer, whole forward only. Importing this package does not import fla."""

from impls.fla.backend import FlaBackend  # noqa: F401  (registers "fla")
