"""How a module shows a thread the iteration's version of its weights: its parameter tables, replaced.

``WeightVersions`` replaces every submodule's ``_parameters`` dict by a
``VersionedParameters`` table. Everything torch does with a module's parameters goes
through that table: an attribute (``module.weight``) through ``__getitem__``;
``parameters()``, ``named_parameters()``, ``state_dict()`` and ``to()`` through
``items()``. On a thread inside ``use(ctx)`` both give the iteration's leaf of each
parameter (its version); anywhere else the live parameter. The thread's current leaves
are one thread-local value, so the check costs the forward one attribute read per
parameter it reads. Also here: the modules the tables cannot serve, and small helpers.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import torch

from ..plan.context import IterContext

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_values

__all__: List[str] = []


class VersionedParameters(Dict[str, Any]):
    """A submodule's parameter table: inside ``use``, on the using thread, each name gives its version's leaf."""

    __slots__ = ("owner", "local")

    def __init__(self, table: Dict[str, Any], owner: object, local: threading.local) -> None:
        super().__init__(table)
        self.owner = owner  # the WeightVersions that made this table
        self.local = local  # .current: the leaves (by id of the live parameter) of this thread's iteration

    def __getitem__(self, name: str) -> Any:
        live = dict.__getitem__(self, name)
        current: Optional[Dict[int, torch.Tensor]] = getattr(self.local, "current", None)
        if current is None or live is None:
            return live
        leaf = current.get(id(live))
        if leaf is None:
            raise _unversioned(name)
        return leaf

    def items(self) -> dict_items[str, Any]:
        current: Optional[Dict[int, torch.Tensor]] = getattr(self.local, "current", None)
        if current is None:
            return dict.items(self)
        return {name: _leaf(name, live, current) for name, live in dict.items(self)}.items()

    def values(self) -> dict_values[str, Any]:
        return dict(self.items()).values()

    def live_items(self) -> dict_items[str, Any]:
        """The live parameters, whichever thread asks."""
        return dict.items(self)

    def __reduce__(self) -> Any:  # copy.deepcopy / pickle of the module: a plain table of the live parameters
        return (dict, (dict(dict.items(self)),))


def _leaf(name: str, live: Any, current: Dict[int, torch.Tensor]) -> Any:
    if live is None:
        return None
    leaf = current.get(id(live))
    if leaf is None:
        raise _unversioned(name)
    return leaf


def _unversioned(name: str) -> RuntimeError:
    return RuntimeError(f"WeightVersions: parameter {name!r} was set after WeightVersions was made, so it has no "
                        f"versions: finish the module first, or close() and make a new WeightVersions")


def refuse_load_inside_use(module: torch.nn.Module, *args: Any) -> None:
    """``load_state_dict`` pre-hook of a versioned module: loading inside ``use`` would write into the
    iteration's version, not the live weights. A plain function, so a copy of the module (whose tables are
    plain ones) deep-copies and pickles it as a no-op."""
    table = module.__dict__.get("_parameters")
    if isinstance(table, VersionedParameters) and getattr(table.local, "current", None) is not None:
        raise RuntimeError(
            f"WeightVersions: load_state_dict on a {type(module).__name__} inside `with versions.use(ctx):` would "
            f"write into the iteration's version of the weights, not the live ones: load outside use (before a "
            f"run, or between runs)")


def iteration_context(ctx: IterContext) -> IterContext:
    """The context itself, also when a check hands the task a stand-in for it (its recording view)."""
    unwrap = getattr(type(ctx), "__swp_context__", None)
    if unwrap is None:
        raise TypeError(f"WeightVersions: expected the task's IterContext, got {type(ctx).__name__}")
    context: IterContext = unwrap(ctx)
    return context


def refusal(module: torch.nn.Module) -> Optional[str]:
    """Why WeightVersions cannot version ``module`` (None: it can)."""
    for name, sub in module.named_modules():
        where = f"submodule {name!r}" if name else "it"
        kinds = {c.__name__ for c in type(sub).__mro__}
        if "OptimizedModule" in kinds or getattr(sub, "_compiled_call_impl", None) is not None:
            return (f"{where} is compiled (torch.compile), and compiled code does not read the parameters through "
                    f"the module at every call, so it would not see the iteration's version: give WeightVersions "
                    f"the module before compiling (for torch.compile(m), m._orig_mod) and run it uncompiled")
        wrapper = kinds & {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"}
        if wrapper:
            return (f"{where} is wrapped in {wrapper.pop()}, which reads or reduces the live parameters itself while "
                    f"a stale iteration computes with its own version: give WeightVersions the plain module and "
                    f"average the gradients in the step, versions.step(ctx, optimizer, before_step=fn) with fn "
                    f"calling torch.distributed.all_reduce on each p.grad (then dividing by the world size)")
        if isinstance(sub, torch.nn.RNNBase):
            return (f"{where} is a {type(sub).__name__}, which keeps its own list of its weights (_flat_weights) "
                    f"and would compute with the live ones: write the loop with nn.RNNCell, nn.LSTMCell or "
                    f"nn.GRUCell, which read their parameters at every call")
        if isinstance(sub._parameters, VersionedParameters):
            return f"{where} is already versioned by another WeightVersions: close() that one first"
    return None


def keep_for_this_stream(tensors: Sequence[Optional[torch.Tensor]]) -> None:
    """Mark each accelerator tensor as in use by the current stream: its memory, once freed, waits for that
    stream's work queued so far before it is handed out again (a no-op on the CPU)."""
    for t in tensors:
        if t is not None and t.device.type != "cpu" and hasattr(t, "record_stream"):
            t.record_stream(torch.get_device_module(t.device).current_stream(t.device))
