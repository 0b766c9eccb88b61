"""Streams and events: the one interface the engine uses to the hardware.

* ``device.py``: ``Device``, ``CPUDevice`` (a stream is an execution lane) and ``TorchDevice``
  (stream switching per call and thread, events, memory kept alive across streams);
* ``simulated.py``: ``SimulatedDevice``, the GPU protocol on the CPU, with streams behind the host;
* ``annotations.py``: profiler and NVTX ranges around task calls.

May import: the plan model and the leaves. Not the engine, the observers or the shortcut.
"""

from typing import List

__all__: List[str] = []
