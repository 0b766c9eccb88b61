"""A run's data: the one owner of the data iterator, and of the iterations drawn from it until they retire.

``fill_pipeline(data)`` gives the run ``iter(data)``; ``progress(it)`` may hand it
another iterator from then on (``use``), ``progress(None)`` none for that step. The
hand-out draws through ``draw`` (the release rule decides when), which makes each batch
an iteration's ``IterContext``; ``Run.retire_oldest`` moves the oldest one out, to ``last_ctx``.
Nothing else holds the iterator or the contexts in flight, so letting go of them when
the run stops (``let_go``) frees every batch of the caller's the run held.

On a device with events, a batch is drawn on the caller's current stream: an event is
recorded after it for the tasks that read the batch first on another stream
(``batch_events``, ``batch_streams``, per event slot, which the unit executor reads).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, cast

from ..devices.device import Device
from ..errors import add_note
from ..plan.context import IterContext
from .runtime import BoundTask

__all__: List[str] = []


def data_source(data_iter: object) -> Iterator[Any]:
    """``data_iter`` if it is an iterator; a TypeError otherwise (an iterable would start over on every call)."""
    if not callable(getattr(type(data_iter), "__next__", None)):
        raise TypeError(f"progress(): data_iter must be an iterator (the one fill_pipeline() returned) or None, "
                        f"got a {type(data_iter).__name__}: an iterable that is not an iterator would give its "
                        f"first batch again on every call; pass the iterator fill_pipeline(data) returned "
                        f"(nothing was retired or fetched)")
    return cast(Iterator[Any], data_iter)


class Feed:
    """The data iterator of one run and its iterations in flight (see the module docstring)."""

    def __init__(self, data_iter: Iterator[Any], device: Device, tasks: List[BoundTask], event_slots: int) -> None:
        self.source: Optional[Iterator[Any]] = data_iter  # what draw() draws from
        self.device = device
        self.event_slots = event_slots
        self.contexts: Dict[int, IterContext] = {}  # the iterations in flight
        self.next_retire = 0
        self.num_created = 0
        self.exhausted = False  # the data iterator raised StopIteration
        self.last_ctx: Optional[IterContext] = None
        self.peak_live_contexts = 0
        # On a device with events, per event slot: the event recorded on the stream the caller drew that
        # iteration's batch on, and that stream (None: no task needs to wait for it). The events are made
        # when first needed.
        self._batch_roots = list({id(t.stream): t.stream for t in tasks if t.waits_batch}.values())
        self.batch_events: List[Any] = []
        self.batch_streams: List[Any] = [None] * event_slots

    @property
    def in_flight(self) -> bool:
        return self.next_retire < self.num_created

    def check(self, data_iter: Optional[Iterator[Any]]) -> None:
        """Raise the TypeError ``use`` would for ``data_iter``, changing nothing."""
        if data_iter is not self.source and data_iter is not None:
            data_source(data_iter)

    def use(self, data_iter: Optional[Iterator[Any]]) -> None:
        """``progress(data_iter)``: draw from ``data_iter`` from now on (None: keep the one there is).

        Raises:
            TypeError: ``data_iter`` is not an iterator.
        """
        if data_iter is not self.source and data_iter is not None:
            self.source = data_source(data_iter)

    def draw(self) -> Optional[IterContext]:
        """The next iteration's context from the next batch, or None when there is none (yet)."""
        data_iter = self.source
        if data_iter is None or self.exhausted:
            return None
        idx = self.num_created
        try:
            batch = self._draw_on_device(data_iter, idx) if self._batch_roots else next(data_iter)
        except StopIteration:
            self.exhausted = True
            return None
        except BaseException as exc:
            add_note(exc, f"swpipeline: the data iterator raised while fetching the batch for iteration {idx}; "
                          f"in-flight iterations {sorted(self.contexts)} were abandoned")
            raise
        ctx = IterContext(batch, idx)
        self.num_created = idx + 1
        self.contexts[idx] = ctx
        self.peak_live_contexts = max(self.peak_live_contexts, len(self.contexts))
        return ctx

    def _draw_on_device(self, data_iter: Iterator[Any], idx: int) -> Any:
        """The next batch, and an event after it on the caller's current stream for the tasks that read it.

        Whatever the data iterator does on the device (a copy, a collate on the GPU) goes to
        the stream current on this thread. A task with no producer in its iteration that
        runs on another stream waits for this event before it starts (``executor``); every
        other task follows one of those, or runs on this stream after it.
        """
        device, slot = self.device, idx % self.event_slots
        stream = device.caller_stream()
        batch = device.fetch(stream, data_iter, idx)
        if any(root != stream for root in self._batch_roots):
            if not self.batch_events:
                self.batch_events.extend(device.new_event() for _ in range(self.event_slots))
            device.record(self.batch_events[slot], stream)
            self.batch_streams[slot] = stream
        else:
            self.batch_streams[slot] = None
        return batch

    def let_go(self) -> None:
        """The run stopped: drop the contexts in flight (they hold the caller's batches) and the iterator."""
        self.contexts.clear()
        self.source = None
