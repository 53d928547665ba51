"""Ternary counter ops: packed 6-bit counters, fused update, packed matmul.

See :mod:`jaxnoise.ops.ternary.reference` for the layout and the math.
"""

from jaxnoise.ops.ternary.api import (
    CounterUpdateResult,
    TernaryGrad,
    TernaryParams,
    counter_update,
    counter_update_from_io,
    pack_codes,
    ternary_decode,
    ternary_init,
    ternary_matmul,
    unpack_codes,
)
from jaxnoise.ops.ternary.config import (
    CounterUpdateConfig,
    ElementwiseConfig,
    FromIOConfig,
    MatmulConfig,
)

__all__ = [
    "CounterUpdateConfig",
    "CounterUpdateResult",
    "ElementwiseConfig",
    "FromIOConfig",
    "MatmulConfig",
    "TernaryGrad",
    "TernaryParams",
    "counter_update",
    "counter_update_from_io",
    "pack_codes",
    "ternary_decode",
    "ternary_init",
    "ternary_matmul",
    "unpack_codes",
]
