"""The Mamba-2 layer and language model, and the layer's own kernels."""
