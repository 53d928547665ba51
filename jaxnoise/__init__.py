"""jaxnoise: evolution strategies with virtual noise and ternary counters in JAX.

* Virtual-noise ops (:func:`virtual_perturbed_linear`, :func:`virtual_weight_gradient`,
  :func:`virtual_weight_update`,
  :func:`virtual_bias_gradient`, :func:`virtual_reduce_metric`) evaluate a population of
  perturbed models without storing the noise; :mod:`jaxnoise.noise` defines it.
* Ternary counter ops (:func:`counter_update`, :func:`ternary_matmul`, ...) train
  weights stored as packed 6-bit counters.
* :mod:`jaxnoise.batching` (per-individual functions that vmap into one launch),
  :mod:`jaxnoise.nn` (Flax nnx), :mod:`jaxnoise.optim` (optax style) and
  :mod:`jaxnoise.parallel` (population sharding) fit them into the ecosystem.
* :mod:`jaxnoise.checks` turns the documented policies for bad *traced* values
  into run-time errors (``checkify``); concrete bad arguments always raise.
"""

from jaxnoise import batching, checks, nn, noise, optim, parallel
from jaxnoise.noise import DEFAULT_KIND, KINDS, as_seeds, draw_seeds, virtual_noise
from jaxnoise.ops import autotune
from jaxnoise.ops.ternary import (
    CounterUpdateConfig,
    CounterUpdateResult,
    ElementwiseConfig,
    FromIOConfig,
    MatmulConfig,
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
from jaxnoise.ops.virtual_noise import (
    compute_offsets,
    virtual_bias_gradient,
    virtual_perturbed_linear,
    virtual_reduce_metric,
    virtual_weight_gradient,
    virtual_weight_update,
)
from jaxnoise.ops.virtual_noise.config import (
    NoiseGradientConfig,
    PerturbedLinearConfig,
    ReduceMetricConfig,
)
from jaxnoise.ops.virtual_noise.tuning import (
    tune_perturbed_linear,
    tune_reduce_metric,
    tune_weight_gradient,
)
from jaxnoise.parallel import population_mesh, sharded_fitness

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "CounterUpdateConfig",
    "CounterUpdateResult",
    "ElementwiseConfig",
    "FromIOConfig",
    "MatmulConfig",
    "NoiseGradientConfig",
    "PerturbedLinearConfig",
    "ReduceMetricConfig",
    "TernaryGrad",
    "TernaryParams",
    "as_seeds",
    "autotune",
    "batching",
    "checks",
    "compute_offsets",
    "counter_update",
    "counter_update_from_io",
    "draw_seeds",
    "nn",
    "noise",
    "optim",
    "pack_codes",
    "parallel",
    "population_mesh",
    "sharded_fitness",
    "ternary_decode",
    "ternary_init",
    "ternary_matmul",
    "tune_perturbed_linear",
    "tune_reduce_metric",
    "tune_weight_gradient",
    "unpack_codes",
    "virtual_bias_gradient",
    "virtual_noise",
    "virtual_perturbed_linear",
    "virtual_reduce_metric",
    "virtual_weight_gradient",
    "virtual_weight_update",
]
