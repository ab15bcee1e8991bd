"""A backward by autograd over a forward that is itself differentiable (plain torch ops, or a peer's own
autograd function): the forward runs once on detached leaves with grad enabled and keeps its graph; the backward
walks that graph. What `impls.ssd` uses for the reference and for mamba-ssm (impls/README.md, "The backward")."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from impls.registry import ForwardResult

OUTPUTS = ("y", "final_states", "varlen_states")


@dataclass
class GraphBackward:
    """The forward's outputs (detached) and the graph behind them; `backward` gives each input's gradient."""

    outputs: ForwardResult
    graph: ForwardResult
    leaves: dict[str, torch.Tensor]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # what the backward runs in

    def backward(self, grads: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        """{output name: incoming gradient (None: none flows in)} -> {input name: gradient (None: none)}."""
        pairs = [(getattr(self.graph, name), g) for name, g in grads.items()
                 if g is not None and getattr(self.graph, name) is not None and getattr(self.graph, name).requires_grad]
        wanted = {name: t for name, t in self.leaves.items() if t.requires_grad}
        if not pairs or not wanted:
            return dict.fromkeys(self.leaves)
        # retained: a caller's backward with retain_graph=True (gradcheck's) walks it again; the buffers go when the
        # outputs' autograd node does, as saved tensors would
        with self.context():
            found = torch.autograd.grad([out for out, _ in pairs], list(wanted.values()), [g for _, g in pairs],
                                        allow_unused=True, retain_graph=True)
        return dict(zip(wanted, found))


def graph_backward(forward: Callable[..., ForwardResult], args: dict, needs: dict[str, bool],
                   context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> GraphBackward:
    """Runs `forward(**args)` on leaves detached from the caller's tensors (those in `needs`, requiring grad where
    needs says so), with grad enabled, and keeps the graph for `GraphBackward.backward`, which runs in `context()`
    (mamba-ssm's interpreter mode on CPU tensors, for one)."""
    leaves = {name: args[name].detach().requires_grad_(wanted) for name, wanted in needs.items()
              if args.get(name) is not None}
    with torch.enable_grad():
        graph = forward(**{**args, **leaves})
    outputs = ForwardResult(*(None if getattr(graph, name) is None else getattr(graph, name).detach()
                              for name in OUTPUTS))
    return GraphBackward(outputs, graph, leaves, context)
