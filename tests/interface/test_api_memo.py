"""The public entries remember the metadata of calls they validated (impls/api.py): a repeated call skips the
metadata checks, and any call that differs in a tensor's type, shape, dtype, device or strides, in a scalar option
or in the backend is checked in full and raises as before. Value checks run on every call."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import impls
from impls import api, registry
from impls import validate as check
from impls.reference.backend import ReferenceBackend
from tests.interface.test_validation import BAD_FORWARD, S, inputs


@pytest.fixture(autouse=True)


def fresh_memo():
    api.forget_checked()
    yield
    api.forget_checked()


@pytest.mark.parametrize("arg, changes", BAD_FORWARD)


def test_a_remembered_call_still_rejects_every_bad_argument(arg, changes):
    impls.ssd_forward(**inputs())
    with pytest.raises(ValueError, match=rf"^{arg}"):
        impls.ssd_forward(**inputs(**changes))


AFTER_A_GOOD_CALL = [
    pytest.param("dt", lambda kw: {"dt": kw["dt"].to("meta")}, id="dt-other-device"),
    pytest.param("B", lambda kw: {"B": kw["B"].double()}, id="B-other-dtype"),
    pytest.param("C", lambda kw: {"C": kw["C"].half()}, id="C-other-dtype"),
    pytest.param("A", lambda kw: {"A": kw["A"].tolist()}, id="A-a-list"),
    pytest.param("D", lambda kw: {"D": 1.0}, id="D-a-float"),
    pytest.param("chunk_size", lambda kw: {"chunk_size": float(kw["chunk_size"])}, id="chunk_size-a-float"),
    pytest.param("dt_limit", lambda kw: {"dt_limit": [0.1, 0.01]}, id="dt_limit-a-bad-list"),
    pytest.param("state_dtype", lambda kw: {"state_dtype": "float32"}, id="state_dtype-a-string"),
]


@pytest.mark.parametrize("arg, change", AFTER_A_GOOD_CALL)


def test_same_shapes_with_a_bad_argument_after_a_good_call(arg, change):
    kw = inputs()
    impls.ssd_forward(**kw)
    with pytest.raises(ValueError, match=rf"^{arg}"):
        impls.ssd_forward(**{**kw, **change(kw)})


def test_a_negative_stride_is_checked_on_every_new_signature(monkeypatch):
    """torch makes no tensor with a negative stride; a planted stride() must still reach the check after a hit."""
    kw = inputs()
    impls.ssd_forward(**kw)

    class Flipped(torch.Tensor):
        def stride(self, *args):
            return (-1,) + tuple(super().stride())[1:]

    x = kw["x"].as_subclass(Flipped)
    with pytest.raises(ValueError, match="^x: expected non-negative strides"):
        impls.ssd_forward(**{**kw, "x": x})


@pytest.mark.parametrize("stage", ["chunk_cumsum", "fwd_pass_state", "compute_out", "ssd_forward"])


def test_a_repeated_call_skips_the_metadata_checks_only(stage, monkeypatch):
    kw = inputs()
    ref = impls.ssd_forward(**kw)
    call = {
        "chunk_cumsum": lambda **v: impls.chunk_cumsum(kw["dt"], kw["A"], kw["chunk_size"], kw["dt_bias"], **v),
        "fwd_pass_state": lambda **v: impls.fwd_pass_state(kw["B"], kw["x"], ref.dt, ref.dA_cumsum, **v),
        "compute_out": lambda **v: impls.compute_out(kw["C"], kw["B"], kw["x"], ref.dt, ref.dA_cumsum, ref.states,
                                                    **v),
        "ssd_forward": lambda **v: impls.ssd_forward(**kw, **v),
    }[stage]
    call()
    checked, values = [], []
    monkeypatch.setattr(check, "tensor", lambda *a, **k: checked.append(a[0]))
    original_values = check.values
    monkeypatch.setattr(check, "values", lambda **t: values.append(1) or original_values(**t))
    call()
    call(check_values=True)
    assert checked == [] and values == [1]


def test_value_checks_run_on_a_remembered_signature():
    kw = inputs()
    impls.ssd_forward(**kw, check_values=True)
    bad = torch.full_like(kw["x"], float("nan"))
    with pytest.raises(ValueError, match="^x: expected finite"):
        impls.ssd_forward(**{**kw, "x": bad}, check_values=True)


def test_other_strides_are_another_signature():
    kw = inputs()
    impls.ssd_forward(**kw)
    x = kw["x"].transpose(1, 2).contiguous().transpose(1, 2)  # the same shape, other strides
    impls.ssd_forward(**{**kw, "x": x})
    assert len(api._MEMO) == 2


def test_a_rebuilt_backend_by_name_is_asked_again(monkeypatch):
    """After the registry forgets its instances (a new tuning record), a by-name call asks the new one."""
    kw = inputs()
    impls.ssd_forward(**kw, backend="reference")
    registry.clear_cache()
    monkeypatch.setattr(ReferenceBackend, "supports", lambda self, problem: (False, "planted refusal"))
    with pytest.raises(impls.BackendUnavailable, match="planted refusal"):
        impls.ssd_forward(**kw, backend="reference")


def test_the_memo_is_bounded_and_holds_no_tensor():
    A = torch.randn(S.nheads)
    first = torch.rand(1, 16, S.nheads)
    alive = weakref.ref(first)
    impls.chunk_cumsum(first, A, 16)
    for seqlen in range(17, 17 + api.MEMO_SIZE + 8):
        impls.chunk_cumsum(torch.rand(1, seqlen, S.nheads), A, 16)
    assert len(api._MEMO) == api.MEMO_SIZE
    del first
    gc.collect()
    assert alive() is None


def test_a_hit_evicted_by_another_thread_is_still_a_hit(monkeypatch):
    """Another thread may evict the entry between the lookup and the move to the end: the call must not fail."""
    kw = inputs()
    impls.ssd_forward(**kw)

    class EvictedAfterGet(type(api._MEMO)):
        def get(self, key, default=None):
            hit = super().get(key, default)
            self.pop(key, None)
            return hit

    monkeypatch.setattr(api, "_MEMO", EvictedAfterGet(api._MEMO))
    impls.ssd_forward(**kw)


def test_a_remembered_call_asks_the_device_verdict_again(monkeypatch):
    """check_device reads process state (TRITON_INTERPRET for the Triton-based backends): a built backend passed
    in whose answer changed since the first call must refuse the repeated call."""
    kw = inputs()
    impl = ReferenceBackend()
    impls.ssd_forward(**kw, backend=impl)
    monkeypatch.setattr(impl, "check_device", lambda device: (False, "planted device refusal"))
    with pytest.raises(impls.BackendUnavailable, match="planted device refusal"):
        impls.ssd_forward(**kw, backend=impl)
