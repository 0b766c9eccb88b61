"""The click model: DLRM-style, embedding bags for the sparse features and two MLPs."""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch import nn

from .config import DemoConfig
from .prepare import ModelBatch

__all__: List[str] = []


def _mlp(in_features: int, widths: Sequence[int], relu_last: bool) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them (and after the last if asked)."""
    layers: List[nn.Module] = []
    for k, width in enumerate(widths):
        layers.append(nn.Linear(in_features, width))
        if relu_last or k < len(widths) - 1:
            layers.append(nn.ReLU())
        in_features = width
    return nn.Sequential(*layers)


class ClickModel(nn.Module):
    """DLRM-style: bottom MLP on dense features, one EmbeddingBag per sparse feature, top MLP -> logit."""

    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, cfg.embedding_dim, mode="sum")
                                        for rows in cfg.table_sizes)
        self.bottom = _mlp(cfg.num_dense, cfg.bottom_mlp, relu_last=True)
        top_in = cfg.bottom_mlp[-1] + cfg.num_sparse * cfg.embedding_dim
        self.top = _mlp(top_in, (*cfg.top_mlp, 1), relu_last=False)

    def forward(self, batch: ModelBatch) -> torch.Tensor:
        pooled = [bag(ids, offsets) for bag, ids, offsets in zip(self.embeddings, batch.ids, batch.offsets)]
        logits: torch.Tensor = self.top(torch.cat([self.bottom(batch.dense), *pooled], dim=1))
        return logits
