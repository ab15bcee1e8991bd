"""The start of a kernel launched as a programmatic dependent launch (switch pdl); why the kernels so launched stay
correct is in impls/cutile/common.py, and tests/backends/test_cutile_aot.py checks the order in their SASS."""

from __future__ import annotations

import cuda.tile as ct


def start_as_dependent():
    """The kernel's first statement under PDL: wait until the predecessor grid has completed and its memory writes
    are visible, then let this kernel's own successor launch. No load or store may come before it."""
    ct.grid_dependency_control_wait()
    ct.grid_dependency_control_launch_dependents()
