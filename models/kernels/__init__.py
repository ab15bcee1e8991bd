"""Our Triton kernels for the parts of the Mamba-2 layer around the SSD, one file per op, each with its forward and
backward kernels and the autograd Function over them: causal_conv.py (depthwise causal conv1d + bias + SiLU),
gated_norm.py (the gated RMSNorm). The layer selects them with `Mamba2(..., glue="triton")` (models/glue.py)."""
