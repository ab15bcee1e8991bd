"""The strides upstream's kernels need, as its own fused forward enforces them (copies where they differ)."""


def upstream_layout(**tensors):
    """B, C, D: last dimension contiguous; x, z: last dimension or seqlen contiguous. Returns them in order."""
    out = []
    for name, t in tensors.items():
        if t is not None:
            if name in ("x", "z"):
                if t.stride(-1) != 1 and t.stride(1) != 1:
                    t = t.contiguous()
            elif t.stride(-1) != 1:
                t = t.contiguous()
        out.append(t)
    return out
