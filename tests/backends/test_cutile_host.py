"""The cuTile backend's per-launch host work: the int64-indexing test reads a contiguous tensor's numel instead of
walking its strides (same answer), and absent optional inputs share one stand-in instead of a new allocation per
call."""

import pytest
import torch

from impls.cutile import common


@pytest.mark.parametrize("make, wide", [
    (lambda: torch.empty(16, 16, device="meta"), False),
    (lambda: torch.empty(2**31 + 1, device="meta"), True),
    (lambda: torch.empty(2**16, 2**15 + 1, device="meta").t(), True),
    (lambda: torch.empty(1, 64, device="meta").expand(2**26, 64), False),
    (lambda: torch.empty(2**31, device="meta")[::2], False),
    (lambda: torch.empty(2**32 + 4, device="meta")[::2], True),
], ids=["small", "contiguous-past-2^31", "transposed-past-2^31", "expanded-stride-0", "strided-under", "strided-past"])
def test_needs_int64_agrees_with_the_span(make, wide):
    t = make()
    assert common.needs_int64(t) is wide
    assert (common.span(t) > common.INT32_LIMIT) is wide


def test_non_tensors_never_need_int64():
    assert not any(map(common.needs_int64, (1, 2.0, None, "x")))


def test_absent_inputs_share_one_stand_in_per_dtype_and_rank():
    a, b = common.dummy("cpu"), common.dummy(torch.device("cpu"))
    assert a is b and a.shape == (1,) and a.dtype == torch.float32
    c = common.dummy("cpu", torch.int32, ndim=2)
    assert c is not a and c.shape == (1, 1) and c.dtype == torch.int32


@pytest.mark.parametrize("head_loop, heads_per_group, walked", [(16, 8, 8), (4, 8, 4), (8, 8, 8)],
                         ids=["loop-longer-than-group", "loop-shorter", "loop-equal"])
def test_head_loop_rows_record_the_heads_a_program_walks(monkeypatch, head_loop, heads_per_group, walked):
    """Switch head_loop longer than a group's heads: the program walks the group's heads, and what the rows record
    (describe()['stages']['compute_out']['head_loop_heads']) says so; launches stubbed, no GPU."""
    from impls.cutile.backend import CutileBackend

    launched = []
    monkeypatch.setattr(common, "launch", launched.append)
    monkeypatch.setattr(CutileBackend, "available", classmethod(lambda cls: (True, "")))
    be = CutileBackend(head_loop=head_loop, tuning="fallback")
    ngroups, chunk = 2, 64
    x = torch.empty(1, 128, ngroups * heads_per_group, 64, dtype=torch.bfloat16)
    B = torch.empty(1, 128, ngroups, 32, dtype=torch.bfloat16)
    dt = torch.empty(1, x.shape[2], 2, chunk)
    states = torch.empty(1, 2, x.shape[2], 64, 32, dtype=torch.bfloat16)
    be.compute_out(B, B, x, dt, dt, states, None, None, None)
    assert be.describe()["stages"]["compute_out"]["head_loop_heads"] == walked
    assert launched and launched[-1].kernel._pyfunc.__name__ == "compute_out_head_loop_kernel"
