"""FLA (flash-linear-attention, fla-core 0.6.0) chunked simple GLA behind the contract (backend "fla"); an
external peer, whole forward only. Importing this package does not import fla."""

from impls.fla.backend import FlaBackend  # noqa: F401  (registers "fla")

# The declaration, read without importing this package (impls/declaration.py, docs/add-a-backend.md).
BACKEND = "fla"
STAGES = ("forward",)
# result column v_<key> -> (distribution, pin or None: recorded only)
PACKAGES = {"torch": ("torch", ">=2.11"), "triton": ("triton", "3.6.*"), "fla": ("fla-core", "0.6.0")}
