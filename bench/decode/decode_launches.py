"""How many kernels one decoding step launches: a GPU's eager step is launch-bound.

Counts the ATen operations that compute (views, which launch nothing, left out) in one `FusedDecoder`
step and in one step of beam search (the step plus the search's own bookkeeping), for each attention
route: the written-out products of Eq. 1 (a CPU's) and SDPA's one kernel (a GPU's, as the model's own
attention takes there), and SDPA's step replayed as one CUDA graph (`graphs`, decode/graphed.py: what
runs outside the graph, the graph's replay counted as one launch, its recording as the eager warm-up it
runs), and with it beam search's whole step as one graph (`graphed search`, what the translator runs
when graphs are on; the encoder, the first step and the looks at which sentences are done outside).
The counts come from PyTorch's dispatcher on the CPU, so any machine gives them; a CUDA run launches
about one kernel per counted operation. Random weights (the count does not
depend on their values), 3 sentences of 12 tokens, beam 4, 11 search steps. Prints a table and writes
bench/decode/decode_launches.json.

    .venv/bin/python bench/decode/decode_launches.py [--presets multi30k,base] [--out FILE]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiayn.decode.fast import FusedDecoder, StepOptions  # noqa: E402
from aiayn.decode.fast.graphed import Recorded, graphed_beam_search  # noqa: E402
from aiayn.decode.search import beam_search  # noqa: E402
from aiayn.models.build import build_model  # noqa: E402
from aiayn.models.precision import cast_bf16  # noqa: E402
from aiayn.overrides import preset

STEPS = 11  # max_len_b with max_len_a 0: every search runs this many steps


class Counted(TorchDispatchMode):
    """Every ATen operation dispatched inside, by name; `kernels` leaves the views out."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.kernels = 0
        self.replaying = False  # inside a graph's replay: one launch, counted by `replayed`

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.replaying:
            return func(*args, **(kwargs or {}))
        self.ops[func.overloadpacket.__name__] += 1
        self.kernels += not func.is_view and func.overloadpacket.__name__ != "_unsafe_view"
        return func(*args, **(kwargs or {}))


def replayed(counted: Counted):
    """A graph's replay (emulated on the CPU) counted as the one launch it is on a GPU."""
    def replay(graph: Recorded):
        counted.ops["graph replay"] += 1
        counted.kernels += 1
        counted.replaying = True
        try:
            return real(graph)
        finally:
            counted.replaying = False
    real = Recorded.replay
    Recorded.replay = replay
    return real


def count(name: str, dtype: torch.dtype, attention: str) -> dict:
    torch.manual_seed(0)
    model = build_model(preset(name).model).eval()
    options = StepOptions(sdpa=attention != "explicit", graphs=attention == "graphs")
    fused = FusedDecoder(cast_bf16(model) if dtype == torch.bfloat16 else model, dtype, options=options)
    src = torch.randint(4, model.cfg.vocab_size, (3, 12))
    state, tokens = fused.start_decoding(src, group=4), torch.full((12,), 5)
    for _ in range(3):  # past the first positions and any lazy set-up
        fused.decode_step(tokens, state)
    step, search, whole = Counted(), Counted(), Counted()
    runs = [(step, lambda: fused.decode_step(tokens, state)),
            (search, lambda: beam_search(fused, src, beam=4, max_len_a=0.0, max_len_b=STEPS - 1))]
    if attention == "graphs":  # the whole search step as one graph (what the translator runs with graphs on)
        runs.append((whole, lambda: graphed_beam_search(fused, src, beam=4, max_len_a=0.0, max_len_b=STEPS - 1)))
    for counted, run in runs:
        real = replayed(counted)
        try:
            with counted:
                run()
        finally:
            Recorded.replay = real
    graphed = {"graphed search kernels per step": round(whole.kernels / STEPS, 1)} if attention == "graphs" else {}
    return {"step kernels": step.kernels, "step ops": sum(step.ops.values()),
            "search kernels per step": round(search.kernels / STEPS, 1), **graphed,
            "step by op": dict(step.ops.most_common())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="multi30k,base")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("decode_launches.json"))
    args = ap.parse_args()
    from aiayn.errors import AiaynError
    names = args.presets.split(",")
    try:
        for name in names:  # every name checked before counting
            preset(name)
    except AiaynError as e:
        ap.error(str(e))
    rows = []
    print(f"{'model':10} {'precision':9} {'attention':9} {'step kernels':>12} {'search kernels/step':>20} "
          f"{'graphed search':>15}")
    for name in names:
        for dtype in (torch.bfloat16, torch.float32):
            for attention in ("explicit", "sdpa", "graphs"):
                r = {"preset": name, "precision": str(dtype).removeprefix("torch."),
                     "attention": attention, **count(name, dtype, attention)}
                rows.append(r)
                print(f"{name:10} {r['precision']:9} {r['attention']:9} {r['step kernels']:>12} "
                      f"{r['search kernels per step']:>20} {r.get('graphed search kernels per step', ''):>15}")
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "torch": torch.__version__, "rows": rows},
                                   indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
