"""Frozen kernel configs of the ternary ops and their heuristic defaults.

Every Triton tensor must have power-of-2 sizes, so all block sizes here are
powers of two; ragged edges are masked in the kernels. A config is hashable
(it is a static argument of the jitted ops) and every field is used by its
kernel: nothing is accepted and ignored.

Tiling, in "groups" of four codes (one group = 3 packed bytes = 4 inputs);
kernels read codes as uint32 words (16 codes) where rows allow, else bytes:

* :class:`ElementwiseConfig` (pack, unpack, decode, init): one program per
  ``block_rows`` rows, walking the row in chunks of ``block_groups`` groups.
* :class:`CounterUpdateConfig`: one program per ``block_rows`` whole rows,
  held in registers as static power-of-2 chunks (up to ``in = 16384``), so
  the gradient is read once; longer rows take two passes (statistics, then
  update), the second one mostly from L2.
* :class:`FromIOConfig`: GEMM tiles ``block_rows x (4 * block_groups)`` of
  ``grad_out^T x`` accumulated over ``block_m`` rows of ``M`` at a time.
* :class:`MatmulConfig`: ``block_m x block_n`` output tiles of ``x @ W^T``
  walking ``in`` in chunks of ``block_groups`` groups, ``split_k`` programs
  along ``in`` (for decode-sized ``M``), or the ``"fma"`` / ``"decode"`` methods.

Each op's ``candidates`` are the heuristic and its neighbours: the autotuning
space (:mod:`jaxnoise.ops.ternary.tuning`) and the benchmark sweeps.

One module per idea (:mod:`.elementwise`, :mod:`.update` for both counter
updates, :mod:`.matmul`), each with its autotuning keys; this package
re-exports them.
"""

from jaxnoise.ops.ternary.config._common import check_config, next_power_of_2
from jaxnoise.ops.ternary.config.elementwise import ElementwiseConfig
from jaxnoise.ops.ternary.config.matmul import (
    DECODE_TARGETS,
    MATMUL_METHODS,
    MatmulConfig,
    matmul_input_grad_key,
    matmul_key,
)
from jaxnoise.ops.ternary.config.update import (
    CounterUpdateConfig,
    FromIOConfig,
    counter_update_key,
    from_io_key,
)

__all__ = [
    "CounterUpdateConfig",
    "DECODE_TARGETS",
    "ElementwiseConfig",
    "FromIOConfig",
    "MATMUL_METHODS",
    "MatmulConfig",
    "check_config",
    "counter_update_key",
    "from_io_key",
    "matmul_input_grad_key",
    "matmul_key",
    "next_power_of_2",
]
