"""What torch operators touch while a task runs: the tensors they read and write, the generators they draw from.

``OperatorObserver`` is a ``TorchDispatchMode`` that hands each operator call's

* written tensors to ``wrote(tensor, region)``, after the operator ran: the arguments its schema
  marks as written (in place, ``out=``), each with the memory it covered *before* the call
  (``memory.Region``). That memory, which existed before the operator ran, is what it can have
  changed: a copy (``copy.deepcopy``, ``copy.copy``, unpickling) allocates a tensor, then fills
  or rebinds it, which writes only memory the copy itself made, never what it copies. An
  operator that rebinds a tensor to other memory (``set_``) changes no byte; it changes the
  tensor object, and comes with ``region`` None, as does a tensor that covered no memory (an
  empty one, resized): the write is of whatever holds that object. Where ``warns_before_writes``
  is set, the regions also go to ``writing(regions)``, all at once, before the operator runs (the
  race checker judges a write of the weights there, so that a race it reports has not yet
  changed what another task computes);
* read tensors to ``read_tensor(tensor)``: the arguments its schema does not mark as aliased, every
  one or (``reads_of``) only those whose storage is in a given set. An argument the result
  aliases without writing it (``t``, ``view``, ``detach``) is a view: no data is touched, so
  it is no read;
* generators drawn from to ``drew(key)`` (see ``generators.py``).

Both checks use it: ``analyze`` (``access.py``) over a whole serial task, noting every read,
and the race checker (``checked_call.py``), pushed on the calling thread's dispatch-mode stack
alone (``push``/``pop``), for the length of one task call, so that it sees that call's
operators and no other thread's. It is pushed with torch's stack functions, not ``with
observer:``, which would also set process-wide flags that change how ``torch.compile`` runs
on other threads; it declares ``ignore_compile_internals``, so compiled code on its own thread
compiles and runs as without it. Higher-order operators (``torch.cond`` & co.) pass through it
as they are: what they touch inside is not seen.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .generators import GeneratorKey, drawn_from, draws_nothing
from .memory import Region, region_of, storage_key

__all__: List[str] = []

_Where = Tuple[Tuple[int, str], ...]  # (position, name) of arguments
_Arguments = Tuple[_Where, _Where, bool]  # the arguments it reads, those it writes, whether it rebinds them
_ARGUMENTS: Dict[Any, _Arguments] = {}  # per operator
_REBINDING = frozenset({"set_"})  # operators that point their written tensor at other memory, writing no byte


def _arguments(func: Any) -> _Arguments:
    """Where an operator's schema says it reads and writes its arguments, and whether it rebinds the tensors it
    writes to other memory (cached per operator)."""
    found = _ARGUMENTS.get(func)
    if found is None:
        schema = getattr(func, "_schema", None)
        arguments = list(enumerate(schema.arguments if schema is not None else ()))
        packet = getattr(func, "overloadpacket", None)
        found = _ARGUMENTS[func] = (
            tuple((k, arg.name) for k, arg in arguments if arg.alias_info is None),
            tuple((k, arg.name) for k, arg in arguments if arg.alias_info is not None and arg.alias_info.is_write),
            getattr(packet, "__name__", None) in _REBINDING)
    return found


def _tensors(args: Sequence[Any], kwargs: Dict[str, Any], where: _Where) -> Iterator[torch.Tensor]:
    for k, name in where:
        value = args[k] if k < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


class OperatorObserver(TorchDispatchMode):
    """Hands every operator's reads, writes and draws to ``read_tensor``, ``wrote`` and ``drew`` (see the module
    docstring). ``reads_of``: the storages whose reads are handed on (None: every read)."""

    supports_higher_order_operators = True

    def __init_subclass__(cls, **kwargs: Any) -> None:  # typed, for the subclasses of modules mypy checks strictly
        super().__init_subclass__(**kwargs)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        reads, writes, rebinds = _ARGUMENTS.get(func) or _arguments(func)
        watched = self.reads_of
        if watched is None:
            for tensor in _tensors(args, kwargs, reads):
                self.read_tensor(tensor)
        elif watched:
            for tensor in _tensors(args, kwargs, reads):
                if storage_key(tensor) in watched:
                    self.read_tensor(tensor)
        if writes:  # the memory each written tensor covers now, before the call: what the operator can change
            written = list(_tensors(args, kwargs, writes))
            before = [None if rebinds else region_of(tensor) for tensor in written]
            if self.warns_before_writes:
                self.writing(before)
        result = func(*args, **kwargs)
        if writes:
            for tensor, region in zip(written, before):
                self.wrote(tensor, region)
        if draws_nothing(func):  # the common case: an operator known to draw nothing
            return result
        key = drawn_from(func, args, kwargs, result)
        if key is not None:
            self.drew(key)
        return result

    @property
    def reads_of(self) -> Optional[Collection[int]]:
        """The storages whose reads are handed to ``read_tensor`` (None: every read); none by default."""
        return ()

    def read_tensor(self, tensor: torch.Tensor) -> None:
        """An operator read ``tensor`` (one whose storage is in ``reads_of``, unless that is None)."""

    warns_before_writes = False  # whether ``writing`` is called before an operator writes

    def writing(self, regions: List[Optional[Region]]) -> None:
        """An operator is about to write the memory ``regions`` (None: a tensor object, as for ``wrote``; only if
        ``warns_before_writes``); raising here stops it."""

    def wrote(self, tensor: torch.Tensor, region: Optional[Region]) -> None:
        """An operator wrote ``tensor`` (in place or ``out=``): the memory ``region`` it covered before the call;
        None: the tensor object itself changed (rebound to other memory, or it covered none)."""

    def drew(self, key: GeneratorKey) -> None:
        """An operator drew from the generator ``key``."""


class Observer(OperatorObserver):
    """An ``OperatorObserver`` that hands each event to a function: ``analyze``'s, which notes every read.

    Unlike the race checker's, it does not ignore what compiled code runs: ``torch.compile``
    traces again under it, and the recorded iteration sees the operators inside.
    """

    def __init__(self, on_read: Callable[[torch.Tensor], None],
                 on_write: Callable[[torch.Tensor, Optional[Region]], None],
                 on_draw: Callable[[GeneratorKey], None]) -> None:
        super().__init__()
        self._on = (on_read, on_write, on_draw)

    @property
    def reads_of(self) -> Optional[Collection[int]]:
        return None  # every read

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return False

    def read_tensor(self, tensor: torch.Tensor) -> None:
        self._on[0](tensor)

    def wrote(self, tensor: torch.Tensor, region: Optional[Region]) -> None:
        self._on[1](tensor, region)

    def drew(self, key: GeneratorKey) -> None:
        self._on[2](key)


push: Callable[[OperatorObserver], None] = torch._C._push_on_torch_dispatch_stack  # this thread's stack only
pop: Callable[[None], Any] = torch._C._pop_torch_dispatch_stack
