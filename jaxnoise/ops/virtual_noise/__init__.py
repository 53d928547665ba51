"""Virtual-noise ops: perturbed linear, gradient estimates, reduce-metric."""

from jaxnoise.ops.virtual_noise.api import (
    compute_offsets,
    virtual_bias_gradient,
    virtual_perturbed_linear,
    virtual_reduce_metric,
    virtual_weight_gradient,
    virtual_weight_update,
)

__all__ = [
    "compute_offsets",
    "virtual_bias_gradient",
    "virtual_perturbed_linear",
    "virtual_reduce_metric",
    "virtual_weight_gradient",
    "virtual_weight_update",
]
