"""jaxnoise: evolution strategies with virtual noise and ternary counters in JAX."""

from jaxnoise.noise import DEFAULT_KIND, KINDS, as_seeds, draw_seeds, virtual_noise
from jaxnoise.ops.virtual_noise import (
    compute_offsets,
    virtual_bias_gradient,
    virtual_perturbed_linear,
    virtual_reduce_metric,
    virtual_weight_gradient,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "as_seeds",
    "compute_offsets",
    "draw_seeds",
    "virtual_bias_gradient",
    "virtual_noise",
    "virtual_perturbed_linear",
    "virtual_reduce_metric",
    "virtual_weight_gradient",
]
