"""The library's counter-update kernel against a frozen copy of the one before it, bit for bit.

    python benchmarks/baseline_update/check_counter_update.py             # GPU, compiled
    python benchmarks/baseline_update/check_counter_update.py --suite thorough
    python benchmarks/baseline_update/check_counter_update.py --interpret # CPU smoke check

Runs :func:`jaxnoise.ops.ternary.pallas_triton_update.counter_update` (this
tree) and ``update_7fbab3d.counter_update`` (the kernel at 7fbab3d, beside this
file) on the same inputs and asserts that the packed codes, ``scale``, ``v``
and ``skipped`` are the same bits. Prints one line per case, then the counts
of passes and failures; exits 1 on any failure.

Suites:

* ``default``: 8192x8192, 4096x4096, 1536x2304, 1000x3996 (byte units), a tiny
  ragged shape, float32 and bfloat16 gradients, two-pass rows (past
  ``MAX_RESIDENT_GROUPS``: a masked last tile, and whole tiles), skipped rows
  (NaN, inf, invalid state) and zero rows. With ``--interpret`` the shapes
  shrink to what the Pallas interpreter runs in seconds.
* ``thorough``: small shapes over word and byte layouts, masked chunks,
  two-pass loops, several ``C``, lagged or not, float32 / bfloat16 / float16,
  codes past the valid range, and the 64-bit index path (forced).

Gradients are either ``exact`` (small integers times ``2**-6``: every row sum
is exact in any order, so a kernel that sums in another order still agrees)
or ``random`` (normal: agreement needs the same summation order). Compiled,
both kernels sum in the same order, so both kinds must agree. Interpreted,
XLA on the CPU compiles each kernel's sums its own way (``sum g**2``, the
same code in both, came out a few ulps apart), so with ``random`` gradients
``v`` or ``scale`` can differ in the last bits there; ``exact`` cases are the
interpreter's fair test. Each case
also counts the codes that differ from the pure-JAX reference (allowed: a few
off by one, from its reduction order); that count is reported, not asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _harness  # noqa: E402
from jaxnoise.ops.ternary import config as config_lib  # noqa: E402
from jaxnoise.ops.ternary import pallas_triton_update  # noqa: E402
from jaxnoise.ops.ternary import reference  # noqa: E402
# pylint: enable=g-import-not-at-top,wrong-import-position

FROZEN_PATH = pathlib.Path(__file__).resolve().parent / "update_7fbab3d.py"


class TwoPassConfig(config_lib.CounterUpdateConfig):
  """A config that takes the two-pass loop from 8 groups up (small rows, like the tests')."""

  MAX_RESIDENT_GROUPS = 4


@dataclasses.dataclass(frozen=True)
class Case:
  """One comparison.

  Attributes:
    shape: ``(out, in)``.
    dtype: gradient dtype name.
    C: counter half-width.
    lagged: denominator from the old ``v``.
    grads: ``exact`` (sums exact in any order) or ``random``.
    config: kernel tiling (None: the heuristic).
    special_rows: NaN, inf, zero and invalid-state rows.
    wild_codes: some codes past the valid range (they saturate to ``t = +1``).
    high_word: force the 64-bit index path on both kernels.
    label: what the case is for.
  """

  shape: tuple[int, int]
  dtype: str = "float32"
  C: int = 11
  lagged: bool = False
  grads: str = "exact"
  config: config_lib.CounterUpdateConfig | None = None
  special_rows: bool = False
  wild_codes: bool = False
  high_word: bool = False
  label: str = ""

  def name(self) -> str:
    parts = [f"{self.shape[0]}x{self.shape[1]}", self.dtype, f"C={self.C}",
             "lagged" if self.lagged else "current", self.grads]
    if self.special_rows:
      parts.append("special-rows")
    if self.wild_codes:
      parts.append("wild-codes")
    if self.high_word:
      parts.append("64-bit-index")
    if self.label:
      parts.append(self.label)
    return " ".join(parts)


def default_cases(interpret: bool) -> list[Case]:
  """GPU shapes (or, interpreted, small stand-ins of each)."""
  if interpret:
    big, square, ragged, bytes_shape = (8, 1024), (16, 256), (12, 2304), (9, 3996)
    two_pass, two_pass_whole = (8, 20000), (2, 32768)
  else:
    big, square, ragged, bytes_shape = (8192, 8192), (4096, 4096), (1536, 2304), (1000, 3996)
    two_pass, two_pass_whole = (256, 20000), (128, 32768)
  cases = []
  for dtype in ("float32", "bfloat16"):
    for grads in ("exact", "random"):
      cases += [Case(big, dtype, grads=grads, special_rows=True),
                Case(square, dtype, grads=grads, lagged=True),
                Case(ragged, dtype, grads=grads, special_rows=True),
                Case(bytes_shape, dtype, grads=grads, label="bytes"),
                Case((37, 4 * 37), dtype, grads=grads, C=5, special_rows=True, wild_codes=True,
                     label="tiny-ragged"),
                Case(two_pass, dtype, grads=grads, special_rows=True, label="two-pass"),
                Case(two_pass_whole, dtype, grads=grads, label="two-pass-whole-tiles")]
  return cases


def thorough_cases() -> list[Case]:
  """Small shapes over every path of the kernel (meant for the interpreter; fine compiled)."""
  configs = {
      "heuristic": None,
      # A power-of-2 chunk and masked tails; two rows per program.
      "chunked": config_lib.CounterUpdateConfig(block_rows=2, block_groups=16, tail_groups=4),
      # The row rounded up to one masked chunk.
      "one-masked-chunk": config_lib.CounterUpdateConfig(block_rows=1, block_groups=64,
                                                         tail_groups=64),
      # Two-pass loops: bytes with strided loads, words with vector loads.
      "two-pass-bytes": TwoPassConfig(block_rows=4, block_groups=4, tail_groups=4, num_warps=1,
                                      num_stages=2, word_loads=False, vector_loads=False),
      "two-pass-words": TwoPassConfig(block_rows=2, block_groups=8, tail_groups=8, num_warps=1,
                                      num_stages=2),
  }
  shapes = {"words": (13, 16 * 37), "bytes": (11, 4 * 37), "words-even": (8, 16 * 32)}
  cases = []
  dtypes = ("float32", "bfloat16", "float16")
  index = 0
  for layout, shape in shapes.items():
    for config_name, config in configs.items():
      for grads in ("exact", "random"):
        dtype = dtypes[index % 3]
        C = (1, 4, 11, 7)[index % 4]
        cases.append(Case(shape, dtype, C=C, lagged=bool(index % 2), grads=grads, config=config,
                          special_rows=index % 3 != 1, wild_codes=index % 4 == 0,
                          label=f"{layout} {config_name}"))
        index += 1
  # Every C on one shape, both layouts; bfloat16 on each config; the 64-bit index path;
  # each with exact and with random gradients.
  for grads in ("exact", "random"):
    for C in range(1, 12):
      cases.append(Case((7, 16 * 5), "float32", C=C, grads=grads, wild_codes=True,
                        label="words every-C"))
      cases.append(Case((7, 4 * 5), "bfloat16", C=C, grads=grads, special_rows=True,
                        label="bytes every-C"))
    for config_name, config in configs.items():
      cases.append(Case((9, 16 * 13), "bfloat16", C=6, grads=grads, config=config,
                        special_rows=True, label=f"bf16 {config_name}"))
    for shape in ((9, 16 * 7), (9, 4 * 7)):
      for config_name in ("heuristic", "two-pass-bytes"):
        cases.append(Case(shape, "float32", C=5, grads=grads, config=configs[config_name],
                          high_word=True, special_rows=True, label=config_name))
  return cases


def make_inputs(case: Case, seed: int):
  """``(packed, scale, v, grad, hyper, seed)`` of a case (built with jax.random on the device)."""
  out_features, in_features = case.shape
  key = jax.random.key(seed)
  k_codes, k_wild, k_scale, k_v, k_grad, k_seed = jax.random.split(key, 6)
  n_codes = reference.n_codes(case.C)
  codes = jax.random.randint(k_codes, case.shape, 0, n_codes, jnp.int32)
  if case.wild_codes:
    wild = jax.random.randint(k_wild, case.shape, 0, 64, jnp.int32)
    codes = jnp.where((jnp.arange(out_features) % 3 == 0)[:, None], wild, codes)
  packed = jax.jit(reference.pack_codes_reference)(codes)
  scale = jax.random.uniform(k_scale, (out_features,), jnp.float32, 0.05, 2.0)
  # A small RMS state: the step moves most codes (a sensitive comparison).
  v = jax.random.uniform(k_v, (out_features,), jnp.float32, 0.0, 0.02)
  if case.grads == "exact":
    grad = jax.random.randint(k_grad, case.shape, -8, 9).astype(jnp.float32) * 2.0**-6
  else:
    grad = jax.random.normal(k_grad, case.shape, jnp.float32) * 0.05
  if case.special_rows:
    rows = jnp.arange(out_features)
    grad = jnp.where((rows == 1 % out_features)[:, None], jnp.float32(0.0), grad)
    grad = grad.at[2 % out_features, in_features // 2].set(jnp.nan)
    grad = grad.at[3 % out_features, in_features - 1].set(jnp.inf)
    if out_features > 5:
      scale = scale.at[4].set(0.0)  # invalid state: skipped
      v = v.at[5].set(-1.0)
  grad = grad.astype(jnp.dtype(case.dtype))
  lv = reference.levels(case.C)
  # lr * lv = 1.3 code units per unit of g / sqrt(v'); lr_scale moves the scales a little.
  hyper = jnp.asarray([1.3 / lv, 0.02, 0.9, 1e-8], jnp.float32)
  seed_array = jax.random.randint(k_seed, (1,), 0, 2**31 - 1).astype(jnp.uint32)
  return packed, scale, v, grad, hyper, seed_array


def bits(array) -> np.ndarray:
  array = np.asarray(array)
  if array.dtype == np.float32:
    return array.view(np.uint32)
  return array


@functools.lru_cache(maxsize=None)
def _jitted(fn, **static):
  """One jitted function per (function, static arguments): shapes then hit jit's cache."""
  return jax.jit(functools.partial(fn, **static))


def run_case(case: Case, frozen, interpret: bool, seed: int, with_reference: bool) -> dict:
  """Both kernels on one case; the fields that differ and the reference's code differences."""
  inputs = make_inputs(case, seed)
  results = {}
  modules = {"frozen": frozen, "new": pallas_triton_update}
  saved = {name: getattr(module, "needs_high_word", None) for name, module in
           (("frozen", frozen), ("reference", reference))}
  try:
    if case.high_word:
      frozen.needs_high_word = lambda out_features, in_features: True
      reference.needs_high_word = lambda out_features, in_features: True
    for name, module in modules.items():
      static = dict(C=case.C, lagged=case.lagged, config=case.config, interpret=interpret)
      # A forced 64-bit index path is traced afresh (the patch is not part of jit's key).
      fn = (jax.jit(functools.partial(module.counter_update, **static)) if case.high_word
            else _jitted(module.counter_update, **static))
      results[name] = jax.block_until_ready(fn(*inputs))
  finally:
    frozen.needs_high_word = saved["frozen"]
    reference.needs_high_word = saved["reference"]
  differ = [field for field, a, b in zip(("packed", "scale", "v", "skipped"), results["frozen"],
                                         results["new"])
            if not np.array_equal(bits(a), bits(b))]
  packed, scale, v, grad, hyper, seed_array = inputs
  codes_new = np.asarray(reference.unpack_codes_reference(results["new"][0]))
  codes_old = np.asarray(reference.unpack_codes_reference(packed))
  row = {"differ": differ, "moved": float((codes_new != codes_old).mean()),
         "skipped": int(np.asarray(results["new"][3]).sum()), "off_reference": None}
  if with_reference:
    expected = _jitted(reference.counter_update_reference, C=case.C, lagged=case.lagged)(
        packed, scale, v, grad, hyper, seed_array[0])
    codes_ref = np.asarray(reference.unpack_codes_reference(expected[0]))
    row["off_reference"] = int((codes_new != codes_ref).sum())
  return row


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--interpret", action="store_true",
                      help="run both kernels through the Pallas interpreter (CPU smoke check)")
  parser.add_argument("--suite", choices=("default", "thorough"), default="default")
  parser.add_argument("--only", default=None, help="only the cases whose name contains this")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--no-reference", action="store_true",
                      help="skip the count of codes off the pure-JAX reference (saves time)")
  args = parser.parse_args(argv)
  if not args.interpret and jax.default_backend() != "gpu":
    parser.error("compiled kernels need a GPU; use --interpret on a CPU")
  frozen = _harness.frozen_module(str(FROZEN_PATH))
  cases = default_cases(args.interpret) if args.suite == "default" else thorough_cases()
  if args.only:
    cases = [case for case in cases if args.only in case.name()]
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, "
        f"{'interpret' if args.interpret else 'compiled'}, suite {args.suite}: "
        f"{len(cases)} cases", flush=True)
  passed = failed = 0
  for index, case in enumerate(cases):
    start = time.perf_counter()
    try:
      row = run_case(case, frozen, args.interpret, args.seed + index, not args.no_reference)
    except Exception as error:  # pylint: disable=broad-except
      failed += 1
      print(f"ERROR {case.name()}: {type(error).__name__}: {str(error)[:300]}", flush=True)
      continue
    ok = not row["differ"]
    passed += ok
    failed += not ok
    detail = "identical" if ok else "differ in " + ", ".join(row["differ"])
    off = "" if row["off_reference"] is None else (
        f", {row['off_reference']} codes off the reference")
    print(f"{'PASS' if ok else 'FAIL'} {case.name()}: {detail}; {row['moved']:.0%} of codes "
          f"moved, {row['skipped']} rows skipped{off} ({time.perf_counter() - start:.1f} s)",
          flush=True)
  print(f"{passed} PASS, {failed} FAIL of {len(cases)}", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
