"""vLLM 0.33.0's Mamba-2 prefill SSD kernels (Triton) behind the contract (backend "vllm"); an external peer,
whole forward only. Importing this package loads nothing of vLLM and never touches the GPU: `loader.load()`
finds and executes its kernel files on first use (see loader.py)."""

from impls.vllm.backend import VllmBackend  # noqa: F401  (registers "vllm")
