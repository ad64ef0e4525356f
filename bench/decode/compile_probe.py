"""Where the compiled decoding step's time goes: its compiling, graph by graph, then
eager against compiled beam search on real sentences.

An H200's `--decode-only` run (2026-11-28) spent over 360 s in the compiled step's first use and was
cut before it timed anything. This probe needs no trained model (compiling and the step's cost do not
depend on the weights' values; a model of random weights translates every sentence to the search's
limit, a·S + b subwords, so the limit sets the lengths: by default b is 0, each output as long as its
source, as a trained model's roughly are, where the preset's +50 would make every batch's sentences
nearly one length and hide what shrinking a batch saves; `--set decode.max_len_b=50` restores it): it
builds the preset's model, compiles the step with `compile_now`, notes each graph dynamo compiles and
when (TORCH_LOGS=recompiles prints why), then times beam 4, α 0.6 over
the first sentences of test2016, eager and compiled alternately, eager through the other attention
route (SDPA's kernel or the written-out products: a GPU's eager step takes SDPA, a CPU's the products),
and SDPA's eager step replayed as one CUDA graph a step (decode/graphed.py; emulated on a CPU, where it
is only checked), shrinking to the open sentences at half the batch and kept whole (`shrink_speedup`),
with how many of its translations equal eager's. What it has is written after every stage.

    python bench/decode/compile_probe.py --data DIR --device cuda --out probe.json [--preset base] [--sentences 64]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def graphs() -> int:
    """Dynamo's count of the graphs it compiled in this process."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def override(text: str) -> tuple[str, str]:
    """One --set item, SECTION.FIELD=VALUE (the config checks the names and the value)."""
    key, eq, value = text.partition("=")
    if not eq or "." not in key:
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected SECTION.FIELD=VALUE, e.g. model.N=1")
    return key, value


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parse_args() -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a prepared directory (spm.model, the test sentences)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--set", nargs="*", default=[], type=override,
                    help="config overrides, e.g. model.N=1 (a quick CPU try)")
    ap.add_argument("--test", default="test_2016_flickr", help="the sentences: DATA/NAME.en.txt")
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(), ap


ROUTES = {True: "sdpa", False: "explicit"}


def probe_config(name: str, sets: list[tuple[str, str]]):
    """The preset with the --set overrides, outputs as long as their sources unless they say otherwise
    (decode.max_len_b 0: the module's docstring says why)."""
    from aiayn.overrides import apply_overrides, preset

    return apply_overrides(preset(name), {"decode.max_len_b": "0", **dict(sets)})


def translators(cfg, tok, device: torch.device) -> dict:
    """The systems timed, one model of random weights: eager (the device's attention route), eager
    through the other route, SDPA's step as one CUDA graph a step (shrinking, and kept whole), compiled."""
    from aiayn.decode.fast import StepOptions
    from aiayn.decode.translator import Translator
    from aiayn.models.build import build_model

    torch.manual_seed(1)
    model = build_model(cfg.model).to(device).eval()
    precision = "bf16" if device.type == "cuda" else "fp32"
    eager = Translator(model, tok, cfg.decode, device, precision)
    # eager through the other attention route: a GPU's is SDPA, a CPU's the written-out products
    other = Translator(model, tok, cfg.decode, device, precision, options=StepOptions(sdpa=not eager.search_model.sdpa))
    # SDPA's step replayed as a CUDA graph; the same, each batch's graph never shrunk
    graphed = Translator(model, tok, cfg.decode, device, precision, options=StepOptions(sdpa=True, graphs=True))
    whole = Translator(model, tok, cfg.decode, device, precision,
                       options=StepOptions(sdpa=True, graphs=True, shrink=0.0))
    return {"eager": eager, f"eager {ROUTES[other.search_model.sdpa]}": other, "eager graphs": graphed,
            "eager graphs whole": whole, "compiled": Translator(model, tok, cfg.decode, device, precision,
                                                                compiled=True)}


def first_batches(systems: dict, src: list[str], stage, device: torch.device) -> None:
    """Each system's first use of the real batch (any graph compile_now did not make compiles here);
    a system whose first use fails (a CUDA graph's capture) is dropped with the reason."""
    first = {}
    for name, t in list(systems.items()):
        start = time.perf_counter()
        try:
            first[name] = t.translate(src, beam=4, alpha=0.6)
        except RuntimeError as e:  # a CUDA graph's capture can fail where the eager step runs: say so, go on
            stage(f"first {name} batch", failed=str(e)[:500])
            del systems[name]
            continue
        sync(device)
        same = {"same_as_eager": sum(a == b for a, b in zip(first[name], first["eager"]))} if name != "eager" else {}
        stage(f"first {name} batch", seconds=round(time.perf_counter() - start, 2), **same)


def timed_rounds(systems: dict, src: list[str], rounds: int, stage, device: torch.device) -> None:
    """Alternating rounds of every system; after each, the medians' ratios (> 1: the first named is slower)."""
    seconds: dict = {k: [] for k in systems}
    eager_sdpa = systems["eager"].search_model.sdpa
    for r in range(rounds):
        for name, t in systems.items():
            sync(device)
            start = time.perf_counter()
            t.translate(src, beam=4, alpha=0.6)
            sync(device)
            seconds[name].append(round(time.perf_counter() - start, 3))
        med = {k: statistics.median(v) for k, v in seconds.items()}
        sdpa, explicit = (med["eager"], med["eager explicit"]) if eager_sdpa else (med["eager sdpa"], med["eager"])
        stage(f"round {r + 1}", seconds=seconds, compiled_over_eager=round(med["eager"] / med["compiled"], 3),
              sdpa_speedup=round(explicit / sdpa, 3),  # > 1: SDPA's route is the faster
              graphs_speedup=round(sdpa / med["eager graphs"], 3) if "eager graphs" in med else None,  # > 1: faster
              shrink_speedup=round(med["eager graphs whole"] / med["eager graphs"], 3)  # > 1: shrinking pays
              if {"eager graphs", "eager graphs whole"} <= med.keys() else None)


def main() -> int:
    args, ap = parse_args()
    from aiayn.data.tokenizer import load_tokenizer
    from aiayn.errors import AiaynError

    began, out = time.time(), {"command": " ".join(sys.argv), "torch": torch.__version__, "stages": []}

    def stage(name: str, **facts) -> None:
        out["stages"].append({"name": name, "at_s": round(time.time() - began, 1), "graphs": graphs(), **facts})
        args.out.write_text(json.dumps(out, indent=1))
        print(f"[{time.strftime('%H:%M:%S')}] {json.dumps(out['stages'][-1])}", flush=True)

    device = torch.device(args.device)
    try:
        cfg = probe_config(args.preset, args.set)
        tok = load_tokenizer(str(args.data / "spm.model"))
        src = (args.data / f"{args.test}.en.txt").read_text(encoding="utf-8").splitlines()[:args.sentences]
    except (AiaynError, OSError) as e:
        ap.error(str(e))
    cfg.model.vocab_size = len(tok)
    systems = translators(cfg, tok, device)
    stage("built", device=str(device), gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
          eager=ROUTES[systems["eager"].search_model.sdpa], max_len=[cfg.decode.max_len_a, cfg.decode.max_len_b])
    stage("compile_now", seconds=round(systems["compiled"].compile_now(), 1))
    first_batches(systems, src, stage, device)
    timed_rounds(systems, src, args.rounds, stage, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
