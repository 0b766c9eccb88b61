"""Sparse updates of embedding rows with exactly the arithmetic of ``torch.optim.SGD`` / ``torch.optim.Adagrad``.

A table trained through the cache must end bit for bit where the same table would
end as an ordinary ``nn.EmbeddingBag`` stepped by ``torch.optim.SGD(params, lr)`` or
``torch.optim.Adagrad(params, lr)`` (every other argument at its default). Those
optimizers update the whole table with a dense gradient that is zero outside the
rows a batch used, and a zero gradient leaves a row (and its Adagrad sum) exactly
as it was. So updating only the used rows, gathered into a ``[rows, dim]`` tensor,
with the same element-wise operations in the same order, gives the same bits:

    SGD       row += -lr * grad                                  (param.add_(grad, alpha=-lr))
    Adagrad   sum += grad * grad;  row += -lr * grad / (sqrt(sum) + eps)
              (state_sum.addcmul_(grad, grad, value=1); std = state_sum.sqrt().add_(eps);
               param.addcdiv_(grad, std, value=-clr), where clr = lr with lr_decay = 0)

On a GPU torch's optimizers take their multi-tensor ("foreach") path by default, and
there its Adagrad rounds the last line differently: it multiplies first, then divides
(``numerator = grad * -clr; param.addcdiv_(numerator, std)``), where the GPU's
``addcdiv`` divides first (on the CPU both orders give the same bits). The rows follow the
path torch takes by default on their device (``foreach`` chooses one explicitly), so
the bits match ``torch.optim.Adagrad(params, lr)`` on the CPU and on the GPU alike.

Adagrad's per-row state (its running sum of squared gradients, initially zero) has
the shape of the rows, so it moves between host and cache together with them.

The torch kernels behind these operations are element-wise and give the same result
for an element wherever it sits in a tensor (checked by the tests against
``torch.optim`` on whole tables of several widths).
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch

__all__: List[str] = []

OPTIMIZERS = ("sgd", "adagrad")
ADAGRAD_EPS = 1e-10  # torch.optim.Adagrad's default eps


class RowOptimizer:
    """The update rule of one table: ``update(rows, grad, state)`` changes ``rows`` (and ``state``) in place.

    Args:
        name: ``"sgd"`` or ``"adagrad"``.
        lr: the learning rate, a finite number >= 0 (as ``torch.optim`` accepts).
        foreach: round as torch's multi-tensor path (True) or its single-tensor path (False);
            None (the default) takes the path torch takes by default for the rows' device.

    Raises:
        TypeError: ``name`` is not a str or ``lr`` is not a number.
        ValueError: an unknown optimizer name, or a negative or non-finite ``lr``.
    """

    def __init__(self, name: str, lr: float, foreach: Optional[bool] = None) -> None:
        if not isinstance(name, str):
            raise TypeError(f"optimizer must be a str, one of {list(OPTIMIZERS)}; got {type(name).__name__} {name!r}")
        if name not in OPTIMIZERS:
            raise ValueError(f"optimizer={name!r} is unknown; use one of {list(OPTIMIZERS)} (the update of "
                             f"torch.optim.SGD or torch.optim.Adagrad with their default arguments besides lr)")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)):
            raise TypeError(f"lr must be a number, got {type(lr).__name__} {lr!r}")
        if not math.isfinite(lr) or lr < 0:
            raise ValueError(f"lr={lr!r} is invalid; the learning rate must be a finite number >= 0")
        self.name = name
        self.lr = float(lr)
        self.foreach = foreach

    @property
    def has_state(self) -> bool:
        """Whether each row carries optimizer state of its own shape (Adagrad's sum)."""
        return self.name == "adagrad"

    def update(self, rows: torch.Tensor, grad: torch.Tensor, state: Optional[torch.Tensor]) -> None:
        """Apply one step to ``rows`` (``[n, dim]``) given their gradient; ``state`` is Adagrad's sum of the rows."""
        if self.name == "sgd":
            rows.add_(grad, alpha=-self.lr)
            return
        if state is None:
            raise RuntimeError("adagrad update without its state rows (an internal error: the state must move "
                               "with the rows)")
        state.addcmul_(grad, grad, value=1)
        std = state.sqrt().add_(ADAGRAD_EPS)
        foreach = self.foreach if self.foreach is not None else torch_defaults_to_foreach(rows.device)
        if foreach:
            rows.addcdiv_(grad * -self.lr, std)
        else:
            rows.addcdiv_(grad, std, value=-self.lr)

    def __repr__(self) -> str:
        return f"RowOptimizer({self.name!r}, lr={self.lr:g})"


def torch_defaults_to_foreach(device: torch.device) -> bool:
    """Whether ``torch.optim`` takes its multi-tensor path by default for parameters on ``device``."""
    try:
        from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices
        supported = _get_foreach_kernels_supported_devices()
    except ImportError:  # a torch without the helper: the devices it has always named
        supported = ["cuda", "xpu"]
    return device.type in supported
