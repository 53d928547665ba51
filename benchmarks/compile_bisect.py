"""Issue 14 on a GPU: which factor makes the high-offset forward slow to compile.

    python benchmarks/compile_bisect.py [--timeout-s 40] [--only NAME,NAME]

Each case compiles one jitted function in its own subprocess with a hard
timeout (a hang is recorded as ``> timeout`` and the run goes on), with no
compilation cache. A case varies one factor of the forward kernel
(``pallas_triton.perturbed_linear``, x ``(256, 1024)`` bf16 shared by 64
individuals, ``(1024, 1024)`` weight): the noise tile's orientation
(``PerturbedLinearConfig.transposed_noise``: False is the old kernel, whose
``x @ N^T`` transposes the tile), the offset (0, 2**32 + 5, 2**40 + 3), the
kind, the pipelining depth, the tile size and ptxas's optimisation level.

Per case it records ``lower_s`` and ``compile_s`` (``jit(...).lower()`` and
``.compile()``), ``first_call_s``, ``run_ms`` (best of 5 groups of 10 calls:
the old and new tiles should run alike), and XLA's own stage timers, parsed from its
log (``TF_CPP_VMODULE``): ``hlo_passes_s`` (GpuCompiler::RunHloPasses),
``ir_emission_s`` (the thunk emitter, where each Pallas kernel's Triton IR
goes through XLA's Triton pipeline to LLVM IR), ``llvm_to_ptx_s``
(NVPTXCompiler CompileToPtx) and ``ptxas_s`` (PtxToCubin), each summed over
the module's kernels. A case ``check`` compares the new forward with the
reference noise bit for bit at offset 2**32 + 5 (identity x, every kind).

Prints one line per case and writes ``compile_bisect.json`` under ``$OUT``
(default ``benchmarks/out``). ``--lower-only`` (any machine) lowers each case
for CUDA and stops there: a smoke test of the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import time

HIGH, HIGHER = 2**32 + 5, 2**40 + 3

# name -> (kind, offset, config overrides, extra XLA_FLAGS). "old" is the
# transposed tile (transposed_noise=False); one factor changes at a time.
CASES = {
    "fwd uniform 2^32+5 old": ("uniform", HIGH, {"transposed_noise": False}, ""),
    "fwd uniform 2^32+5 new": ("uniform", HIGH, {}, ""),
    "fwd normal 2^32+5 new": ("normal", HIGH, {}, ""),
    "fwd normal 0 old": ("normal", 0, {"transposed_noise": False}, ""),
    "fwd normal 0 new": ("normal", 0, {}, ""),
    "fwd binomial 2^32+5 new": ("binomial", HIGH, {}, ""),
    # One factor at a time on the slow old kernel (uniform, 2^32+5).
    "fwd uniform 2^32+5 old stages=1": ("uniform", HIGH, {"transposed_noise": False,
                                                           "num_stages": 1}, ""),
    "fwd uniform 2^32+5 old tiles 32x32": ("uniform", HIGH, {"transposed_noise": False,
                                                              "block_out": 32,
                                                              "block_in": 32}, ""),
    "fwd uniform 2^32+5 old ptxas -O0": ("uniform", HIGH, {"transposed_noise": False},
                                         "--xla_gpu_disable_gpuasm_optimizations=true"),
}
# The "forward + VJP + gradient + reduce-metric in one module", normal kind.
MODULE_CASES = ("module normal 2^32+5", "module normal 0")
CHECK_CASE = "check"
# Last: the old normal forward at 2^32+5 ran past 95 s on the H200 (and 124 s
# offline, benchmarks/compile_offline.py), so it mostly shows the timeout.
LAST_CASES = {"fwd normal 2^32+5 old": ("normal", HIGH, {"transposed_noise": False}, "")}
CASES.update(LAST_CASES)

_VMODULE = "gpu_compiler=2,nvptx_compiler=2,compile_module_to_llvm_ir=2"
_TIMERS = {
    "hlo_passes_s": r"GpuCompiler::RunHloPasses for (\S+) time: .*?\((\d+) us\)",
    "ir_emission_s": r"RunBackend - IR emission for (\S+) time: .*?\((\d+) us\)",
    "llvm_to_ptx_s": r"CompileToPtx for (\S+) time: .*?\((\d+) us\)",
    "ptxas_s": r"PtxToCubin for (\S+) time: .*?\((\d+) us\)",
}


def _forward(kind_name, offset, overrides):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jaxnoise import noise as noise_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import config as vn_config  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import pallas_triton  # pylint: disable=g-import-not-at-top
  kind = noise_lib.get_kind(kind_name)
  spec = jax.ShapeDtypeStruct
  config = dataclasses.replace(vn_config.perturbed_linear_heuristics(256, 1024, 1024, kind, 1),
                               **overrides)
  fn = functools.partial(pallas_triton.perturbed_linear, bias=None, offset=offset, kind=kind,
                         antithetic=True, out_dtype=jnp.float32, config=config)
  kwargs = dict(x=spec((256, 1024), jnp.bfloat16), weight=spec((1024, 1024), jnp.bfloat16),
                seeds=spec((64,), jnp.uint32), sigma=spec((), jnp.float32))
  return (lambda kw: fn(**kw)), kwargs, {"config": dataclasses.asdict(config)}


def _module(kind_name, offset):
  """Forward, its VJP (x and weight), the weight gradient and the reduce-metric, one jit."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import jaxnoise  # pylint: disable=g-import-not-at-top
  spec = jax.ShapeDtypeStruct
  shape = (1024, 1024)

  def step(kw):
    def loss(x, weight):
      y = jaxnoise.virtual_perturbed_linear(x, weight, None, kw["seeds"], 0.1, offset,
                                            kind=kind_name, antithetic=True,
                                            implementation="pallas")
      return jnp.sum(y * y)
    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(kw["x"], kw["weight"])
    weight_grad = jaxnoise.virtual_weight_gradient(kw["fitness"], kw["seeds"], shape, 0.1,
                                                   None, offset, kind=kind_name,
                                                   antithetic=True, implementation="pallas")
    metric = jaxnoise.virtual_reduce_metric(kw["center"], kw["seeds"], 0.1, None, offset,
                                            kind=kind_name, antithetic=True,
                                            implementation="pallas")
    return value, grads, weight_grad, metric

  kwargs = dict(x=spec((64, 32, 1024), jnp.float32), weight=spec(shape, jnp.float32),
                seeds=spec((64,), jnp.uint32), fitness=spec((64,), jnp.float32),
                center=spec((shape[0] * shape[1],), jnp.float32))
  return step, kwargs, {}


def _check():
  """The new forward against the reference noise at 2**32 + 5, bit for bit.

  (The old tile's noise was checked on the H200 before; compiling it here at a
  high offset would take minutes.)
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import jaxnoise  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import config as vn_config  # pylint: disable=g-import-not-at-top
  out_features, in_features = 75, 130
  seeds = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, 4, dtype=np.uint64)
                      .astype(np.uint32))
  mismatches = {}
  for kind in ("uniform", "normal", "rademacher", "binomial"):
    expected = np.asarray(jaxnoise.virtual_noise(seeds, (out_features, in_features), HIGH,
                                                 kind=kind))
    config = vn_config.PerturbedLinearConfig(tf32=False, transposed_noise=True)
    y = jaxnoise.virtual_perturbed_linear(
        jnp.eye(in_features), jnp.zeros((out_features, in_features)), None, seeds, 1.0, HIGH,
        kind=kind, implementation="pallas", config=config)
    got = np.transpose(np.asarray(jax.block_until_ready(y)), (0, 2, 1))
    mismatches[kind] = int(np.sum(got != expected))
  return mismatches


def _zeros(tree):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)


def run_case(name: str, lower_only: bool = False) -> dict:
  """Runs in the worker subprocess."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_enable_compilation_cache", False)
  if name == CHECK_CASE:
    return {"mismatches": _check()}
  if name in MODULE_CASES:
    _, kind, offset = name.split()
    fn, kwargs, info = _module(kind, HIGH if offset == "2^32+5" else 0)
  else:
    kind, offset, overrides, _ = CASES[name]
    fn, kwargs, info = _forward(kind, offset, overrides)
  start = time.perf_counter()
  if lower_only:
    jax.jit(fn).trace(kwargs).lower(lowering_platforms=("cuda",))
    return {"lower_s": time.perf_counter() - start}
  lowered = jax.jit(fn).trace(kwargs).lower()
  info["lower_s"] = time.perf_counter() - start
  info["jax"], info["device"] = jax.__version__, jax.devices()[0].device_kind
  start = time.perf_counter()
  compiled = lowered.compile()
  info["compile_s"] = time.perf_counter() - start
  arguments = _zeros(kwargs)
  start = time.perf_counter()
  jax.block_until_ready(compiled(arguments))
  info["first_call_s"] = time.perf_counter() - start
  # Runtime, so a fix that compiles faster is not slower to run: the best of
  # 5 groups of 10 calls (zeros in; the kernel's work does not depend on them).
  groups = []
  for _ in range(5):
    start = time.perf_counter()
    for _ in range(10):
      result = compiled(arguments)
    jax.block_until_ready(result)
    groups.append((time.perf_counter() - start) / 10 * 1e3)
  info["run_ms"] = min(groups)
  return info


def _stage_times(log: str) -> dict:
  times = {}
  for key, pattern in _TIMERS.items():
    for module, micros in re.findall(pattern, log):
      if module.startswith("jit_"):  # the case's module, not autotuning candidates
        times[key] = times.get(key, 0.0) + int(micros) * 1e-6
  return times


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--timeout-s", type=float, default=40.0)
  parser.add_argument("--only", default="", help="comma-separated case names")
  parser.add_argument("--lower-only", action="store_true",
                      help="lower each case for CUDA, no compile (runs without a GPU)")
  parser.add_argument("--case", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.case:
    print("RESULT " + json.dumps(run_case(args.case, args.lower_only), default=str), flush=True)
    return
  names = [CHECK_CASE, *[n for n in CASES if n not in LAST_CASES], *MODULE_CASES, *LAST_CASES]
  if args.only:
    wanted = set(args.only.split(","))
    names = [n for n in names if n in wanted]
  out_dir = pathlib.Path(os.environ.get("OUT", "benchmarks/out"))
  out_dir.mkdir(parents=True, exist_ok=True)
  root = pathlib.Path(__file__).resolve().parents[1]
  results = {}
  for name in names:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE=_VMODULE,
               PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    extra_flags = CASES[name][3] if name in CASES else ""
    if extra_flags:
      env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra_flags}".strip()
    start = time.perf_counter()
    try:
      command = [sys.executable, __file__, "--case", name] + (
          ["--lower-only"] if args.lower_only else [])
      done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s,
                            env=env, check=False)
      lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
      entry = json.loads(lines[-1][len("RESULT "):]) if lines else {
          "error": done.stderr[-1500:]}
      entry.update(_stage_times(done.stderr))
    except subprocess.TimeoutExpired as expired:
      log = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else (
          expired.stderr or "")
      entry = {"timeout_s": args.timeout_s, **_stage_times(log)}
    entry["process_s"] = time.perf_counter() - start
    entry["xla_flags"] = extra_flags
    results[name] = entry
    shown = {k: v for k, v in entry.items() if k != "config" and k != "xla_flags"}
    print(f"{name:<38} " + "  ".join(
        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items()),
        flush=True)
    # Written after every case, so a run cut short keeps what it measured.
    (out_dir / "compile_bisect.json").write_text(json.dumps(
        {"timeout_s": args.timeout_s, "cases": results}, indent=2, default=str))
  print(f"wrote {out_dir / 'compile_bisect.json'}")


if __name__ == "__main__":
  main()
