"""The benchmark scripts run end to end in their CPU ``--quick`` modes.

They are the tools every GPU figure in ``benchmarks/RESULTS.md`` comes from, so
they must not rot between GPU sessions. Each case must finish without an
error record; the kernels run through the Pallas interpreter.
"""

import dataclasses
import importlib
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp_path, script, *args):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args,
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.mark.parametrize("args", [
    ("--bench", "--quick", "--only", "rademacher anti=True"),
    ("--sweep", "--quick", "--only", "gradient"),
    ("--check", "--quick", "--skip-noise-bits", "--only", "flat ops rademacher"),
    ("--throughput", "--quick", "--only", "binomial anti=False"),
], ids=["bench", "sweep", "check", "throughput"])
def test_virtual_noise_benchmark_quick(tmp_path, args):
  _run(tmp_path, "bench_virtual_noise.py", *args, "--tag", "quick")
  with open(tmp_path / "quick.json") as f:
    results = json.load(f)["results"]
  assert results, "no case ran"
  errors = [r for r in results if "error" in r or "skipped" in r]
  assert not errors, errors


def test_es_step_benchmark_quick(tmp_path):
  _run(tmp_path, "bench_es_step.py", "--quick")
  with open(tmp_path / "es_step.json") as f:
    results = json.load(f)["results"]
  assert any(r.get("step_ms", 0) > 0 for r in results)
  assert not [r for r in results if "error" in r]


def test_lm_benchmark_quick(tmp_path):
  _run(tmp_path, "bench_lm.py", "--quick")
  with open(tmp_path / "lm_step.json") as f:
    results = json.load(f)["results"]
  assert {r["rank"] for r in results if r.get("tokens_per_s", 0) > 0} == {"1", "full",
                                                                          "inference"}
  assert not [r for r in results if "error" in r or "skipped" in r]
  steps = [r for r in results if r["rank"] != "inference"]
  assert all(r["of_inference"] > 0 for r in steps), steps  # each step against the floor


def test_lm_layers_probe_quick(tmp_path):
  """Every GEMM variant runs at a tiny layer (interpreter) and adds the default's noise."""
  _run(tmp_path, "probe_lm_layers.py", "--quick", "--variants", "default,stages2,operands")
  with open(tmp_path / "lm_layers.json") as f:
    [record] = json.load(f)["results"]
  assert not [k for k in record if k.endswith("_error")], record
  assert all(record[f"{name}_ms"] > 0 for name in ("xla", "default", "stages2", "operands"))
  assert record["stages2_max_diff"] == 0.0 and record["operands_max_diff"] < 1e-2, record


def test_lm_layer_profile_script_quick(tmp_path):
  """The Nsight Compute driver runs the XLA floor and the fused GEMM (interpreter)."""
  _run(tmp_path, "profile_lm_layer.py", "--quick")
  with open(tmp_path / "lm_layer_profile.json") as f:
    record = json.load(f)
  assert record["finite"] and record["output"] == [4, 64, 256], record


def test_scaling_benchmark_quick(tmp_path):
  _run(tmp_path, "bench_scaling.py", "--quick", "--cases", "exact,mlp,lm",
       "--modes", "replicated,fsdp_eval")
  with open(tmp_path / "scaling.json") as f:
    results = json.load(f)["results"]
  assert not [r for r in results if "error" in r or "skipped" in r], results
  assert any(r.get("efficiency", 0) > 0 for r in results)
  assert [r["bit_exact"] for r in results if "bit_exact" in r] == [True, True]
  cases = " ".join(r["case"] for r in results)
  assert "fsdp_eval devices=2" in cases and "lm rank=1 pop=8 devices=2" in cases, cases


def test_scaling_quick_mode_adds_host_devices_to_other_xla_flags():
  module = _benchmark_module("bench_scaling")
  assert module.with_host_devices("", 2) == "--xla_force_host_platform_device_count=2"
  assert module.with_host_devices("--xla_dump_to=/tmp/d", 2) == (
      "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=2")
  kept = "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/d"
  assert module.with_host_devices(kept, 2) == kept


def test_scaling_benchmark_deep_models_quick(tmp_path):
  """Sizes from XLA's memory analysis (of a pretend 256 KiB device), FSDP runs."""
  _run(tmp_path, "bench_scaling.py", "--quick", "--cases", "deep")
  with open(tmp_path / "scaling.json") as f:
    results = json.load(f)["results"]
  assert not [r for r in results if "error" in r or "skipped" in r], results
  pick = results[0]
  assert 1 <= pick["layers_one_device"] <= pick["layers_sharded"], pick
  assert [r["devices"] for r in results[1:]] == [2, 1, 1, 2], results
  assert all(r.get("step_ms", 0) > 0 for r in results[1:]), results  # no OOM on the CPU


def test_low_rank_gradient_benchmark_quick(tmp_path):
  _run(tmp_path, "bench_low_rank_gradient.py", "--quick")
  with open(tmp_path / "low_rank_gradient.json") as f:
    results = json.load(f)["results"]
  assert len(results) == 2 and all(r["rows_bit_exact"] for r in results), results
  assert all(r["max_rel_diff_tiles_vs_xla_gemm"] < 1e-5 for r in results), results


def test_gradient_lanes_benchmark_quick(tmp_path):
  """Lane and row tiles against the reference, and against each other bit for bit."""
  _run(tmp_path, "bench_gradient_lanes.py", "--quick")
  with open(tmp_path / "gradient_lanes_rademacher.json") as f:
    results = json.load(f)["results"]
  assert len(results) == 2 and all(r["lanes_bit_for_bit"] for r in results), results


def test_es_quality_benchmark_quick(tmp_path):
  # One kind against evosax on every problem family (BBOB, gymnax, digits).
  pytest.importorskip("evosax")
  pytest.importorskip("gymnax")
  _run(tmp_path, "es_quality.py", "--quick", "--kinds", "binomial")
  with open(tmp_path / "es_quality.json") as f:
    results = json.load(f)["results"]
  assert {r["family"] for r in results} == {"bbob", "rl", "digits"}
  assert {r["method"] for r in results} == {"binomial", "evosax"}
  assert not [r for r in results if "error" in r]
  assert (tmp_path / "es_quality.md").exists() and (tmp_path / "es_quality.png").exists()


def test_low_rank_benchmark_quick(tmp_path):
  _run(tmp_path, "bench_low_rank.py", "--check", "--bench", "--quick", "--only",
       "rank=1 shared=False anti=True|inference|jaxnoise float32 binomial rank=1|"
       "es step float32 binomial rank=1 sgd")
  with open(tmp_path / "low_rank.json") as f:
    results = json.load(f)["results"]
  assert any(r["case"].startswith("check") and r.get("ok") for r in results)
  assert any(r.get("fraction_of_inference") for r in results)
  assert not [r for r in results if "error" in r or "skipped" in r], results


def test_compile_bisect_lowers_its_cases(tmp_path):
  """The GPU compile-time bisection (issue 14) runs its subprocess cases; here lowering only."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", OUT=str(tmp_path))
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "compile_bisect.py"), "--lower-only",
       "--only", "fwd uniform 2^32+5 old,fwd normal 2^32+5 new"],
      capture_output=True, text=True, env=env, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "compile_bisect.json") as f:
    cases = json.load(f)["cases"]
  assert set(cases) == {"fwd uniform 2^32+5 old", "fwd normal 2^32+5 new"}
  assert all("lower_s" in entry for entry in cases.values()), cases


def test_ternary_benchmark_quick(tmp_path):
  """The compiled-check part (what the GPU script runs first), cut short by its budget."""
  _run(tmp_path, "bench_ternary.py", "--part", "check", "--quick", "--budget", "2")
  with open(tmp_path / "ternary_check.json") as f:
    record = json.load(f)
  checks = record["result"]
  assert checks and "error" not in checks, checks
  updates = [row for name, row in checks.items() if name.startswith("counter_update")]
  assert updates and all(row["within_spec"] for row in updates), updates


def test_ternary_decode_benchmark_quick(tmp_path):
  """The decode part runs in interpret mode and finds no mismatch against the reference."""
  _run(tmp_path, "bench_ternary.py", "--part", "decode", "--quick")
  with open(tmp_path / "ternary_decode.json") as f:
    rows = json.load(f)["result"]["cases"]
  kernels = {name: row for name, row in rows.items() if not name.endswith("copy")}
  assert kernels and all(row["mismatches"] == 0 for row in kernels.values()), rows


def test_ternary_matmul_interleave_sweep_quick(tmp_path):
  """``--part matmul --sweep interleave`` (session 22's joined dot tiles): the first two
  configs at 5 and 40 rows run in interpret mode and match the reference."""
  _run(tmp_path, "bench_ternary.py", "--part", "matmul", "--quick", "--sweep", "interleave",
       "--batches", "5,40")
  with open(tmp_path / "ternary_matmul.json") as f:
    rows = json.load(f)["result"]["cases"]
  kernels = {name: row for name, row in rows.items() if "bf16_matmul" not in name}
  assert len(kernels) == 4 and any("interleave_lanes=True" in name for name in kernels), rows
  assert all("seconds" in row and not row.get("excluded") for row in kernels.values()), rows


def test_from_io_blocks_probe_quick(tmp_path):
  """probe_from_io_blocks.py: every form of the row-block update agrees with the dense one."""
  _run(tmp_path, "probe_from_io_blocks.py", "--quick")
  with open(tmp_path / "probe_from_io_blocks.json") as f:
    rows = json.load(f)["results"]
  checked = [row["check"] for row in rows.values() if "check" in row]
  assert len(checked) == len(rows) - 1 and all(c["within_spec"] for c in checked), rows


def _benchmark_module(name: str):
  """The module ``benchmarks/<name>.py``, imported."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    return importlib.import_module(name)
  finally:
    sys.path.pop(0)


def test_compile_probe_cases_trace():
  """compile_probe.py's public-API cases (GPU-only kernels) trace with the reference ops."""
  compile_probe = _benchmark_module("compile_probe")
  import jax  # pylint: disable=g-import-not-at-top
  cases = compile_probe.low_rank_cases("reference") + compile_probe.ternary_cases("reference")
  names = [name for name, _, _ in cases]
  assert len(names) == len(set(names)) and len(names) > 100
  for name, fn, kwargs in cases:
    if not name.startswith("from_io"):  # Kernel calls: lowered on a CPU by --ir-only.
      jax.eval_shape(lambda kw, fn=fn: fn(**kw), kwargs)


def test_compile_offline_lowers_public_api_kernel_cases_for_cuda(tmp_path):
  """compile_offline.py lowers the public ops' Pallas cases for CUDA on a machine without a
  GPU (the deviceless compile itself needs the PJRT plugin)."""
  compile_offline = _benchmark_module("compile_offline")
  compile_probe = _benchmark_module("compile_probe")
  cases = [case for case in compile_probe.low_rank_cases()
           if case[0] in ("lr_gradient_bf16 binomial r4 4294967301",
                          "lr_weight_update rademacher r1 0")]
  assert len(cases) == 2
  import jax  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops import _pallas  # pylint: disable=g-import-not-at-top
  limit, backend = _pallas.max_shared_memory_per_block, jax.default_backend
  files = compile_offline._lower(cases, tmp_path)  # pylint: disable=protected-access
  for path in files.values():
    assert "__gpu$xla.gpu.triton" in path.read_text()
  # What it fakes while lowering is restored.
  assert (_pallas.max_shared_memory_per_block, jax.default_backend) == (limit, backend)


def test_update_warps_probe_quick(tmp_path):
  """probe_update_warps.py: every warps choice it times passes the reference screen."""
  _run(tmp_path, "probe_update_warps.py", "--quick")
  with open(tmp_path / "probe_update_warps.json") as f:
    rows = json.load(f)["results"]
  assert rows and all(row["check"]["within_spec"] for row in rows.values()), rows


@pytest.mark.parametrize("form", ["library", "no-check", "whole"])
def test_offline_finite_check_lowers_each_form_for_cuda(form):
  """``offline_finite_check.py`` lowers each form of the check for CUDA on any machine (the
  deviceless compile itself needs the PJRT CUDA plugin), and only the forms with a check
  test finiteness."""
  text = _benchmark_module("offline_finite_check").lowered_step(form).as_text()
  assert "8192x8192xbf16" in text
  assert ("is_finite" in text) == (form != "no-check")


@pytest.mark.parametrize("rows", [1, 64])
def test_offline_mosaic_ptxas_lowers_its_case_for_cuda(rows):
  """``offline_mosaic_ptxas.py`` lowers the fused GEMM of one-row and 64-row members for CUDA
  on any machine (its deviceless compile needs the PJRT plugin and ptxas)."""
  text = _benchmark_module("offline_mosaic_ptxas").lower_case("bf16:2", {}, (1 << 40) + 3,
                                                            rows).as_text()
  assert "mosaic_gpu" in text
  assert f"{1024 // rows}x{rows}x8192xbf16" in text


@pytest.mark.parametrize("config", ["xla_gemm", "default"])
def test_offline_es_passes_lowers_the_update_as_on_a_gpu(config):
  """``offline_es_passes.py`` lowers the update for CUDA on any machine, with the tile
  kernel where the config asks for it (the deviceless compile needs the PJRT plugin)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  text = _benchmark_module("offline_es_passes").lowered_update(
      "sgd", config, jnp.dtype(jnp.bfloat16), True).as_text()
  assert "8192x8192xbf16" in text
  assert ("__gpu$xla.gpu.triton" in text) == (config == "default")


def test_offline_es_passes_counts_the_layer_sized_arrays_of_each_kernel():
  module = _benchmark_module("offline_es_passes")
  entry = """%main (p0: bf16[8192,8192], p1: f32[1024]) -> bf16[8192,8192] {
  %p0 = bf16[8192,8192]{1,0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %gemm.1 = f32[4096,512]{1,0} fusion(%p0, %p1), kind=kCustom, calls=%gemm
  %small = f32[1024]{0} fusion(%p1), kind=kLoop, calls=%f
  %multi.2 = (bf16[8192,8192]{1,0}, pred[8192]{0}) fusion(%gemm.1, %p0), kind=kInput
  ROOT %gte = bf16[8192,8192]{1,0} get-tuple-element(%multi.2), index=0
}"""
  mib = 1 << 20
  assert module.layer_traffic(entry) == [("gemm.1", 128 * mib + 8 * mib),
                                         ("multi.2", 8 * mib + 128 * mib + 128 * mib)]


def test_compile_offline_debug_option_bytes_nest_the_fields():
  """``executable_build_options`` (3) > ``debug_options`` (3) > field 382 = true, 188 = false."""
  compile_offline = _benchmark_module("compile_offline")
  assert compile_offline.debug_option_bytes({}) == b""
  assert compile_offline.debug_option_bytes({382: True}) == b"\x1a\x05\x1a\x03\xf0\x17\x01"
  assert compile_offline.debug_option_bytes({188: False, 382: True}) == (
      b"\x1a\x08\x1a\x06\xe0\x0b\x00\xf0\x17\x01")


def test_offline_es_passes_counts_a_loop_body_per_trip():
  module = _benchmark_module("offline_es_passes")
  text = """HloModule m

%body.1 (p: (s32[], f32[4096,512])) -> (s32[], f32[4096,512]) {
  %p = (s32[], f32[4096,512]{1,0}) parameter(0)
  %total = f32[4096,512]{1,0} get-tuple-element(%p), index=1
  %add.1 = f32[4096,512]{1,0} fusion(%total), kind=kLoop, calls=%f
  ROOT %t = (s32[], f32[4096,512]{1,0}) tuple(%i, %add.1)
}

ENTRY %main (a: f32[4096,512]) -> f32[4096,512] {
  %a = f32[4096,512]{1,0} parameter(0)
  %tuple = (s32[], f32[4096,512]{1,0}) tuple(%zero, %a)
  %while.1 = (s32[], f32[4096,512]{1,0}) while(%tuple), condition=%cond, body=%body.1, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[4096,512]{1,0} get-tuple-element(%while.1), index=1
}
"""
  mib = 1 << 20
  assert module.layer_traffic(text) == [("while.1/add.1 x3", 3 * (8 * mib + 8 * mib))]


def test_offline_mosaic_ptxas_lowers_its_cases_and_reads_a_report():
  """offline_mosaic_ptxas.py lowers the fused GEMM for CUDA here, and reads ptxas's report."""
  module = _benchmark_module("offline_mosaic_ptxas")
  assert "mosaic_gpu" in module.lower_case("f32:4", {"gemm_stages": 3}, (1 << 40) + 3).as_text()
  assert module.parse_field("gemm_stages=3") == ("gemm_stages", 3)
  assert module.parse_field("fused_gemm=False") == ("fused_gemm", False)
  report = "\n".join([
      "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to non wgmma instructions defining accumulator registers",
      "ptxas warning : Registers are spilled to local memory in function 'k', 2448 bytes spill "
      "stores, 2448 bytes spill loads",
      "ptxas info    : Used 168 registers, used 16 barriers, 1832 bytes cumulative stack size",
      "ptxas info    : Compile time = 1066.958 ms",
      "compile seconds 9.53"])
  assert module.summary(report) == {"registers": 168, "spill_bytes": 2448, "ptxas_s": 1.07,
                                    "compile_s": 9.53, "notes": ["C7515"]}
  assert module.summary("ptxas info    : Used 96 registers")["spill_bytes"] == 0


def test_offline_mosaic_ptxas_lowers_codes_ahead_and_reports_a_missing_dump(tmp_path):
  module = _benchmark_module("offline_mosaic_ptxas")
  lowered = module.lower_case("bf16:4", {"gemm_noise_ahead": 4}, 5)
  assert "mosaic_gpu" in lowered.as_text()
  assert module.disassemble(str(tmp_path)).startswith("no PTX")


def test_offline_ptx_captures_the_fused_operands_kernel():
  """offline_ptx.py's operands case: the Triton IR of the fused forward's x_i B_i kernel."""
  import argparse  # pylint: disable=g-import-not-at-top
  module = _benchmark_module("offline_ptx")
  args = argparse.Namespace(dims=[256, 512, 512], dtype="bfloat16", rank=4, kind="binomial")
  fn, shapes, config, elements = module.operands_case(args)
  ttir = module.capture_ttir(fn, *shapes)
  assert "tt.func" in ttir and "tt.reduce" in ttir
  assert elements == 4 * config.block_reduce


def test_offline_wgmma_ternary_sass_lowers_refused_tiles_and_reads_the_main_loop():
  """offline_wgmma_ternary_sass.py lowers tiles the config check refuses (four warpgroups,
  256-row batch tiles) without leaving them allowed, and counts a main loop's opcodes."""
  from jaxnoise.ops.ternary import mosaic_gpu_matmul  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary.config import matmul as matmul_config  # pylint: disable=g-import-not-at-top
  module = _benchmark_module("offline_wgmma_ternary_sass")
  for case in ("16x512x1024:block_n=256,split_k=2", "300x256x512:block_m=256,in_flight=2"):
    assert "mosaic_gpu" in module.lower(case)
  assert (matmul_config.WGMMA_BLOCK_NS, matmul_config.WGMMA_MAX_BLOCK_M) == ((128,), 256)
  assert mosaic_gpu_matmul.STEPS_IN_FLIGHT == 1
  sass = "\n".join([
      "        /*0010*/                   MOV R1, c[0x0][0x28] ;",
      ".L_x_7:",
      "        /*0020*/                   LOP3.LUT R5, R8, 0x3f, R5, 0xf8, !PT ;",
      "        /*0030*/              @!P0 BRA `(.L_x_9) ;",
      "        /*0040*/                   IMAD.SHL.U32 R5, R10, 0x400, RZ ;",
      "        /*0050*/                   HGMMA.64x16x16.F32.BF16 R24, R32, gdesc[UR16], R24 ;",
      "        /*0060*/               @P0 BRA `(.L_x_7) ;",
      "        /*0070*/                   EXIT ;"])
  assert module.main_loop_opcodes(sass) == {"LOP3": 1, "BRA": 2, "IMAD": 1, "HGMMA": 1}


def test_wgmma_tile_exploration_lists_its_variants():
  """explore_wgmma_tiles.py: the heuristic's tiles first, the other batch tile only past 128
  rows (at the same number of programs), splits that divide the steps."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  module = _benchmark_module("explore_wgmma_tiles")
  small = module.variants((16, 4096, 4096), jnp.bfloat16)
  assert [label for label, _ in small] == ["base", "split2", "split8", "substeps1",
                                           "cluster_sum"]
  assert small[0][1] == module.MatmulConfig.wgmma_config((16, 4096, 4096))
  # The same steps in buffers (shared memory): twice the buffers of one step.
  assert (small[3][1].num_stages, small[3][1].substeps) == (2 * small[0][1].num_stages, 1)
  large = dict(module.variants((256, 4096, 4096), jnp.bfloat16))
  assert (large["base"].block_m, large["base"].split_k) == (256, 4)
  assert (large["bm128"].block_m, large["bm128"].split_k) == (128, 2)
  # 4 stages of 256-row tiles leave no room for the cluster's partials: 2 stages beside.
  assert large["cluster_sum_stages2"] == dataclasses.replace(large["base"], num_stages=2)
  assert not module.mosaic_gpu_matmul.REDUCE_IN_CLUSTER  # the default, left as it was
  for label, config in module.variants((3, 1024, 192), jnp.float32):
    assert (192 // 64) % config.split_k == 0, label
