"""swpipeline.embcache: embedding tables in host memory, a device cache, and the pipeline that trains through it.

::

    from swpipeline.embcache import EmbCacheTrainPipeline, HostEmbeddingBag

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = HostEmbeddingBag(10_000_000, 64, cache_rows=200_000, optimizer="adagrad", lr=0.01)
            self.top = torch.nn.Linear(64, 1)

        def forward(self, batch):
            logits = self.top(self.emb(batch["ids"], batch["offsets"])).squeeze(1)
            return F.binary_cross_entropy_with_logits(logits, batch["label"]), logits

    model = Model().to(device)
    pipeline = EmbCacheTrainPipeline(model, torch.optim.SGD(model.top.parameters(), lr=0.1), device,
                                     ids_of=lambda b: {"emb": (b["ids"], b["offsets"])})
    for output in pipeline.run(loader): ...        # or pipeline.progress(it) until StopIteration

Training through the cache computes exactly what the same model computes with an
ordinary ``nn.EmbeddingBag`` and ``torch.optim.SGD``/``Adagrad`` on the whole table.
docs/embcache.md shows the plan and how it relates to the system it is modelled on.
"""

# May import: the engine and everything below it (an application of the engine).

from .directory import SwapPlan as SwapPlan
from .pipeline import EmbCacheTrainPipeline as EmbCacheTrainPipeline
from .stats import EmbCacheStats as EmbCacheStats
from .stats import StageTime as StageTime
from .stats import TableStats as TableStats
from .table import HostEmbeddingBag as HostEmbeddingBag
from .trace_text import format_trace as format_trace

__all__ = [
    "EmbCacheStats",
    "EmbCacheTrainPipeline",
    "HostEmbeddingBag",
    "StageTime",
    "SwapPlan",
    "TableStats",
    "format_trace",
]
