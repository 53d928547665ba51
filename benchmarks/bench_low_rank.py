"""Low-rank virtual noise on the GPU: compiled checks, EGGROLL's benchmark, one ES step.

Modes (any combination, one process, one GPU):

* ``--check``: the compiled low-rank kernels (forward, input gradient) and the
  gradient estimate against the pure-JAX reference, every kind, shared and
  per-individual x, antithetic on and off, odd shapes, offsets past 2**32;
  then ("fused check") the Mosaic GPU forward on its tiles.
* ``--bench``: EGGROLL's benchmark, one ``(8192, 8192)`` linear layer, 1024
  members with one input row each, bf16 and f32, side by side in one run:
  batch inference ``x W^T`` (the floor), EGGROLL's own ``do_mm`` (if its
  public code is importable from ``--eggroll-path``; it stays out of this
  repository), the jaxnoise kernel (the library's default: on a Hopper GPU
  the fused Mosaic GPU forward up to rank 4), the other path
  (``fused_gemm`` flipped) and the materialised-factor path, for
  ranks 1, 2, 4, 8, 16 and each kind; then one ES step of that layer
  (forward + gradient estimate + update) against inference plus one GEMM of
  the layer's size.

    python benchmarks/bench_low_rank.py --check --bench --out benchmarks/out   # GPU
    python benchmarks/bench_low_rank.py --check --bench --quick                # CPU

Writes ``<out>/low_rank.json`` and ``<out>/low_rank.png`` (fraction of
inference throughput against rank).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402
from jaxnoise import noise as noise_lib  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402


def _relative_error(value, reference) -> float:
  value = np.asarray(jnp.asarray(value, jnp.float32))
  reference = np.asarray(jnp.asarray(reference, jnp.float32))
  return float(np.max(np.abs(value - reference)) / (np.max(np.abs(reference)) + 1e-30))


def check_cases(quick: bool, implementation: str):
  """(name, fn) pairs comparing the compiled (or interpreted) path with the reference."""
  shapes = [(6, 5, 37, 45)] if quick else [(6, 5, 37, 45), (1000, 7, 100, 999), (64, 1, 4500, 33)]
  offsets = [7, (1 << 32) - 100] if quick else [7, (1 << 32) - 100, (1 << 40) + 3]
  kinds = ["rademacher"] if quick else sorted(noise_lib.KINDS)
  ranks = [1, 3] if quick else [1, 3, 16, 20]
  cases = []
  # Every kind and offset first (two combinations each), then the rest.
  combos = []
  for shape_index, (pop, batch, out_f, in_f) in enumerate(shapes):
    for rank in ranks:
      for shared in (True, False):
        for antithetic in (False, True):
          if shape_index and (shared == antithetic or rank not in (1, 3)):
            continue
          first = shape_index == 0 and rank in (1, 3) and shared != antithetic
          combos.append((not first, (pop, batch, out_f, in_f), rank, shared, antithetic))
  combos.sort(key=lambda c: c[0])
  for _, (pop, batch, out_f, in_f), rank, shared, antithetic in combos:
    for kind in kinds:
      for offset in offsets:
              name = (f"check {kind} pop={pop} batch={batch} out={out_f} in={in_f} "
                      f"offset={offset} rank={rank} shared={shared} anti={antithetic}")
              cases.append((name, functools.partial(
                  _check_one, pop, batch, out_f, in_f, kind, offset, rank, shared, antithetic,
                  implementation)))
  cases += _fused_check_cases(quick, implementation, kinds, offsets)
  return cases


def _fused_check_cases(quick, implementation, kinds, offsets):
  """The Mosaic GPU forward (16-bit one-row members in antithetic pairs, Hopper) against the reference.

  Shapes on its tiles (up to 3 tiles of 64 pairs and 3 of 256 outputs),
  every kind at every offset inside one 2**32 window, ranks 1, 3 and 16 over
  every shape, bias on and off. Off its domain, taking the Triton path: the
  offsets whose layer crosses a window, no pairs, two rows per member.
  sigma 0.5, so the noise term dominates.
  """
  shapes = [(128, 1, 256, 64)] if quick else [(128, 1, 256, 64), (384, 1, 768, 320),
                                               (256, 1, 512, 4096)]
  ranks = [1, 3, 16]
  cases = []
  fitting = [o for o in offsets if mosaic_window_fits(o)]
  combos = [(k, o, True) for k in kinds for o in fitting]
  combos += [(kinds[0], o, True) for o in offsets if o not in fitting]
  combos += [(kinds[0], offsets[0], False)]
  for i, (kind, offset, antithetic) in enumerate(combos):
    shape = shapes[i % len(shapes)]
    rank = ranks[(i // len(shapes)) % len(ranks)]
    bias = i % 2 == 0
    name = (f"fused check {kind} pop={shape[0]} batch={shape[1]} out={shape[2]} in={shape[3]} "
            f"offset={offset} rank={rank} bias={bias} anti={antithetic}")
    cases.append((name, functools.partial(_check_fused_one, *shape, kind, offset, rank, bias,
                                          antithetic, implementation)))
  cases.append((f"fused check {kinds[0]} pop=128 batch=2 out=256 in=64 offset=7 rank=1 "
                f"bias=True anti=True", functools.partial(
                    _check_fused_one, 128, 2, 256, 64, kinds[0], 7, 1, True, True,
                    implementation)))
  # float32 x (TF32 in the GEMM).
  cases.append((f"fused check {kinds[0]} pop=384 batch=1 out=768 in=320 offset={offsets[-1]} "
                f"rank=3 bias=True anti=True float32", functools.partial(
                    _check_fused_one, 384, 1, 768, 320, kinds[0], offsets[-1], 3, True, True,
                    implementation, jnp.float32)))
  if not quick:  # EGGROLL's layer, the shape the heuristic's timings come from: 8 tiles of pairs
    for kind, rank, offset, dtype in [(kinds[0], 1, offsets[0], jnp.bfloat16),
                                      (kinds[-1], 4, offsets[-1], jnp.bfloat16),
                                      (kinds[1], 2, offsets[-1], jnp.float32)]:
      cases.append((f"fused check {kind} pop=1024 batch=1 out=8192 in=8192 offset={offset} "
                    f"rank={rank} bias=True anti=True {jnp.dtype(dtype).name}",
                    functools.partial(_check_fused_one, 1024, 1, 8192, 8192, kind, offset, rank,
                                      True, True, implementation, dtype)))
  return cases


def mosaic_window_fits(offset: int) -> bool:
  """Whether a check layer at ``offset`` stays inside one 2**32 window (else: Triton path)."""
  from jaxnoise.ops.virtual_noise import mosaic_gpu_low_rank  # pylint: disable=g-import-not-at-top
  return mosaic_gpu_low_rank.window_fits(offset, 1 << 20)


def _check_fused_one(pop, batch, out_f, in_f, kind, offset, rank, with_bias, antithetic,
                     implementation, dtype=jnp.bfloat16):
  from jaxnoise.ops.virtual_noise import mosaic_gpu_low_rank  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.key(pop * 11 + rank), 4)
  x = jax.random.normal(keys[0], (pop, batch, in_f)).astype(dtype)
  weight = (jax.random.normal(keys[1], (out_f, in_f)) / np.sqrt(in_f)).astype(dtype)
  bias = jax.random.normal(keys[2], (out_f,)) if with_bias else None
  seeds = jaxnoise.draw_seeds(keys[3], pop, antithetic=antithetic)
  common = dict(kind=kind, antithetic=antithetic, rank=rank)

  cotangent = jax.random.normal(jax.random.fold_in(keys[0], 1), (pop, batch, out_f))
  # The fused kernel at every rank (the heuristic takes it up to rank 4).
  config = dataclasses.replace(
      config_lib.low_rank_linear_heuristics(batch, in_f, out_f, rank, kind), fused_gemm=True)

  def loss(impl, x):  # linear in y: grad_x does not amplify y's bfloat16 rounding
    y = jaxnoise.virtual_perturbed_linear(x, weight, bias, seeds, 0.5, offset, out_dtype=dtype,
                                          implementation=impl,
                                          config=config if impl != "reference" else None,
                                          **common)
    return jnp.sum(y.astype(jnp.float32) * cotangent), y

  grad = jax.jit(jax.grad(loss, argnums=1, has_aux=True), static_argnums=0)
  gx, y = grad(implementation, x)
  reference = jaxnoise.virtual_perturbed_linear(
      x.astype(jnp.float32), weight.astype(jnp.float32), bias, seeds, 0.5, offset,
      implementation="reference", **common)
  rgx, _ = jax.grad(loss, argnums=1, has_aux=True)("reference", x)
  n_indices = noise_lib.noise_block_size((out_f, in_f), rank) + (out_f if with_bias else 0)
  reason = mosaic_gpu_low_rank.unsupported_reason(
      x.shape, dtype, out_f, offset, n_indices, rank, antithetic, dtype, config,
      implementation != "pallas")
  errors = {"forward": _relative_error(y, reference), "grad_x": _relative_error(gx, rgx)}
  worst = max(errors.values())
  bound = 1e-2  # bfloat16 outputs: 2**-8 relative rounding; float32 x: TF32 products
  record = {"path": reason or "fused", "max_rel_error": worst, **errors, "ok": worst < bound}
  if not record["ok"]:
    raise AssertionError(f"relative error {worst:.3g} above {bound} ({record['path']}): {errors}")
  return record


def _check_one(pop, batch, out_f, in_f, kind, offset, rank, shared, antithetic, implementation):
  keys = jax.random.split(jax.random.key(pop * 7 + rank), 5)
  x = jax.random.normal(keys[0], (batch, in_f) if shared else (pop, batch, in_f))
  weight = 0.1 * jax.random.normal(keys[1], (out_f, in_f))
  bias = jax.random.normal(keys[2], (out_f,))
  seeds = jaxnoise.draw_seeds(keys[3], pop, antithetic=antithetic)
  fitness = jax.random.normal(keys[4], (pop,))
  common = dict(kind=kind, antithetic=antithetic, rank=rank)

  def loss(impl, x, weight, bias):
    y = jaxnoise.virtual_perturbed_linear(x, weight, bias, seeds, 0.05, offset,
                                          implementation=impl, **common)
    return jnp.sum(jnp.sin(y)), y

  grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3), has_aux=True), static_argnums=0)
  (gx, gw, gb), y = grad(implementation, x, weight, bias)
  (rgx, rgw, rgb), ry = grad("reference", x, weight, bias)
  gradient = jax.jit(lambda f: jaxnoise.virtual_weight_gradient(
      f, seeds, (out_f, in_f), 0.05, None, offset, implementation=implementation, **common))
  reference_gradient = jaxnoise.virtual_weight_gradient(
      fitness, seeds, (out_f, in_f), 0.05, None, offset, implementation="reference", **common)
  errors = {
      "forward": _relative_error(y, ry),
      "grad_x": _relative_error(gx, rgx),
      "grad_w": _relative_error(gw, rgw),
      "grad_b": _relative_error(gb, rgb),
      "weight_gradient": _relative_error(gradient(fitness), reference_gradient),
  }
  worst = max(errors.values())
  # TF32 products on the GPU: about 1e-3 relative; the interpreter is exact f32.
  bound = 1e-2 if implementation == "pallas" else 1e-4
  record = {"max_rel_error": worst, **errors, "ok": worst < bound}
  if not record["ok"]:
    raise AssertionError(f"relative error {worst:.3g} above {bound}: {errors}")
  return record


def _load_eggroll(path: str | None):
  if not path:
    return None
  sys.path.insert(0, os.path.abspath(path))
  try:
    return importlib.import_module("hyperscalees_noiser.eggroll").EggRoll
  except ImportError as error:
    print(f"EGGROLL's code not importable from {path}: {error}", flush=True)
    return None


def bench_cases(quick: bool, implementation: str, eggroll_path: str | None, kinds, ranks):
  pop, features = (8, 256) if quick else (1024, 8192)
  dtypes = ["float32"] if quick else ["bfloat16", "float32"]
  eggroll = _load_eggroll(eggroll_path)
  cases = []
  for dtype_name in dtypes:
    dtype = jnp.dtype(dtype_name)
    shared = {}

    def setup(dtype=dtype, shared=shared):
      if not shared:
        keys = jax.random.split(jax.random.key(0), 2)
        shared["x"] = jax.random.normal(keys[0], (pop, 1, features), dtype)
        shared["w"] = (jax.random.normal(keys[1], (features, features), jnp.float32)
                       / np.sqrt(features)).astype(dtype)
        shared["seeds"] = jaxnoise.draw_seeds(jax.random.key(1), pop, antithetic=True)
      return shared

    def inference(dtype=dtype, setup=setup):
      """The floor: the fastest of three ways to write batch inference."""
      data = setup()
      if not quick:
        _warm_up(data)
      forms = {
          "x @ w.T": jax.jit(lambda x, w: jnp.dot(x[:, 0], w.T)),
          "dot_general": jax.jit(lambda x, w: jax.lax.dot_general(
              x[:, 0], w, (((1,), (1,)), ((), ())))),
          "einsum per member": jax.jit(lambda x, w: jnp.einsum("pbk,ok->pbo", x, w)),
      }
      times = {name: _harness.median_time(fn, data["x"], data["w"], repeats=20)
               for name, fn in forms.items()}
      w_t = jnp.asarray(data["w"].T)  # (in, out) storage, like flax's kernel
      times["x @ w_in_out"] = _harness.median_time(jax.jit(lambda x, w: jnp.dot(x[:, 0], w)),
                                                   data["x"], w_t, repeats=20)
      seconds = min(times.values())
      data["inference_s"] = seconds
      busy = {name: _harness.device_busy(fn, data["x"], data["w"])
              for name, fn in forms.items()}
      busy = {name: b["busy_ms"] for name, b in busy.items() if b}
      if busy:
        data["inference_busy_ms"] = min(busy.values())
      return {"ms": seconds * 1e3, "dtype": str(dtype), "variant": "inference",
              "forms_ms": {k: v * 1e3 for k, v in times.items()}, "forms_busy_ms": busy,
              "busy_ms": data.get("inference_busy_ms")}

    cases.append((f"inference {dtype_name}", inference))
    cases.append((f"breakdown {dtype_name}", functools.partial(_breakdown_case, setup, dtype,
                                                              kinds, implementation)))
    for rank in ranks:
      if eggroll is not None:
        cases.append((f"eggroll {dtype_name} rank={rank}",
                      functools.partial(_eggroll_case, eggroll, setup, rank, dtype)))
      for kind in kinds:
        for materialize in (False, True):
          if materialize and kind != kinds[0]:
            continue
          cases.append((f"jaxnoise {dtype_name} {kind} rank={rank}"
                        f"{' materialized' if materialize else ''}",
                        functools.partial(_jaxnoise_case, setup, rank, kind, dtype, materialize,
                                          implementation)))
    for rank in ranks:  # the other path beside the default's row
      for kind in kinds:
        default = config_lib.low_rank_linear_heuristics(1, features, features, rank, kind)
        for variant, fused_gemm in (("fused", True), ("triton", False)):
          if default.fused_gemm == fused_gemm:
            continue  # the default's row above
          config = dataclasses.replace(default, fused_gemm=fused_gemm)
          cases.append((f"jaxnoise {dtype_name} {kind} rank={rank} {variant}",
                        functools.partial(_jaxnoise_case, setup, rank, kind, dtype, False,
                                          implementation, config, variant)))
        if default.fused_gemm:  # the fused GEMM with components hashed in its main loop
          others = [(f"ahead={a}", dict(gemm_noise_ahead=a)) for a in sorted({1, rank})]
          others.append(("stages=3", dict(gemm_stages=3, gemm_noise_ahead=0)))
          for variant, fields in others:
            if all(getattr(default, k) == v for k, v in fields.items()):
              continue  # the default's row above
            config = dataclasses.replace(default, **fields)
            cases.append((f"jaxnoise {dtype_name} {kind} rank={rank} {variant}",
                          functools.partial(_jaxnoise_case, setup, rank, kind, dtype, False,
                                            implementation, config, variant)))

    for rank in (1, 4):
      for variant in _config_variants(features, rank):
        cases.append((f"variant {dtype_name} {kinds[0]} rank={rank} {variant}",
                      functools.partial(_jaxnoise_case, setup, rank, kinds[0], dtype, False,
                                        implementation, variant)))
    for rank in (1, 4):
      for optimizer in ("sgd", "adam"):
        for operand in ("float32", "bfloat16", "bfloat16 cublas"):
          cases.append((f"es step {dtype_name} {kinds[0]} rank={rank} {optimizer} "
                        f"grad operands {operand}",
                        functools.partial(_step_case, setup, rank, kinds[0], dtype, optimizer,
                                          implementation, operand)))
  return cases


def _config_variants(features, rank):
  base = dataclasses.replace(config_lib.low_rank_linear_heuristics(1, features, features, rank),
                             fused_gemm=False)
  widths = sorted({min(features, w) for w in (1024, 2048)})
  variants = [config_lib.LowRankLinearConfig(block_batch=1, block_reduce=w, block_emit=w,
                                             num_warps=warps, num_stages=stages,
                                             fuse_base=fuse, fused_gemm=False)
              for w in widths for warps in (4, 8) for stages in (1, 2) for fuse in (False, True)]
  return [v for v in variants if v != base]


def _warm_up(data, seconds=2.0):
  """Busy the GPU for a while first, so clocks are up before the first timed case."""
  fn = jax.jit(lambda x, w: jnp.einsum("pbk,ok->pbo", x, w))
  deadline = time.perf_counter() + seconds
  while time.perf_counter() < deadline:
    jax.block_until_ready(fn(data["x"], data["w"]))


def _breakdown_case(setup, dtype, kinds, implementation):
  """Where the time goes: the GEMM alone, the noise term alone, the add, the op's HLO."""
  from jaxnoise.ops.virtual_noise import pallas_triton_low_rank as pallas_triton  # pylint: disable=g-import-not-at-top
  data = setup()
  x, w, seeds = data["x"], data["w"], data["seeds"]
  features = w.shape[0]
  record = {"dtype": str(dtype), "variant": "breakdown"}
  gemm = jax.jit(lambda x, w: jnp.einsum("...bk,ok->...bo", x, w, preferred_element_type=dtype))
  record["gemm_ms"] = _harness.median_time(gemm, x, w, repeats=20) * 1e3
  base = gemm(x, w)
  record["add_ms"] = _harness.median_time(jax.jit(lambda a, b: a + b), base, base,
                                          repeats=20) * 1e3
  for kind in kinds:
    for rank in (1, 4):
      kind_obj = noise_lib.get_kind(kind)
      config = config_lib.low_rank_linear_heuristics(1, features, features, rank)
      a_layout, b_layout = pallas_triton._factor_layouts(kind_obj, 0, features, features, rank)  # pylint: disable=protected-access

      def term(x, seeds, rank=rank, config=config, a_layout=a_layout, b_layout=b_layout):
        return pallas_triton._low_rank_term(  # pylint: disable=protected-access
            x, seeds, jnp.float32(0.01), base=None, bias=None, reduce_layout=b_layout,
            emit_layout=a_layout, rank=rank, antithetic=True, n_emit=features,
            bias_offset=None, out_dtype=dtype, config=config,
            interpret=implementation == "interpret", name="term")

      record[f"term_{kind}_r{rank}_ms"] = _harness.median_time(
          jax.jit(term), x, seeds, repeats=20) * 1e3
  op = jax.jit(lambda x, w, seeds: jaxnoise.virtual_perturbed_linear(
      x, w, None, seeds, 0.01, 0, antithetic=True, rank=1, out_dtype=dtype,
      implementation=implementation))
  hlo = op.lower(x, w, seeds).compile().as_text()
  record["hlo_custom_calls"] = hlo.count("custom-call(")
  record["hlo_fusions"] = hlo.count(" fusion(")
  record["hlo_gemm_lines"] = [line.strip()[:300] for line in hlo.splitlines()
                              if "gemm" in line.lower() and "custom-call" in line][:4]
  return record


def _fraction(data, seconds):
  return data["inference_s"] / seconds if "inference_s" in data else None


def _busy(data, fn, *args, floor_ms=None, top=0):
  """Device busy time (CUPTI) of ``fn`` and its fraction of the floor's, where measurable."""
  busy = _harness.device_busy(fn, *args)
  if not busy:
    return {}
  floor_ms = floor_ms if floor_ms is not None else data.get("inference_busy_ms")
  record = {"busy_ms": busy["busy_ms"],
            "busy_fraction_of_inference": floor_ms / busy["busy_ms"] if floor_ms else None}
  if top:
    kernels = sorted(busy["kernels"].items(), key=lambda kv: -kv[1])[:top]
    record["busy_kernels_ms"] = dict(kernels)
  return record


def _eggroll_case(eggroll, setup, rank, dtype):
  data = setup()
  frozen, noiser = eggroll.init_noiser({"w": data["w"]}, 0.01, 1e-3, rank=rank)
  key = jax.random.key(2)

  def forward(x, w):
    def one(x_i, thread):
      return eggroll.do_mm(frozen, noiser, w, key, (0, thread), x_i)
    return jax.vmap(one)(x[:, 0], jnp.arange(x.shape[0]))

  forward = jax.jit(forward)
  seconds = _harness.median_time(forward, data["x"], data["w"], repeats=20)
  return {"ms": seconds * 1e3, "fraction_of_inference": _fraction(data, seconds),
          "rank": rank, "dtype": str(dtype), "variant": "eggroll",
          **_busy(data, forward, data["x"], data["w"])}


def _jaxnoise_case(setup, rank, kind, dtype, materialize, implementation, config=None,
                   variant="kernel"):
  data = setup()
  features = data["w"].shape[0]
  if config is None:
    config = config_lib.low_rank_linear_heuristics(1, features, features, rank, kind)
  if materialize:
    config = config_lib.LowRankLinearConfig(materialize=True)
  fn = jax.jit(lambda x, w, seeds: jaxnoise.virtual_perturbed_linear(
      x, w, None, seeds, 0.01, 0, kind=kind, antithetic=True, rank=rank, out_dtype=dtype,
      implementation=implementation, config=config))
  seconds = _harness.median_time(fn, data["x"], data["w"], data["seeds"], repeats=20)
  return {"ms": seconds * 1e3, "fraction_of_inference": _fraction(data, seconds), "rank": rank,
          "kind": kind, "dtype": str(dtype),
          "variant": "materialized" if materialize else variant, "config": str(config),
          **_busy(data, fn, data["x"], data["w"], data["seeds"], top=4)}


def _step_case(setup, rank, kind, dtype, optimizer_name, implementation, operand_dtype):
  """Forward for every member, the gradient estimate and the update of the layer.

  The weight is stored in the benchmark's dtype (as EGGROLL keeps it); the
  gradient GEMM's operands are ``operand_dtype``.
  """
  data = setup()
  optimizer = optax.sgd(1e-3) if optimizer_name == "sgd" else optax.adam(1e-3)
  weight = jnp.array(data["w"], copy=True)  # donated by the step
  opt_state = optimizer.init(weight)
  # "<dtype> cublas": one XLA GEMM per chunk (xla_gemm) instead of the fixed-order tiles.
  gradient_config = config_lib.LowRankGradientConfig(
      operand_dtype=operand_dtype.split()[0], xla_gemm=operand_dtype.endswith("cublas"))

  def step(weight, opt_state, x, seeds):
    y = jaxnoise.virtual_perturbed_linear(
        x, weight, None, seeds, 0.01, 0, kind=kind, antithetic=True, rank=rank,
        out_dtype=dtype, implementation=implementation)
    fitness = jnp.mean(jnp.square(y.astype(jnp.float32) - 0.5), axis=(1, 2))
    fitness = jaxnoise.optim.centered_rank(fitness)
    gradient = jaxnoise.virtual_weight_gradient(
        fitness, seeds, weight.shape, 0.01, None, 0, kind=kind, antithetic=True, rank=rank,
        implementation=implementation, config=gradient_config)
    updates, opt_state = optimizer.update(gradient.astype(weight.dtype), opt_state, weight)
    return optax.apply_updates(weight, updates), opt_state

  step = jax.jit(step, donate_argnums=(0, 1))
  state = {"weight": weight, "opt": opt_state}

  def run(x, seeds):
    state["weight"], state["opt"] = step(state["weight"], state["opt"], x, seeds)
    return state["weight"]

  seconds = _harness.median_time(run, data["x"], data["seeds"], repeats=10)
  gemm = data.get("inference_s")
  busy = _busy(data, run, data["x"], data["seeds"], top=8)
  if busy and data.get("inference_busy_ms"):
    busy["busy_ratio_to_inference_plus_gemm"] = busy["busy_ms"] / (2 * data["inference_busy_ms"])
  return {"ms": seconds * 1e3, "rank": rank, "kind": kind, "dtype": str(dtype),
          "optimizer": optimizer_name, "variant": "es_step", "operand_dtype": operand_dtype,
          "ratio_to_inference_plus_gemm": seconds / (2 * gemm) if gemm else None, **busy}


def plot(results, path):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  rows = [r for r in results if r.get("fraction_of_inference")
          and r["case"].split()[0] in ("jaxnoise", "eggroll")]
  # Device busy time (CUPTI) where the run measured it, else wall clock.
  metric = ("busy_fraction_of_inference"
            if rows and all(r.get("busy_fraction_of_inference") for r in rows)
            else "fraction_of_inference")
  dtypes = sorted({r["dtype"] for r in rows})
  if not dtypes:
    return
  fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4), squeeze=False)
  for ax, dtype in zip(axes[0], dtypes):
    series = {}
    for r in rows:
      if r["dtype"] != dtype:
        continue
      # "kernel" rows are the library's default path (fused GEMM to rank 4, Triton above).
      variant = {"kernel": "default"}.get(r["variant"], r["variant"])
      label = variant if variant == "eggroll" else f"jaxnoise {r['kind']} {variant}"
      series.setdefault(label, []).append((r["rank"], r[metric]))
    for label, points in sorted(series.items()):
      points.sort()
      ax.plot([p[0] for p in points], [100 * p[1] for p in points], marker="o", label=label)
    ax.axhline(95, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rank")
    ax.set_ylabel("% of batch-inference throughput"
                  + (" (device time)" if metric.startswith("busy") else ""))
    ax.set_title(f"1024 members x 8192x8192, {dtype}")
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def replot(json_path: str, png_path: str) -> None:
  """Redraw the figure from a run's JSON (``--replot``)."""
  import json  # pylint: disable=g-import-not-at-top
  with open(json_path) as f:
    plot(json.load(f)["results"], png_path)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--check", action="store_true", help="compiled kernels vs the reference")
  parser.add_argument("--bench", action="store_true", help="EGGROLL's benchmark and an ES step")
  parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU, interpreter)")
  parser.add_argument("--out", default="benchmarks/out", help="output folder")
  parser.add_argument("--eggroll-path", default=".peers",
                      help="folder holding hyperscalees_noiser/ (EGGROLL's public noiser code)")
  parser.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
  parser.add_argument("--ranks", default="1,2,4,8,16", help="comma-separated ranks")
  parser.add_argument("--only", default="",
                      help="run cases whose name contains one of these |-separated strings")
  parser.add_argument("--skip", default="",
                      help="leave out cases whose name contains one of these |-separated strings")
  parser.add_argument("--budget", type=float, default=480.0, help="seconds before skipping")
  parser.add_argument("--replot", nargs=2, metavar=("JSON", "PNG"),
                      help="only redraw the figure of an earlier run")
  args = parser.parse_args()
  if args.replot:
    replot(*args.replot)
    return 0
  implementation = "pallas" if jax.default_backend() == "gpu" else "interpret"
  kinds = [k for k in args.kinds.split(",") if k] or sorted(
      noise_lib.KINDS, key=lambda k: k != noise_lib.DEFAULT_KIND)
  ranks = [int(r) for r in args.ranks.split(",")] if not args.quick else [1, 2]
  cases = []
  if args.check:
    cases += check_cases(args.quick, implementation)
  if args.bench:
    cases += bench_cases(args.quick, implementation, args.eggroll_path, kinds, ranks)
  budget = _harness.Budget(args.budget)
  results = []
  for name, fn in cases:
    if args.only and not any(part in name for part in args.only.split("|")):
      continue
    if args.skip and any(part in name for part in args.skip.split("|")):
      continue
    _harness.run_case(results, name, fn, budget)
  payload = {"facts": _harness.device_facts(), "results": results}
  _harness.write_json(os.path.join(args.out, "low_rank.json"), payload)
  bench_rows = [r for r in results if "ms" in r]
  if bench_rows:
    print(_harness.table(bench_rows, ["case", "ms", "fraction_of_inference",
                                      "ratio_to_inference_plus_gemm", "busy_ms",
                                      "busy_fraction_of_inference",
                                      "busy_ratio_to_inference_plus_gemm"]))
    plot(results, os.path.join(args.out, "low_rank.png"))
  failed = [r for r in results if "error" in r]
  print(f"{len(results)} cases, {len(failed)} errors")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
