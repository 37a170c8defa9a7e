"""Whether a layer subclass's own ``forward`` computes what its base layer's does, checked on a probe.

Libraries subclass ``nn.Linear`` and override ``forward`` with the same formula written out: Hugging Face
Falcon's ``FalconLinear`` is ``input @ self.weight.T (+ self.bias)``. Read as source, that is "a custom
forward" and the layer would stay in floating point (8 of Falcon's 9 GEMMs). :func:`forward_matches_base`
runs the subclass's forward on small probe instances (built by the base's ``__init__``, random float64
weights, two inputs each, with and without a bias, square and not) and compares it with the base's forward: a
subclass that scales, clamps, activates or otherwise changes the result differs on a random input and stays float; one
that needs attributes of its own ``__init__`` cannot be probed and stays float too.

The probe never touches the user's layer (its weights may live on the meta device) and is run once per
class.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

__all__ = ["forward_matches_base"]

# base layer -> (probe constructor arguments: with and without a bias, square and not, input shape per probe)
_PROBES: dict[type, tuple[tuple[dict, tuple[int, ...]], ...]] = {
    nn.Linear: tuple(({"in_features": i, "out_features": o, "bias": b}, (2, 3, i))
                     for i, o in ((5, 3), (4, 4), (3, 5)) for b in (True, False)),
    nn.Conv1d: tuple(({"in_channels": i, "out_channels": o, "kernel_size": 3, "bias": b}, (2, i, 7))
                     for i, o in ((2, 3), (3, 3)) for b in (True, False)),
    nn.Conv2d: tuple(({"in_channels": i, "out_channels": o, "kernel_size": 3, "bias": b}, (2, i, 6, 6))
                     for i, o in ((2, 3), (3, 3)) for b in (True, False)),
}


@functools.cache
def forward_matches_base(cls: type, base: type) -> bool:
    """True when ``cls.forward`` (a subclass of ``base`` with a forward of its own) gives ``base.forward``'s
    result on random probes; False when it differs, fails, or ``base`` has no probe."""
    if base not in _PROBES or not issubclass(cls, base):
        return False
    generator = torch.Generator().manual_seed(0)
    try:
        for kwargs, shape in _PROBES[base]:
            probe = cls.__new__(cls)
            base.__init__(probe, **kwargs, dtype=torch.float64)
            with torch.no_grad():
                for parameter in probe.parameters():
                    parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
                probe.eval()
                for _ in range(2):
                    x = torch.randn(shape, generator=generator, dtype=torch.float64)
                    mine, theirs = cls.forward(probe, x), base.forward(probe, x)
                    if not (isinstance(mine, torch.Tensor) and mine.shape == theirs.shape
                            and torch.allclose(mine, theirs, rtol=1e-9, atol=1e-12)):
                        return False
    except Exception:  # a forward that needs more than the base's attributes: it computes something else
        return False
    return True
