"""vLLM 0.33.0's Mamba-2 prefill SSD kernels (Triton) behind the contract (backend "vllm"); an external peer,
whole forward only. Importing this package loads nothing of vLLM and never touches the GPU: `loader.load()`
finds and executes its kernel files on first use (see loader.py)."""

from impls.vllm.backend import VllmBackend  # noqa: F401  (registers "vllm")

# The declaration, read without importing this package (impls/declaration.py, docs/add-a-backend.md).
BACKEND = "vllm"
STAGES = ("forward",)
# result column v_<key> -> (distribution, pin or None: recorded only). vLLM is never installed: its pin is
# loader.VERSION_REQUIRED, checked by available(), and provenance reads its version where loader.py finds it.
PACKAGES = {"torch": ("torch", ">=2.11"), "triton": ("triton", "3.6.*"), "vllm": ("vllm", None)}
