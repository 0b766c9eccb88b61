"""Random number generators as shared state: which generator each random operator draws from.

A draw reads a generator's state and advances it, so two tasks that draw from one
generator conflict exactly like two tasks that write one tensor: which numbers each gets
depends on which draws first. The default generators (``torch.default_generator`` for
the CPU, one per accelerator device) are shared by every thread of the process.

**Which operators draw.** Seen in a ``TorchDispatchMode``, an operator draws when torch
tags it ``nondeterministic_seeded``, when an overload of it takes a ``Generator``
argument, or when it is ``native_dropout``; an attention kernel with a ``dropout_p``
argument draws only when ``dropout_p > 0``. Its generator is the ``generator``
argument, or, when that is None or absent, the default generator of the operator's
device (its ``device`` argument, else the device of its first tensor argument, else of
its result).

**Naming.** A default generator is named as torch spells it (``torch.default_generator``,
``torch.cuda.default_generators[0]``); an explicit one by the path the walk of the task
functions reaches it by (``loader.gen``, see ``naming.py``). An explicit generator the
walk does not reach is left out: it is the task's own (``task_generator``, or one made
inside the task), or state the checks cannot name.

The dispatch modes that call ``drawn_from`` for each operator a task runs are in
``access.py`` (``_OperatorAccess`` for ``analyze``, ``DrawObserver`` for the race checker).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

__all__: List[str] = []

GeneratorKey = Union[torch.device, int]  # the default generator of a device, or an explicit one's ``_cdata``


class _Rule:
    """Where a random operator's generator, device and dropout probability are in its arguments."""

    __slots__ = ("generator", "device", "dropout")

    def __init__(self, schema: Any) -> None:
        def find(predicate: Callable[[Any], bool]) -> Optional[Tuple[int, str]]:
            for k, arg in enumerate(schema.arguments):
                if predicate(arg):
                    return k, arg.name
            return None

        self.generator = find(lambda arg: "Generator" in str(arg.type))
        self.device = find(lambda arg: arg.name == "device" and "Device" in str(arg.type))
        self.dropout = find(lambda arg: arg.name == "dropout_p")


_RULES: Dict[Any, Optional[_Rule]] = {}  # operator overload -> its rule, or None: it draws nothing


def _rule_of(func: Any) -> Optional[_Rule]:
    rule = _RULES.get(func, _Rule)  # _Rule: not looked at yet
    if rule is _Rule:
        packet = getattr(func, "overloadpacket", None)
        schema = getattr(func, "_schema", None)
        overloads = [getattr(packet, name, None) for name in packet.overloads()] if packet is not None else []
        draws = schema is not None and (
            torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
            or getattr(packet, "__name__", "") == "native_dropout"
            or any(o is not None and any("Generator" in str(a.type) for a in o._schema.arguments) for o in overloads))
        rule = _RULES[func] = _Rule(schema) if draws else None
    return rule  # type: ignore[return-value]


def draws_nothing(func: Any) -> bool:
    """Whether an operator is known to draw nothing (cheap: the common case of every operator after its first
    call)."""
    return _RULES.get(func, _Rule) is None


def _argument(args: Sequence[Any], kwargs: Mapping[str, Any], where: Optional[Tuple[int, str]]) -> Any:
    if where is None:
        return None
    k, name = where
    return args[k] if k < len(args) else kwargs.get(name)


def _first_tensor(values: Iterator[Any]) -> Optional[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)):
            found = _first_tensor(iter(value))
            if found is not None:
                return found
    return None


def default_device(device: Any) -> torch.device:
    """``device`` with its index filled in (the current accelerator device when it has none)."""
    found: torch.device = torch.device(device)
    index: Optional[int] = found.index  # None for "cuda" (torch's stubs say int)
    if found.type != "cpu" and index is None:
        try:
            indexed: torch.device = torch.device(found.type, torch.accelerator.current_device_index())
            return indexed
        except Exception:  # not this process's accelerator: leave the index out
            return found
    return found


def drawn_from(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], result: Any) -> Optional[GeneratorKey]:
    """The generator an operator call drew from (None: it drew nothing)."""
    rule = _rule_of(func)
    if rule is None:
        return None
    dropout = _argument(args, kwargs, rule.dropout)
    if isinstance(dropout, (int, float)) and dropout <= 0:
        return None
    generator = _argument(args, kwargs, rule.generator)
    if isinstance(generator, torch.Generator):
        return _canonical(_identity(generator), generator.device)
    device = _argument(args, kwargs, rule.device)
    if device is None:
        tensor = _first_tensor(iter([*args, *kwargs.values()]))
        if tensor is None:
            tensor = _first_tensor(iter([result]))
        device = tensor.device if tensor is not None else torch.get_default_device()
    return default_device(device)


def _identity(generator: torch.Generator) -> int:
    """What identifies a generator: the address of torch's generator behind it (the Python object a dispatch mode
    is handed is a new one for each call)."""
    return int(getattr(generator, "_cdata"))


def _canonical(cdata: int, device: torch.device) -> GeneratorKey:
    """An explicit generator that is a device's default generator counts as that default generator."""
    if device.type == "cpu":
        return device if cdata == _identity(torch.default_generator) else cdata
    module = getattr(torch, device.type, None)
    defaults = getattr(module, "default_generators", ())
    for index, default in enumerate(defaults):
        if _identity(default) == cdata:
            return torch.device(device.type, index)
    return cdata


def generator_name(key: GeneratorKey, named: Mapping[int, str]) -> Optional[str]:
    """A generator's name in reports (None: an explicit generator nothing names, which is left out)."""
    if isinstance(key, int):
        return named.get(key)
    if key.type == "cpu":
        return "torch.default_generator"
    if hasattr(getattr(torch, key.type, None), "default_generators"):
        return f"torch.{key.type}.default_generators[{key.index if key.index is not None else 0}]"
    return f"the default {key} generator"


def named_generators(roots: Mapping[str, Any]) -> Dict[int, Tuple[str, torch.Generator]]:
    """The explicit generators among named roots: ``_cdata`` -> (name, the generator, kept alive)."""
    found: Dict[int, Tuple[str, torch.Generator]] = {}
    for name, obj in roots.items():
        if isinstance(obj, torch.Generator):
            key = _canonical(_identity(obj), obj.device)
            if isinstance(key, int):
                found.setdefault(key, (name, obj))
    return found
