"""optax-style optimizers: evolution strategies and ternary counters."""

from jaxnoise.optim.es import (
    FITNESS_SHAPINGS,
    NONFINITE_POLICIES,
    EvolutionStrategy,
    EvolutionStrategyState,
    centered_rank,
    evolution_strategy,
    replace_nonfinite,
    shape_fitness,
    z_score,
)
from jaxnoise.optim.ternary import (
    TernaryCounter,
    TernaryCounterState,
    step_seed,
    ternary_counter,
)

__all__ = [
    "FITNESS_SHAPINGS",
    "NONFINITE_POLICIES",
    "EvolutionStrategy",
    "EvolutionStrategyState",
    "TernaryCounter",
    "TernaryCounterState",
    "centered_rank",
    "evolution_strategy",
    "replace_nonfinite",
    "shape_fitness",
    "step_seed",
    "ternary_counter",
    "z_score",
]
