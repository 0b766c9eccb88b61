"""HostEmbeddingBag: an embedding-bag table whose rows live in host memory, behind a device cache.

It computes what ``nn.EmbeddingBag(num_embeddings, embedding_dim, mode=mode)``
computes, and trains like that table stepped by ``torch.optim.SGD`` or
``torch.optim.Adagrad`` (every argument but ``lr`` at its default), bit for bit, but
keeps only ``cache_rows`` rows on the device. The rows and the optimizer state are in
host memory (``cache.py``); which rows are in the cache is planned batch by batch
(``directory.py``); the training step updates the rows a batch used in place in the
cache (``optim.py``). ``EmbCacheTrainPipeline`` drives all of it.

Inside a pipeline step the module's ``forward`` looks the batch up in the rows the
step gathered from the cache (a ``[distinct ids, dim]`` leaf tensor whose gradient the
sparse update consumes): the batch's ids are relabelled to their rank among the
batch's distinct ids, an order-preserving relabelling, so ``F.embedding_bag`` sums
and back-propagates in exactly the order the whole table would. Outside a pipeline
step (evaluation, a quick check), ``forward`` reads the current rows, without
gradient for the table.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .cache import RowCache
from .directory import CacheDirectory, SwapPlan
from .optim import RowOptimizer

__all__: List[str] = []

MODES = ("sum", "mean", "max")


@dataclass
class BatchRows:
    """One table's rows for one pipeline step: what ``forward`` and the sparse update use.

    ``weight`` is the batch's distinct rows, gathered from the cache (a leaf that
    requires grad when training); ``inverse`` maps each id of the batch to its row
    in ``weight``; ``slots`` are those rows' cache slots; ``ids`` (optional) is the
    batch's ids on the device, to check that the model passes the ids ``ids_of`` named.
    """

    weight: torch.Tensor
    inverse: torch.Tensor
    slots: torch.Tensor
    ids: Optional[torch.Tensor] = None
    used: bool = False


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


class HostEmbeddingBag(torch.nn.Module):
    """An ``nn.EmbeddingBag`` whose rows and optimizer state live in host memory, with a device cache.

    Args:
        num_embeddings: rows in the table.
        embedding_dim: the width of a row.
        cache_rows: rows the device cache holds (1 .. num_embeddings). Each batch's distinct
            ids must fit; a batch's swap runs while the previous batch trains as far as the two
            fit together, the rest of it after that batch's update (less overlap, same results).
        mode: ``"sum"``, ``"mean"`` or ``"max"``, as ``nn.EmbeddingBag``.
        optimizer: ``"sgd"`` or ``"adagrad"``: the update of ``torch.optim.SGD`` /
            ``torch.optim.Adagrad`` with their defaults besides ``lr``, applied by the pipeline.
        lr: the learning rate of the sparse updates.

    The rows start as ``nn.EmbeddingBag``'s do (standard normal, from torch's global
    generator); ``load_weight`` sets them, ``full_weight`` reads them back.

    Raises:
        TypeError: a size is not an int, ``mode``/``optimizer`` not a str, ``lr`` not a number.
        ValueError: a size < 1, ``cache_rows`` > ``num_embeddings``, an unknown mode or optimizer, a bad lr.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, cache_rows: int, mode: str = "sum",
                 optimizer: str = "sgd", lr: float) -> None:
        super().__init__()
        self.num_embeddings = _positive_int("num_embeddings", num_embeddings)
        self.embedding_dim = _positive_int("embedding_dim", embedding_dim)
        self.cache_rows = _positive_int("cache_rows", cache_rows)
        if cache_rows > num_embeddings:
            raise ValueError(f"cache_rows={cache_rows} is larger than the table (num_embeddings={num_embeddings}); "
                             f"use cache_rows <= {num_embeddings}")
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a str, one of {list(MODES)}; got {type(mode).__name__}")
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is unknown; use one of {list(MODES)}")
        self.mode = mode
        self.optimizer = RowOptimizer(optimizer, lr)
        weight = torch.empty(num_embeddings, embedding_dim)
        torch.nn.init.normal_(weight)  # nn.EmbeddingBag's initialization
        self.rows = RowCache(weight, cache_rows, self.optimizer.has_state)
        self.table_name = "HostEmbeddingBag"  # its module name, once a pipeline adopts it
        self.directory = CacheDirectory(self.table_name, num_embeddings, cache_rows)
        self._active: Optional[BatchRows] = None  # set by the pipeline around the model's forward
        # the pipeline whose run is in flight, held weakly: its worker threads reach this table, and they
        # must not keep a pipeline nobody refers to alive (its engine then ends the run itself)
        self._run_owner: Optional["weakref.ReferenceType[object]"] = None

    def __getstate__(self) -> Dict[str, Any]:
        """A copy (deepcopy, pickle) has the same rows and cache, and belongs to no pipeline run."""
        state = dict(self.__dict__)
        state.pop("_compiled_call_impl", None)  # as nn.Module.__getstate__
        state["_run_owner"], state["_active"] = None, None
        return state

    # -- whole-table access -----------------------------------------------------------------------

    def full_weight(self) -> torch.Tensor:
        """The whole table as a new ``[num_embeddings, dim]`` host tensor (cached rows at their current values)."""
        return self.rows.full_weight()

    def full_optimizer_state(self) -> Optional[torch.Tensor]:
        """Adagrad's per-element sum of squared gradients for the whole table (None for SGD)."""
        return self.rows.full_state()

    def load_weight(self, weight: torch.Tensor) -> None:
        """Set every row (the cache is emptied; the optimizer state is kept).

        Raises:
            TypeError: ``weight`` is not a floating-point tensor.
            ValueError: its shape is not ``[num_embeddings, embedding_dim]``.
            RuntimeError: a pipeline run is in flight.
        """
        self._load(self._checked("load_weight", weight), None)

    def load_optimizer_state(self, state: torch.Tensor) -> None:
        """Set Adagrad's sum for every row (as ``full_optimizer_state`` returns it).

        Raises:
            RuntimeError: the optimizer has no state (SGD), or a pipeline run is in flight.
            TypeError, ValueError: as for ``load_weight``.
        """
        if not self.optimizer.has_state:
            raise RuntimeError(f"load_optimizer_state: optimizer={self.optimizer.name!r} keeps no state; "
                               f"only 'adagrad' has one")
        self._load(None, self._checked("load_optimizer_state", state))

    def _checked(self, what: str, tensor: object) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError(f"{what}: expected a floating-point torch.Tensor, got {type(tensor).__name__}")
        shape = (self.num_embeddings, self.embedding_dim)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{what}: expected shape {list(shape)}, got {list(tensor.shape)}")
        return tensor.detach().to("cpu", torch.float32)

    def _load(self, weight: Optional[torch.Tensor], state: Optional[torch.Tensor]) -> None:
        if self._owner() is not None:
            raise RuntimeError(f"{self.table_name}: cannot load rows while a pipeline run is in flight; call the "
                               f"pipeline's reset() or finish the run (progress() until StopIteration) first")
        self.rows.load(weight, state)
        self.directory.resync(self.rows.resident_ids, self.rows.batches_swapped)

    # -- the pipeline's side ------------------------------------------------------------------------

    def adopt(self, name: str, device: torch.device) -> None:
        """Called by a pipeline: the module's name in the model, and the device its cache lives on."""
        self.table_name = name
        self.directory.name = name
        self.rows.attach(device)

    def begin_run(self, owner: object) -> None:
        current = self._owner()
        if current is not None and current is not owner:
            raise RuntimeError(f"{self.table_name}: another pipeline's run is in flight on this table; finish "
                               f"it or call its reset() first")
        self._run_owner = weakref.ref(owner)
        self.rows.forget_pending()
        self.directory.resync(self.rows.resident_ids, self.rows.batches_swapped)

    def _owner(self) -> Optional[object]:
        return self._run_owner() if self._run_owner is not None else None

    def end_run(self, owner: object) -> None:
        """The run ended (finished, failed or reset): forget plans whose swap never ran."""
        if self._owner() is owner:
            self._run_owner = None
            self.rows.forget_pending()
            self.directory.resync(self.rows.resident_ids, self.rows.batches_swapped)

    def check_ids(self, ids: torch.Tensor, where: Optional[str] = None) -> torch.Tensor:
        """``ids`` as a flat int64 host tensor, checked against the table's range (``where`` names them in errors).

        Raises:
            TypeError: not an integer tensor.
            ValueError: an id outside ``[0, num_embeddings)``.
        """
        where = where or f"ids_of(batch)[{self.table_name!r}]"
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{where}: ids must be an int64 or int32 tensor, got "
                            f"{ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__}")
        flat = ids.reshape(-1).to("cpu", torch.int64)
        if flat.numel():
            low, high = int(flat.min()), int(flat.max())
            if low < 0 or high >= self.num_embeddings:
                bad = low if low < 0 else high
                raise ValueError(f"{where}: id {bad} is out of range for a table of "
                                 f"num_embeddings={self.num_embeddings}; ids must be in [0, {self.num_embeddings})")
        return flat

    def plan_swap(self, unique_ids: torch.Tensor, num_ids: int) -> SwapPlan:
        return self.directory.plan(unique_ids, num_ids)

    def activate(self, rows: Optional[BatchRows]) -> None:
        self._active = rows

    # -- forward ------------------------------------------------------------------------------------

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Pooled embeddings of the bags, as ``nn.EmbeddingBag.forward(input, offsets, per_sample_weights)``.

        Raises:
            ValueError: ``input`` is neither 1-D with ``offsets`` nor 2-D without; ``offsets``
                do not start at 0, decrease or run past the ids; inside a pipeline step, the ids
                differ from those ``ids_of`` named, or the module is called twice in one step.
        """
        flat, offsets = _bags(input, offsets)
        active = self._active
        if input.dim() == 1 and (active is None or active.ids is not None):  # where the ids are checked too
            check_offsets(offsets, flat.numel(), f"{self.table_name}.forward")
        if active is None:
            unique_ids, inverse = torch.unique(flat.to("cpu", torch.int64), sorted=True, return_inverse=True)
            weight = self.rows.lookup(self.check_ids(unique_ids, f"{self.table_name}.forward"))
            inverse = inverse.to(device=flat.device, dtype=flat.dtype)
        else:
            self._check_call(active, flat)
            weight, inverse = active.weight, active.inverse.to(flat.dtype)
        return F.embedding_bag(inverse, weight, offsets, mode=self.mode, per_sample_weights=per_sample_weights)

    def _check_call(self, active: BatchRows, flat: torch.Tensor) -> None:
        if active.used:
            raise ValueError(f"{self.table_name} was called twice in one training step; each HostEmbeddingBag "
                             f"takes one call per step (the one ids_of(batch)[{self.table_name!r}] describes)")
        active.used = True
        same = flat.numel() == active.inverse.numel()
        if same and active.ids is not None:
            same = bool(torch.equal(flat.to(torch.int64), active.ids))
        if not same:
            raise ValueError(f"{self.table_name} was called with other ids than ids_of(batch)[{self.table_name!r}] "
                             f"returned ({flat.numel()} ids, expected {active.inverse.numel()}); ids_of must return "
                             f"the ids (and offsets) the model passes to this module")

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, cache_rows={self.cache_rows}, mode={self.mode!r}, "
                f"optimizer={self.optimizer.name!r}, lr={self.optimizer.lr:g}")

    # -- state_dict: the whole table, as nn.EmbeddingBag's "weight" --------------------------------------

    def _save_to_state_dict(self, destination: Dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.full_weight()
        state = self.full_optimizer_state()
        if state is not None:
            destination[prefix + "optimizer_sum"] = state

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Dict[str, Any],
                              strict: bool, missing_keys: List[str], unexpected_keys: List[str],
                              error_msgs: List[str]) -> None:
        keys: List[Tuple[str, Callable[[torch.Tensor], None]]] = [("weight", self.load_weight)]
        if self.optimizer.has_state:
            keys.append(("optimizer_sum", self.load_optimizer_state))
        for key, load in keys:
            if prefix + key in state_dict:
                load(state_dict[prefix + key])
            elif strict:
                missing_keys.append(prefix + key)


def check_offsets(offsets: object, num_ids: int, where: str) -> None:
    """Refuse ``offsets`` that are not where each bag of ``num_ids`` ids starts: 0 first, never decreasing, in range.

    ``nn.EmbeddingBag`` reads bag ``b`` as ids ``offsets[b]`` up to ``offsets[b+1]``; offsets that go
    back would make bags overlap or run backwards, and the table would train on what they happen
    to select.

    Raises:
        TypeError: not an integer tensor.
        ValueError: not 1-D, not starting at 0, decreasing somewhere, or past the last id.
    """
    if not isinstance(offsets, torch.Tensor) or offsets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{where}: offsets must be an int64 or int32 tensor (where each bag starts in the ids), "
                        f"got {offsets.dtype if isinstance(offsets, torch.Tensor) else type(offsets).__name__}")
    if offsets.dim() != 1:
        raise ValueError(f"{where}: offsets must be 1-D (where each bag starts in the ids), got shape "
                         f"{list(offsets.shape)}")
    if not offsets.numel():
        return
    host = offsets.to("cpu", torch.int64).numpy()  # a few numpy operations: cheaper than torch's here
    if host[0] != 0:
        raise ValueError(f"{where}: offsets must start at 0 (the first bag starts at the first id), got "
                         f"offsets[0]={int(host[0])}; prepend 0, e.g. offsets = cat([0], cumsum(lengths)[:-1])")
    back = host[1:] < host[:-1]
    if back.any():
        b = int(back.argmax()) + 1
        shown = host[max(b - 2, 0):b + 2].tolist()
        raise ValueError(f"{where}: offsets must not decrease (each is where a bag starts in the ids), but "
                         f"offsets[{b}]={int(host[b])} comes after offsets[{b - 1}]={int(host[b - 1])} "
                         f"(offsets[{max(b - 2, 0)}:{b + 2}] = {shown}); give each bag's start in order, e.g. "
                         f"offsets = cat([0], cumsum(lengths)[:-1]) for bags of the given lengths")
    if host[-1] > num_ids:
        raise ValueError(f"{where}: offsets[{host.size - 1}]={int(host[-1])} is past the end of the "
                         f"{num_ids} ids; every bag must start at most at the number of ids")


def _bags(input: torch.Tensor, offsets: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(ids, offsets)`` of a 1-D input with offsets, or of a 2-D input of fixed-size bags (as nn.EmbeddingBag)."""
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError("offsets must be None when input is 2-D (each row is one bag)")
        offsets = torch.arange(0, input.numel(), input.size(1), dtype=input.dtype, device=input.device)
        return input.reshape(-1), offsets
    if input.dim() != 1 or offsets is None:
        raise ValueError(f"input must be 1-D with offsets, or 2-D without; got a {input.dim()}-D input and "
                         f"offsets={'None' if offsets is None else 'a tensor'}")
    return input, offsets
