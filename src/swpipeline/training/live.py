"""A module's live parameters as ``WeightVersions`` trains them: their layout, copies, and the checks at a step.

The live parameters are the ones the optimizer updates (the weights outside ``use``). This
module keeps what ``WeightVersions`` knows of them and refuses what would be lost:

* the layout (each parameter's name, identity, shape, dtype and device) when
  ``WeightVersions`` was made: a parameter added, removed, replaced or moved afterwards is
  refused (``check_layout``);
* a version changed in place inside ``use`` (``check_unchanged``): the change would reach
  other iterations and never the live weights;
* a gradient on a live parameter that no step put there (``check_no_stray_gradient``): the
  step would overwrite it.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

__all__: List[str] = []

Layout = List[Tuple[str, int, torch.Size, torch.dtype, torch.device]]


class LiveParameters:
    """A module's parameters, each once (shared ones too), with what a step must find unchanged."""

    def __init__(self, module: torch.nn.Module, local: threading.local) -> None:
        self.module = module
        self.local = local  # WeightVersions' thread-local: .current, the leaves of the iteration in use
        self.params = list(module.parameters())
        self.layout = self.current_layout()
        self.names = {id_: name for name, id_, *_ in self.layout}
        self.version_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.handed = self.grads_now()  # the gradients the last step left (or found at the start)

    def copy(self) -> List[torch.Tensor]:
        """A copy of every live parameter: a version."""
        with torch.no_grad():
            return [p.detach().clone() for p in self.params]

    def grads_now(self) -> List[Optional[Callable[[], Optional[torch.Tensor]]]]:
        """A weak reference to each parameter's gradient now (None: it has none)."""
        return [None if p.grad is None else weakref.ref(p.grad) for p in self.params]

    def current_layout(self) -> Layout:
        """Each live parameter's name, identity, shape, dtype and device (whatever thread asks, in use or not)."""
        before = getattr(self.local, "current", None)
        self.local.current = None
        try:
            return [(name, id(p), p.shape, p.dtype, p.device) for name, p in self.module.named_parameters()]
        finally:
            self.local.current = before

    def check_layout(self) -> None:
        """Refuse parameters added, removed, replaced or moved since ``WeightVersions`` was made."""
        now = self.current_layout()
        if now != self.layout:
            changed = next((a or b)[0] for a, b in itertools.zip_longest(now, self.layout) if a != b)
            raise RuntimeError(
                f"WeightVersions: the module's parameters changed after WeightVersions was made (first at "
                f"{changed!r}: added, removed, replaced, or moved to another device or dtype): make WeightVersions "
                f"once the module is complete and in place, or close() this one and make a new one")

    def check_unchanged(self, leaves: Dict[int, torch.Tensor], marks: Sequence[int], i: int) -> None:
        """Refuse a version changed in place inside ``use``: other iterations would see it, the live weights never."""
        for p, mark in zip(self.params, marks):
            if leaves[id(p)]._version != mark:
                name = self.names.get(id(p), "?")
                raise RuntimeError(
                    f"WeightVersions.step: parameter {name!r} was changed in place inside `with versions.use(ctx):` "
                    f"before the step of iteration {i} (under torch.no_grad(), e.g. nn.Embedding(max_norm=...) "
                    f"renormalizing its weight in the forward): the change is in the version, which other iterations "
                    f"use, and never reaches the live weights. Change the weights outside use (in before_step, or "
                    f"between runs), or train this module without WeightVersions")

    def check_no_stray_gradient(self, i: int) -> None:
        """Refuse a gradient on a live parameter that no step put there: the step would drop it."""
        for p, handed in zip(self.params, self.handed):
            grad = p.grad
            if grad is not None and (handed is None or handed() is not grad):
                name = self.names.get(id(p), "?")
                raise RuntimeError(
                    f"WeightVersions.step: the live parameter {name!r} has a gradient that no step put there, before "
                    f"the step of iteration {i}: a loss term computed with the live parameters (outside `with "
                    f"versions.use(ctx):`, or on another thread) would be dropped here. Compute every loss term "
                    f"inside use(ctx), where the module's parameters (attributes, parameters(), named_parameters()) "
                    f"are the iteration's version; then clear the live .grad (optimizer.zero_grad()) to go on")
