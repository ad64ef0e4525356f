"""Where a model runs and in what precision (§5.2's hardware, any machine): the device, the CPU's
class and flags, the precision `auto` picks for training and decoding, and the kernels that follow.

One rule for every verb: bf16 only where the processor computes it natively (a CUDA GPU with bf16,
a CPU with AVX-512 BF16 or AMX), fp32 elsewhere; int8 (decoding, CPU, only when asked for) by the
processor's int8 instructions (`int8_kernel`): with VNNI, 8-bit rows through `torch._int_mm`
(32-bit sums); with AVX2 but no VNNI, whose instructions sum pairs in 16 bits (oneDNN's s8 x s8
product saturates there: bench/int8/2026-11-26_int8_isa.json), 7-bit rows through fbgemm's reduce-range kernel,
which cannot saturate; without AVX2, int8 is refused and decoding runs in fp32. The flags are the
processor's, less what the user has barred oneDNN from with ONEDNN_MAX_CPU_ISA (so that variable
reproduces a smaller CPU's choices here; FBGEMM_ENABLE_INSTRUCTIONS=AVX2 limits fbgemm's kernels).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path
from typing import Any

import torch

from .errors import ConfigError

log = logging.getLogger("aiayn")
PRECISIONS = ("auto", "fp32", "bf16", "int8")
TRAIN_PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # fp16: with dynamic loss scaling (training/scaling.py)
_NATIVE_BF16 = {"avx512_bf16", "amx_bf16"}  # x86 flags of processors that compute bf16 products natively
_VNNI = {"avx512_vnni", "avx_vnni", "amx_int8"}  # int8 products with 32-bit sums
_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
# oneDNN's ISA levels (ONEDNN_MAX_CPU_ISA), each with the graded flags it may use; a flag above the
# level is barred. Levels not listed (and "ALL", "DEFAULT") bar nothing.
_ISA_LEVELS: dict[str, set[str]] = {"SSE41": set(), "AVX": set(), "AVX2": set(), "AVX2_VNNI": {"avx_vnni"},
                                    "AVX2_VNNI_2": {"avx_vnni", "avx_vnni_int8", "avx_ne_convert"},
                                    "AVX512_CORE": _AVX512, "AVX512_CORE_VNNI": _AVX512 | {"avx512_vnni", "avx_vnni"}}
_ISA_LEVELS["AVX512_CORE_BF16"] = _ISA_LEVELS["AVX512_CORE_VNNI"] | {"avx512_bf16"}
_ISA_LEVELS["AVX512_CORE_FP16"] = _ISA_LEVELS["AVX10_1_512"] = _ISA_LEVELS["AVX512_CORE_BF16"] | {"avx512_fp16"}
_GRADED = set().union(*_ISA_LEVELS.values(), {"amx_bf16", "amx_int8", "amx_tile", "amx_fp16"})


@functools.cache
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags(text: str | None = None, env: dict[str, str] | None = None) -> set[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo, or `text`), less those ONEDNN_MAX_CPU_ISA
    bars (in `env`, default os.environ); empty where they cannot be read."""
    text = _cpuinfo() if text is None else text
    line = next((x for x in text.splitlines() if x.startswith(("flags", "Features"))), "")
    flags = set(line.partition(":")[2].split())
    limit = (os.environ if env is None else env).get("ONEDNN_MAX_CPU_ISA", "").upper()
    if limit in _ISA_LEVELS:
        flags -= _GRADED - _ISA_LEVELS[limit]
    return flags


def native_bf16(flags: set[str] | None = None) -> list[str]:
    """The flags by which this CPU (or `flags`) computes bf16 products natively; empty: emulated."""
    return sorted((cpu_flags() if flags is None else flags) & _NATIVE_BF16)


def int8_products(flags: set[str] | None = None) -> list[str]:
    """The flags by which this CPU (or `flags`) computes exact, fast int8 products (VNNI); empty: none."""
    return sorted((cpu_flags() if flags is None else flags) & _VNNI)


def int8_kernel(flags: set[str] | None = None) -> str | None:
    """The int8 product this CPU (or `flags`) decodes with: "int_mm" (VNNI: 8-bit rows, 32-bit
    sums), "fbgemm" (AVX2 without VNNI: 7-bit rows, so no 16-bit pair sum saturates), or None."""
    flags = cpu_flags() if flags is None else flags
    if flags & _VNNI:
        return "int_mm"
    if ("avx2" in flags and "fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_dynamic")):
        return "fbgemm"
    return None


def cpu_class(text: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """What a figure measured on this CPU is labelled with: name, family, model, the vector class
    that decides aiayn's kernels ("AVX-512 BF16", "AVX-512", "AVX2", ...), and any ISA limit set."""
    text = _cpuinfo() if text is None else text
    keys = {"model name": "cpu", "cpu family": "cpu_family", "model": "cpu_model"}
    out: dict[str, Any] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in keys:
            out[keys[key]] = int(value) if key != "model name" and value.isdigit() else value
    flags = cpu_flags(text, env)
    if "amx_bf16" in flags:
        vector = "AMX"
    elif "avx512_bf16" in flags:
        vector = "AVX-512 BF16"
    elif "avx512f" in flags:
        vector = "AVX-512" + (" VNNI" if "avx512_vnni" in flags else "")
    elif "avx2" in flags:
        vector = "AVX2" + (" VNNI" if "avx_vnni" in flags else "")
    else:
        vector = "unknown" if not flags else "pre-AVX2"
    limit = (os.environ if env is None else env).get("ONEDNN_MAX_CPU_ISA")
    aten = os.environ.get("ATEN_CPU_CAPABILITY") if env is None else env.get("ATEN_CPU_CAPABILITY")
    return {**out, "class": vector, "native_bf16": bool(native_bf16(flags)), "vnni": bool(int8_products(flags)),
            "onednn_max_cpu_isa": limit, "aten_cpu_capability": aten}


def cpu_label(info: dict[str, Any] | None = None) -> str:
    """One line: 'AMD EPYC family 26 model 2, AVX-512 BF16' (with an ISA limit when one is set)."""
    info = cpu_class() if info is None else info
    name = f"{info.get('cpu', 'CPU')} family {info.get('cpu_family', '?')} model {info.get('cpu_model', '?')}"
    limit = info.get("onednn_max_cpu_isa")
    return f"{name}, {info['class']}" + (f" (ONEDNN_MAX_CPU_ISA={limit})" if limit else "")


def resolve_precision(precision: str, device: torch.device, flags: set[str] | None = None,
                      choices: tuple[str, ...] = PRECISIONS) -> tuple[str, str]:
    """The precision that runs, and why. `auto` is bf16 where the processor computes bf16
    natively — a CUDA GPU with bf16 (Ampere or later), a CPU with AVX-512 BF16 or AMX — and fp32
    elsewhere; int8 (CPU only, decoding) is never chosen for the user, and where it is asked for
    on a CPU without AVX2 it falls back to fp32 (the reason says so). `flags`: a CPU's flags (tests)."""
    if precision not in choices:
        raise ValueError(f"precision must be one of {', '.join(choices)}, got {precision!r}")
    if precision == "int8" and device.type != "cpu":
        raise ConfigError("--precision int8 runs on the CPU (PyTorch's quantized kernels); on a GPU use bf16")
    if device.type == "cuda":
        if precision != "auto":
            return precision, "asked for"
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16", "auto: this GPU computes bf16 natively"
        if "fp16" in choices:
            return "fp16", "auto: this GPU has no native bf16 (before Ampere); fp16 with dynamic loss scaling"
        return "fp32", "auto: this GPU has no native bf16"
    flags = cpu_flags() if flags is None else flags
    if precision == "int8":
        kernel = int8_kernel(flags)
        if kernel == "int_mm":
            return "int8", "asked for (VNNI: 8-bit rows, torch._int_mm)"
        if kernel == "fbgemm":
            return "int8", "asked for (AVX2 without VNNI: 7-bit rows, fbgemm's reduce-range kernel)"
        return "fp32", ("int8 refused: this CPU has no AVX2, without which PyTorch's int8 products are "
                        "slower than fp32; running fp32")
    if precision == "bf16":
        return "bf16", "asked for" + ("" if native_bf16(flags) else
                                      "; this CPU has no native bf16 (AVX-512 BF16 or AMX): emulated, "
                                      "several times slower than fp32 (8-10x per product on an AVX2 Zen 3)")
    if precision in ("fp32", "fp16"):
        return precision, "asked for" + ("; on a CPU fp16 is emulated, slower than fp32" if precision == "fp16" else "")
    native = native_bf16(flags)
    if native:
        return "bf16", f"auto: the CPU computes bf16 natively ({', '.join(native)})"
    return "fp32", "auto: the CPU has no native bf16 (AVX-512 BF16 or AMX)"


def pick_device(name: str | torch.device | None) -> torch.device:
    """The device to run on: CUDA when available unless named (the same rule for train, translate
    and serve); an unknown name or an absent accelerator is a ConfigError naming it."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {name!r}: not a device (use cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available here (torch {torch.__version__}, "
                          f"{'built without CUDA' if torch.version.cuda is None else 'no GPU visible'})")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name}: aiayn runs on cpu or cuda")
    return dev


def decode_batch_tokens(device: torch.device, asked: int | None = None) -> tuple[int, str]:
    """Source tokens per translation batch, and why: decode.max_tokens where set; else 16,384 on a GPU
    (on an H200 beam 4 ran 1.58x the sentences/s of 4,096, the same BLEU: bench/README.md, One GPU)
    and 4,096 on a CPU (the size its decoding benches were measured at)."""
    if asked:
        return asked, "decode.max_tokens"
    return (16384, "the default for a GPU; decode.max_tokens sets it") if device.type == "cuda" else (
        4096, "the default for a CPU; decode.max_tokens sets it")


def autocast(device: torch.device, precision: str):
    """bf16 (fp16) autocast for a bf16 (fp16) run, nothing for fp32 (`auto` resolved as resolve_precision does)."""
    if precision == "auto":
        precision = resolve_precision("auto", device, choices=TRAIN_PRECISIONS)[0]
    if precision in ("bf16", "fp16"):
        return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    return contextlib.nullcontext()


@functools.cache
def lstm_bf16() -> bool:
    """Whether this CPU's oneDNN has a bf16 LSTM (AVX2 processors have none: it raises); probed once
    on a tiny LSTM with the global random state left as it was (a resumed run replays it)."""
    with torch.random.fork_rng(devices=[]):
        lstm = torch.nn.LSTM(8, 8, batch_first=True)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lstm(torch.zeros(1, 2, 8))
        except RuntimeError:
            return False
    return True


def inductor_cache() -> None:
    """Under an ISA limit (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY), unless the user chose a cache,
    give TorchInductor a disk cache of that limit's own: its cache key does not include the limit,
    and kernels compiled on one side crashed compiled decoding on the other (a segfault in a cached
    kernel, seen with the AVX2 stand-in). Call before torch.compile."""
    limit = "-".join(os.environ[v].lower() for v in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
                     if os.environ.get(v))
    if limit and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        import getpass
        import tempfile

        user = "".join(c if c.isalnum() else "_" for c in getpass.getuser())
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}-{limit}")
        log.info("TorchInductor cache for %s: %s", limit, os.environ["TORCHINDUCTOR_CACHE_DIR"])


def huge_pages() -> None:
    """Ask PyTorch's CPU allocator for transparent huge pages on large tensors (THP_MEM_ALLOC_ENABLE),
    unless the user set the variable: every training step allocates the logits and their gradient
    anew (108 MB each for a 4,096-token batch of the `multi30k` model), and in 4 KB pages their first
    touch cost 70,000 page faults a step, 5 % of a step on the AVX2 stand-in (bench/README.md). The
    allocator reads it at the process's first large allocation; the arithmetic is unchanged."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
