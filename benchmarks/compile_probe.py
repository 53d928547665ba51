"""First-compile time of every kernel variant at offsets 0, 2**32 + 5 and 2**40 + 3.

    python benchmarks/compile_probe.py [--budget-s 150] [--only forward,reduce]

For each case (op, kind, offset, config) it times, in one process with no
compilation cache:

* ``lower``: tracing and lowering to StableHLO (each kernel's Triton IR rides
  in a ``__gpu$xla.gpu.triton`` custom call);
* ``triton``: each kernel's Triton IR -> PTX alone, through jaxlib's Triton
  compilation handler, when it has one (jax 0.10's plugins do, 0.11's do not).
  It runs Triton's passes but not XLA's Triton pipeline, so it misses what
  that pipeline costs (issue 14's slow pass, ``benchmarks/compile_offline.py``);
* ``compile``: XLA's compile of the lowered module, which runs each kernel
  through XLA's Triton pipeline, LLVM and ptxas (``compile_bisect.py`` splits
  it into XLA's stage timers);
* ``first_call``: the first execution (loads the PTX: the driver's JIT).

Cases whose total passes 5 s have their Triton IR written next to the JSON
(``compile_ir/``) for a post-mortem. Prints one line per case and writes
``compile_probe.json`` under ``$OUT`` (default ``benchmarks/out``). Cases stop
when ``--budget-s`` is spent (the rest are recorded as skipped).

On a CPU, ``--ir-only`` writes each kernel's Triton IR (text and bytecode)
instead, for an offline compile with a Triton or jaxlib CUDA plugin install.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import jaxnoise  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise import noise as noise_lib  # noqa: E402
from jaxnoise.ops.ternary import config as ternary_config  # noqa: E402
from jaxnoise.ops.ternary import pallas_triton_update as ternary_kernels  # noqa: E402
from jaxnoise.ops.virtual_noise import config as vn_config  # noqa: E402
from jaxnoise.ops.virtual_noise import pallas_triton as vn_kernels  # noqa: E402

OFFSETS = (0, 2**32 + 5, 2**40 + 3)
_CAPTURED: list = []


def _install_capture() -> None:
  """Record every kernel's Triton module (bytecode and text) as it is lowered."""
  from jax._src.pallas.triton import lowering  # pylint: disable=g-import-not-at-top
  from jax._src.pallas.triton import pallas_call_registration as registration  # pylint: disable=g-import-not-at-top
  original = lowering.lower_jaxpr_to_triton_module

  def capture(*args, **kwargs):
    result = original(*args, **kwargs)
    buffer = io.BytesIO()
    result.module.operation.write_bytecode(buffer)
    _CAPTURED.append((buffer.getvalue(), result.module.operation.get_asm()))
    return result

  lowering.lower_jaxpr_to_triton_module = capture
  registration.lowering.lower_jaxpr_to_triton_module = capture


def cases(only):
  """``(name, fn, args, warps_stages)`` for every kernel variant and offset."""
  spec = jax.ShapeDtypeStruct
  seeds, sigma = spec((64,), jnp.uint32), spec((), jnp.float32)
  out = []
  for kind_name in ("uniform", "normal", "rademacher", "binomial"):
    for offset in OFFSETS:
      kind = noise_lib.get_kind(kind_name)
      x, w = spec((256, 1024), jnp.bfloat16), spec((1024, 1024), jnp.bfloat16)
      out.append((f"forward {kind_name} {offset}", functools.partial(
          vn_kernels.perturbed_linear, bias=None, offset=offset, kind=kind, antithetic=True,
          out_dtype=jnp.float32), dict(x=x, weight=w, seeds=seeds, sigma=sigma)))
      out.append((f"input_grad {kind_name} {offset}", functools.partial(
          vn_kernels.perturbed_linear_input_grad, offset=offset, kind=kind, antithetic=False,
          shared_x=True), dict(grad_out=spec((64, 256, 1024), jnp.float32),
                               weight=spec((1024, 1024), jnp.float32), seeds=seeds,
                               sigma=sigma)))
      out.append((f"gradient {kind_name} {offset}", functools.partial(
          vn_kernels.noise_gradient, shape=(1024, 1024), pop_size=64, offset=offset, kind=kind,
          antithetic=False), dict(fitness=spec((64,), jnp.float32), seeds=seeds, sigma=sigma)))
      out.append((f"reduce rows {kind_name} {offset}", functools.partial(
          vn_kernels.reduce_metric, offset=offset, kind=kind, antithetic=False),
          dict(center=spec((1 << 20,), jnp.float32), seeds=seeds, sigma=sigma)))
      if kind.values_per_word == 1:
        config = vn_config.reduce_metric_individuals_heuristics(1 << 20, 64)
        out.append((f"reduce individuals {kind_name} {offset}", functools.partial(
            vn_kernels.reduce_metric, offset=offset, kind=kind, antithetic=False, config=config),
            dict(center=spec((1 << 20,), jnp.float32), seeds=seeds, sigma=sigma)))
  # Ternary kernels: the high-word path is taken when out * in > 2**32.
  # The other shapes are the update's benchmark shapes (registers and instructions, offline).
  for shape, dtype in (((4096, 4096), jnp.float32), ((65536, 65540), jnp.float32),
                       ((8192, 8192), jnp.float32), ((8192, 8192), jnp.bfloat16),
                       ((1000, 3996), jnp.float32), ((1536, 2304), jnp.float32)):
    n_bytes = 3 * shape[1] // 4
    packed, row = spec((shape[0], n_bytes), jnp.uint8), spec((shape[0],), jnp.float32)
    hyper, seed = spec((4,), jnp.float32), spec((1,), jnp.uint32)
    base = ternary_config.CounterUpdateConfig.get_heuristics_config(shape, dtype)
    configs = [("heuristic", None)]
    if shape in ((4096, 4096), (65536, 65540)):
      configs.append(("bytes+strided", dataclasses.replace(base, word_loads=False,
                                                           vector_loads=False)))
    for name, config in configs:
      dtype_name = "" if dtype == jnp.float32 else f" {jnp.dtype(dtype).name}"
      out.append((f"counter_update {name} {shape[0]}x{shape[1]}{dtype_name}", functools.partial(
          ternary_kernels.counter_update, C=11, lagged=False, config=config),
          dict(packed=packed, scale=row, v=row, grad_w=spec(shape, dtype), hyper=hyper,
               seed=seed)))
  out += low_rank_cases() + ternary_cases()
  # Every op at its three offsets before the next op, so a spent budget still
  # leaves complete comparisons.
  out.sort(key=lambda case: (case[0].rsplit(" ", 1)[0].split(" ")[0] != "forward",
                             case[0].rsplit(" ", 1)[0]))
  return [c for c in out if not only or c[0].split()[0] in only]


def low_rank_cases(implementation: str = "pallas"):
  """The low-rank kernels through the public API (``implementation``), at every
  kind, offset and ranks 1 and 4: the fused forward (per-individual ``x``, one row per
  member, antithetic: the Mosaic GPU GEMM on a Hopper GPU up to rank 4), the Triton
  forward (shared ``x``), its VJP, the gradient estimate (float32, and bf16 rounded in the
  tiles) and the SGD step."""
  spec = jax.ShapeDtypeStruct
  bf16, f32 = jnp.bfloat16, jnp.float32
  sigma = spec((), f32)
  out = []
  for kind in ("uniform", "normal", "rademacher", "binomial"):
    for offset in OFFSETS:
      for rank in (1, 4):
        tag = f"{kind} r{rank} {offset}"
        pairs = dict(seeds=spec((256,), jnp.uint32), sigma=sigma)
        common = dict(offset=offset, kind=kind, rank=rank, implementation=implementation)
        out.append((f"lr_fused_forward {tag}", functools.partial(
            jaxnoise.virtual_perturbed_linear, bias=None, antithetic=True, **common),
            dict(x=spec((256, 1, 1024), bf16), weight=spec((1024, 1024), bf16), **pairs)))
        shared = functools.partial(jaxnoise.virtual_perturbed_linear, bias=None,
                                   antithetic=False, **common)
        members = dict(seeds=spec((64,), jnp.uint32), sigma=sigma)
        out.append((f"lr_forward {tag}", shared,
                    dict(x=spec((64, 1024), bf16), weight=spec((1024, 1024), bf16), **members)))

        def vjp(x, weight, seeds, sigma, forward=shared):
          loss = lambda x, w: jnp.sum(forward(x=x, weight=w, seeds=seeds, sigma=sigma))  # noqa: E731
          return jax.grad(loss, argnums=(0, 1))(x, weight)

        out.append((f"lr_vjp {tag}", vjp,
                    dict(x=spec((64, 1024), f32), weight=spec((1024, 1024), f32), **members)))
        out.append((f"lr_gradient {tag}", functools.partial(
            jaxnoise.virtual_weight_gradient, weight_shape=(1024, 1024), antithetic=True,
            **common), dict(fitness=spec((256,), f32), **pairs)))
        out.append((f"lr_gradient_bf16 {tag}", functools.partial(
            jaxnoise.virtual_weight_gradient, weight_shape=(1024, 1024), antithetic=True,
            out_dtype=bf16, **common), dict(fitness=spec((256,), f32), **pairs)))
        # 192 pairs in three chunks of 64: the first chunk's tiles store the float32 sum,
        # the second's add to it in a loop, the last's round it to bf16 or take the step.
        chunked = vn_config.LowRankGradientConfig(chunk=64)
        triple = dict(seeds=spec((384,), jnp.uint32), sigma=sigma)
        out.append((f"lr_gradient_chunked_bf16 {tag}", functools.partial(
            jaxnoise.virtual_weight_gradient, weight_shape=(1024, 1024), antithetic=True,
            out_dtype=bf16, config=chunked, **common),
            dict(fitness=spec((384,), f32), **triple)))
        out.append((f"lr_weight_update_chunked {tag}", functools.partial(
            jaxnoise.virtual_weight_update, antithetic=True, config=chunked, **common),
            dict(weight=spec((1024, 1024), bf16), fitness=spec((384,), f32),
                 step_size=spec((), f32), **triple)))
        out.append((f"lr_weight_update {tag}", functools.partial(
            jaxnoise.virtual_weight_update, antithetic=True, **common),
            dict(weight=spec((1024, 1024), bf16), fitness=spec((256,), f32),
                 step_size=spec((), f32), **pairs)))
  return out


def ternary_cases(implementation: str = "pallas"):
  """The packed matmul (its tile methods by rows), its input gradient, the decode kernel and
  ``counter_update_from_io`` (fused, two kernels, row blocks), with the 64-bit rounding
  index where ``out * in > 2**32``. Ternary kernels take no noise offset. ``implementation``
  applies to the public ops (the matmul, its gradient, the decode); ``from_io`` cases call
  the kernels."""
  spec = jax.ShapeDtypeStruct
  bf16, f32, u8 = jnp.bfloat16, jnp.float32, jnp.uint8
  out = []
  matrix = lambda o, i: dict(packed=spec((o, 3 * i // 4), u8), scale=spec((o,), f32))  # noqa: E731
  matmul = functools.partial(jaxnoise.ternary_matmul, C=11, implementation=implementation)
  for m_rows in (1, 2, 16, 48, 256):  # one row, fma rows, joined 16-row and GEMM tiles, decode
    out.append((f"ternary_matmul M={m_rows} 4096x4096", matmul,
                dict(x=spec((m_rows, 4096), bf16), **matrix(4096, 4096))))
  for m_rows in (1, 256):
    def input_grad(x, packed, scale):
      return jax.grad(lambda x: jnp.sum(matmul(x, packed, scale).astype(f32)))(x)
    out.append((f"ternary_input_grad M={m_rows} 4096x4096", input_grad,
                dict(x=spec((m_rows, 4096), bf16), **matrix(4096, 4096))))
  out.append(("ternary_decode 4096x4096", functools.partial(
      jaxnoise.ternary_decode, C=11, dtype=bf16, implementation=implementation),
      matrix(4096, 4096)))
  hyper, seed = spec((4,), f32), spec((1,), jnp.uint32)
  for (m_rows, o, i), config in (
      ((29, 48, 148), None), ((256, 4096, 4096), None),
      ((256, 4096, 4096), ternary_config.FromIOConfig(xla_gemm_rows=1024)),
      ((16, 65536, 65540), None),
      ((16, 65536, 65540), ternary_config.FromIOConfig(xla_gemm_rows=1024))):
    name = "kernels" if config is None else f"rows {config.xla_gemm_rows}"
    state = matrix(o, i)
    out.append((f"from_io {name} M={m_rows} {o}x{i}", functools.partial(
        ternary_kernels.counter_update_from_io, C=11, lagged=False, config=config),
        dict(**state, v=spec((o,), f32), x=spec((m_rows, i), bf16),
             grad_out=spec((m_rows, o), bf16), hyper=hyper, seed=seed)))
  return out


def _zeros(tree):
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)


def probe_case(name, fn, kwargs, *, run: bool, ir_dir: pathlib.Path) -> dict:
  _CAPTURED.clear()
  jitted = jax.jit(lambda kw: fn(**kw))
  start = time.perf_counter()
  lowered = jitted.trace(kwargs).lower(lowering_platforms=("cuda",))
  record = {"lower_s": time.perf_counter() - start, "kernels": len(_CAPTURED)}
  text = lowered.as_text()
  import re  # pylint: disable=g-import-not-at-top
  warps = [int(v) for v in re.findall(r"num_warps = (\d+) : i32", text)]
  stages = [int(v) for v in re.findall(r"num_stages = (\d+) : i32", text)]
  record["ttir_lines"] = [t.count("\n") for _, t in _CAPTURED]
  from jax._src.lib import triton  # pylint: disable=g-import-not-at-top
  if run and hasattr(triton, "has_compilation_handler") and triton.has_compilation_handler("cuda"):
    arch = str(jax.devices()[0].compute_capability)
    triton_s = []
    for index, (bytecode, _) in enumerate(_CAPTURED):
      w = warps[index] if index < len(warps) else 4
      s = stages[index] if index < len(stages) else 3
      t0 = time.perf_counter()
      try:
        triton.compile("cuda", bytecode, arch, num_warps=w, num_ctas=1, num_stages=s)
        triton_s.append(time.perf_counter() - t0)
      except Exception as error:  # pylint: disable=broad-except
        triton_s.append(f"{type(error).__name__}: {str(error)[:200]}")
    record["triton_s"] = triton_s
  if run:
    start = time.perf_counter()
    compiled = lowered.compile()
    record["compile_s"] = time.perf_counter() - start
    arguments = _zeros(kwargs)
    start = time.perf_counter()
    jax.block_until_ready(compiled(arguments))
    record["first_call_s"] = time.perf_counter() - start
  record["total_s"] = sum(v for k, v in record.items() if k.endswith("_s") and
                          isinstance(v, float))
  if record["total_s"] > 5 or not run:
    ir_dir.mkdir(parents=True, exist_ok=True)
    stem = name.replace(" ", "_")
    for index, (bytecode, text) in enumerate(_CAPTURED):
      (ir_dir / f"{stem}_{index}.ttir").write_text(text)
      if not run:
        w = warps[index] if index < len(warps) else 4
        s = stages[index] if index < len(stages) else 3
        (ir_dir / f"{stem}_{index}.w{w}s{s}.mlirbc").write_bytes(bytecode)
  return record


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--budget-s", type=float, default=150.0)
  parser.add_argument("--only", default="", help="comma-separated ops (first word of a case)")
  parser.add_argument("--ir-only", action="store_true", help="CPU: write the Triton IR only")
  args = parser.parse_args(argv)
  jax.config.update("jax_enable_compilation_cache", False)
  run = not args.ir_only
  if run and jax.default_backend() != "gpu":
    parser.error("timing compiles needs a GPU; use --ir-only on a CPU")
  out_dir = pathlib.Path(os.environ.get("OUT", "benchmarks/out"))
  _install_capture()
  only = set(filter(None, args.only.split(",")))
  results, start = {}, time.perf_counter()
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)
  for name, fn, kwargs in cases(only):
    if time.perf_counter() - start > args.budget_s:
      results[name] = {"skipped": "budget spent"}
      continue
    try:
      results[name] = probe_case(name, fn, kwargs, run=run, ir_dir=out_dir / "compile_ir")
    except Exception as error:  # pylint: disable=broad-except
      results[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    entry = results[name]
    print(f"{name:<48} " + ("  ".join(
        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in entry.items())),
        flush=True)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "compile_probe.json").write_text(json.dumps(
      {"jax": jax.__version__, "device": jax.devices()[0].device_kind, "cases": results},
      indent=2, default=str))
  slow = [n for n, e in results.items() if e.get("total_s", 0) > 5]
  print(f"wrote {out_dir / 'compile_probe.json'}; over 5 s: {slow or 'none'}")


if __name__ == "__main__":
  main()
