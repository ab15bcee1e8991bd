"""instruments/intercept.py, the one launch interceptor of both languages: what each context replaces is in place
within it and put back as it was when it ends, an error inside included. (compile_only and the stand-in driver
compile for sm_90: tests/backends/test_triton_interp.py and tests/backends/test_triton_launcher.py run them without the
interpreter.)"""

from __future__ import annotations

import importlib

import pytest

from impls import registry
from instruments import intercept


@pytest.mark.parametrize("backend", ["cutile", "triton"])
def test_the_backends_own_launch_is_recorded_then_put_back(backend):
    module = importlib.import_module(intercept.LAUNCH_FUNCTIONS[backend])
    real, seen = module.launch, []
    with pytest.raises(KeyError), intercept.backend_launches(backend, lambda *a, **k: seen.append(a)):
        module.launch("call")
        raise KeyError("stop")
    assert seen == [("call",)] and module.launch is real


def test_a_dropped_launch_returns_nothing_and_an_unknown_backend_is_named():
    module = importlib.import_module(intercept.LAUNCH_FUNCTIONS["cutile"])
    with intercept.backend_launches("cutile"):
        assert module.launch("call") is None
    with pytest.raises(ValueError, match="backend: expected one of.*'fla'"):
        with intercept.backend_launches("fla"):
            pass


def test_device_answers_are_the_classes_own_again_afterwards():
    cls = registry.backend_class("triton")
    before = {name: vars(cls).get(name) for name in ("available", "check_device")}
    with intercept.device_answered("cutile", "triton"):
        assert cls.available() == (True, "") and cls.check_device(None, "cpu") == (True, "")
    assert {name: vars(cls).get(name) for name in before} == before


def test_an_attribute_the_owner_lacked_is_removed_again():
    class Owner:
        kept = 1

    with intercept.patched(Owner, kept=2, added=3):
        assert (Owner.kept, Owner.added) == (2, 3)
    assert Owner.kept == 1 and not hasattr(Owner, "added")
