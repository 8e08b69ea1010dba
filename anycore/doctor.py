"""``anycore doctor``: what this machine offers and what the engine will run on it."""

from __future__ import annotations

import os

from anycore.kernels.build import ExtensionInfo
from anycore.platform import selection
from anycore.platform.features import CpuFeatures, detect, is_sve_length_flag, sve_length_flag

# Flags worth showing (everything else in /proc/cpuinfo is noise for an inference engine).
_SHOWN = {
    "x86_64": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
               "avx512_vnni", "avx_vnni", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"),
    "aarch64": ("asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2", "svei8mm", "svebf16",
                "sme", "sme2"),
}


def run_doctor(features: CpuFeatures | None = None, overrides: str | None = None) -> str:
    """The report as text. Builds/loads the kernel extension if needed; never raises."""
    import torch

    from anycore.kernels.build import load_extension
    from anycore.kernels.dispatch import plan
    from anycore.kernels.ops import FUSED_OPS

    f = features or detect()
    if overrides is None:
        overrides = os.environ.get(selection.ENV_OVERRIDE, "")
    lines = ["anycore doctor", ""]
    caches = ", ".join(f"{k} {_size(v)}" for k, v in f.caches) or "unknown"
    lines += [
        f"CPU       {f.model_name} ({f.arch})",
        f"cores     {f.cores} usable, NUMA nodes {f.numa_nodes}",
        f"caches    {caches}",
    ]
    shown = _SHOWN.get(f.arch, ())
    have = [x for x in shown if x in f.flags]
    lacking = [x for x in shown if x not in f.flags]
    lines.append(f"features  {' '.join(have) or '(none of interest)'}")
    if lacking:
        lines.append(f"lacking   {' '.join(lacking)}")
    if f.sve_vector_bits:
        # variants compiled for one SVE length (an sve<bits> pseudo-flag in their requirements)
        own = sve_length_flag(f.sve_vector_bits)
        fixed = [v for v in selection.variants_for_arch(f.arch) if any(map(is_sve_length_flag, v.requires))]
        notes = [f"{v.name}: for this length" if own in v.requires else f"{v.name}: not used, built for another length"
                 for v in fixed]
        lines.append(f"SVE       {f.sve_vector_bits}-bit vectors" + (f" ({'; '.join(notes)})" if notes else ""))
    warnings: list[str] = list(f.notes)

    ext = load_extension()
    lines += ["", f"extension {extension_origin(ext)}"]
    if ext.available:
        lines.append(f"          compiler: {ext.compiler or 'unknown'}; arch {ext.arch}; variants: {', '.join(ext.variants)}")
        for v in selection.buildable_variants(ext.arch):
            if v.name in ext.variants:
                lines.append(f"          {v.name:<12} {v.source:<22} {' '.join(v.cflags) or '(baseline ISA)'}")
    else:
        warnings.append("C++ kernel extension unavailable: every op runs torch-native (slower)")
    warnings += list(ext.notes)

    sel = plan(f, overrides, ext)
    lines += ["", "kernels   (override with ANYCORE_KERNELS=op=impl,... or =torch-native)"]
    width = max(len(op) for op in selection.OPS)
    for c in sel.choices:
        lines.append(f"  {c.op:<{width}}  {c.impl:<12}  {c.reason}")
    native = {c.op for c in sel.choices if ext.available and c.impl in ext.variants}
    unfused = [op for op in FUSED_OPS if op not in native]
    lines.append(f"  {'decoder_stack':<{width}}  {'native' if not unfused else 'op by op':<12}  "
                 + ("all layers in one native call (csrc/common/decoder_layer.cpp; batch-1 decode in one "
                    "thread team, decode_team.cpp; op by op while a projection has hooks, and for MoE "
                    "models, whose sparse layers are one fused_moe call each)" if not unfused
                    else f"op by op from Python: {', '.join(unfused)} not native"))
    from anycore.models.registry import op_by_op_architectures

    for arch, reason in op_by_op_architectures().items():
        lines.append(f"  {'':<{width}}  {'op by op':<12}  {arch}: {reason}")
    lines.append(f"  {'(tensor par.)':<{width}}  {'op by op':<12}  --tensor-parallel-size > 1: every rank runs its "
                 "shard's layers op by op (the native stack has no collectives inside); all-reduce below")
    gguf = sel.impl("gguf_linear")
    gguf_native = ext.available and gguf in ext.variants
    lines.append(f"  {'(gguf blocks)':<{width}}  {gguf:<12}  a quantized GGUF file with --dtype bfloat16 (default; "
                 "--quantization gguf): its Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K projections stay in their blocks "
                 "(int8 activations per 32-block), other types dequantized (--quantization none: all); "
                 + ("in the native decoder stack and decode team" if gguf_native and not unfused
                    else "op by op from Python"))
    warnings += sel.warnings

    threads = torch.get_num_threads()
    lines += ["", f"threads   torch intra-op {threads}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"]
    from anycore.distributed.group import placement

    tp = max(2, f.numa_nodes)
    lines.append(f"tensor    --tensor-parallel-size {tp} would place "
                 + "; ".join(placement(r, r, tp, None).describe() for r in range(tp)))
    from anycore.distributed.shm import implementation

    shm_impl = implementation()
    lines.append("tensor    all-reduce on one host: " + (f"shm ({shm_impl[0]}, bound by the TP group, not by the "
                                                         "kernel table above); gloo across hosts" if shm_impl
                                                         else "gloo (no shm all-reduce implementation here)"))
    if threads > f.cores:
        warnings.append(f"{threads} threads on {f.cores} usable cores: oversubscribed")
    if f.numa_nodes > 1:
        warnings.append(f"{f.numa_nodes} NUMA nodes: bind the server to one node (numactl -N0 -m0) "
                        "or expect cross-node memory traffic")
    if f.has("amx_tile") and not any(v.ops for v in selection.VARIANTS if v.name == "amx"):
        warnings.append("AMX present, but no AMX kernels exist yet (bf16 GEMM goes through torch/oneDNN)")
    if f.arch == "aarch64" and sel.impl("linear") not in (selection.TORCH_NATIVE, selection.REFERENCE):
        warnings.append(f"linear runs on {sel.impl('linear')} so that bf16 decode is one native call; it was "
                        "not timed against torch's oneDNN/ACL on Arm hardware (compare with "
                        "ANYCORE_KERNELS=linear=torch-native)")
    if f.arch not in ("x86_64", "aarch64"):
        warnings.append(f"architecture {f.arch}: only the portable generic kernels apply")

    lines += ["", "warnings" if warnings else "warnings  none"]
    lines += [f"  - {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def extension_origin(ext: ExtensionInfo) -> str:
    """Where the kernel library came from: the wheel, a compile on this machine, or nowhere."""
    if not ext.available:
        return f"unavailable ({ext.error or 'unknown reason'})"
    if ext.origin == "prebuilt":
        return f"prebuilt in the wheel ({ext.path})"
    how = "cached" if ext.cached else f"compiled now, in {ext.build_seconds}s"
    if ext.origin == "ext-dir":
        return f"ANYCORE_EXT_DIR ({ext.path}; {how})"
    return f"JIT cache ({ext.path}; {how})"


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def self_check_section(model: str | None, dtype: str, threads: int | None) -> str:
    """Loads ``model`` (default: the default model) and times a few batch-1 decode steps against
    the probed read bandwidth (engine/self_check.py); one line, never raises."""
    import logging

    quiet = logging.getLogger("anycore")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # the load's INFO lines would bury the report
    try:
        from anycore.config import EngineConfig
        from anycore.engine.engine import Engine
        from anycore.engine.self_check import decode_self_check

        engine = Engine(EngineConfig(model=model, dtype=dtype, threads=threads, kv_cache_gb=0.05))
        check = decode_self_check(engine)
    except Exception as e:  # noqa: BLE001 - doctor reports, it does not fail
        return f"self-check  not run: {e}\n"
    finally:
        quiet.setLevel(level)
    line = f"self-check  {engine.model_name}: {check.summary()}\n"
    line += f"            KV layout: {engine.kv_layout}\n"
    if engine.quantization == "gguf":
        from anycore.engine.engine import gguf_summary

        line += f"            gguf: {gguf_summary(engine.model, engine.runner.native.stack(engine.dtype) is not None)}\n"
    return line
