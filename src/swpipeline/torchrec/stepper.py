"""StepwisePipeline: the clock-driven engine with TorchRec's step boundary.

``SWPipeline.progress()`` retires the oldest iteration and then enqueues the next
period at once, so the next period's work runs while the caller handles the
result. A TorchRec ``progress()`` call is one whole period: when it returns,
the model and optimizer are left alone until the next call (users step an LR
scheduler or read metrics there). ``progress_deferred()`` retires without
enqueuing; ``advance()`` enqueues the deferred period (fetching its batch)::

    TorchRec call k  ==  advance()            enqueue period k + depth - 1
                         progress_deferred()  wait for iteration k, retire it

``abandon()`` stops without running what is in flight (TorchRec's
``execute_all_batches=False``). These use three hooks of the engine
(``_do_retire``, ``_stop_workers``, ``_reset_state``); see docs/torchrec.md for
the public API this would become.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

from ..clocked import SWPipeline
from ..plan import IterContext

__all__: List[str] = []


class StepwisePipeline(SWPipeline):
    """An SWPipeline whose next period can be enqueued separately from the retirement."""

    def _reset_state(self) -> None:
        super()._reset_state()
        self._defer = False
        self._deferred: Optional[Tuple[int, Optional[Iterator[Any]]]] = None

    def progress_deferred(self, data_iter: Optional[Iterator[Any]]) -> int:
        """``progress()`` that leaves the next period for ``advance()``; returns the retired iteration."""
        self._defer = True
        try:
            return self.progress(data_iter)
        finally:
            self._defer = False

    def advance(self, fetch: bool = True) -> None:
        """Enqueue the period the last ``progress_deferred()`` left, drawing its batch unless ``fetch`` is False."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            oldest, data_iter = deferred
            super()._do_retire(oldest, data_iter if fetch else None)

    def contexts_in_flight(self) -> List[IterContext]:
        """The IterContexts of the iterations in flight, oldest first."""
        return [self._contexts[i] for i in sorted(self._contexts)]

    def _do_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        if self._defer:
            self._deferred = (oldest, data_iter)
        else:
            super()._do_retire(oldest, data_iter)

    def drain(self) -> None:
        """Retire everything in flight (enqueuing a deferred period first, without a new batch)."""
        if self._deferred is not None:
            self.advance(fetch=False)
        super().drain()

    def abandon(self) -> None:
        """Stop and join the workers without running the iterations still in flight; ready for a new fill."""
        self._stop_workers()
        self.device.synchronize()
        self._reset_state()
