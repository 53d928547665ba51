"""Flax nnx layers and whole-model population evaluation."""

from jaxnoise.nn.linear import VirtualLinear
from jaxnoise.nn.population import (
    LinearBlock,
    NoiseBlock,
    ParameterLayout,
    fitness_gradient,
    parameter_layout,
    perturb_params,
    population_apply,
)
from jaxnoise.nn.ternary import (
    TernaryCodes,
    TernaryLinear,
    TernaryRMS,
    TernaryScale,
    TernaryState,
    get_ternary_params,
    set_ternary_params,
    ternary_value_and_grad,
)

__all__ = [
    "LinearBlock",
    "NoiseBlock",
    "ParameterLayout",
    "TernaryCodes",
    "TernaryLinear",
    "TernaryRMS",
    "TernaryScale",
    "TernaryState",
    "VirtualLinear",
    "fitness_gradient",
    "get_ternary_params",
    "parameter_layout",
    "perturb_params",
    "population_apply",
    "set_ternary_params",
    "ternary_value_and_grad",
]
