"""bench/gpu.py's CPU dry run (`--device cpu --tiny`): every section of the GPU bench runs end to end
in its own process — training throughput beside HF Marian, the paper-budget projection, bf16 and fp16
runs of the CLI, the torchrun SIGKILL-resume, decoding beside CTranslate2 — so the GPU run is one command."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu.py"


@pytest.mark.slow
def test_gpu_bench_dry_run_on_the_cpu(toy_prepared, tmp_path):
    out = tmp_path / "gpu_cpu.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--skip-compile", "--data",
                          str(toy_prepared), "--test", "test", "--out", str(out), "--work", str(tmp_path / "work"),
                          "--decode-rounds", "1"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert not [k for k, v in r.items() if isinstance(v, dict) and ("error" in v or "skipped" in v)], r
    for name in ("base", "big"):
        rows = r["training"][name]
        assert set(rows) == {"aiayn eager (fp32 logits, the preset)", "aiayn eager", "HF Marian eager"}
        assert all(x["tgt_tok_s"] > 0 and 400 < x["tgt_tokens_per_update"] < 650 for x in rows.values())
        best = max(v["tgt_tok_s"] for k, v in rows.items() if k.startswith("aiayn"))
        projected = r["paper_budget_projection"][name]
        assert projected["hours"] == pytest.approx(projected["updates"] * 25_000 / best / 3600, rel=1e-3)
    learning = {k: v for k, v in r["learning"].items() if k != "section_s"}
    assert set(learning) == {"multi30k-bf16-s1", "multi30k-bf16-s2", "multi30k-fp16-s1", "multi30k-fp16-s2",
                             "base-multi30k"}
    assert all(v["returncode"] == 0 and v["validations"] for v in learning.values())
    p = r["fp16_vs_bf16"]
    assert p["fp16_minus_bf16"] == pytest.approx(sum(p["valid_nll"]["fp16"]) / 2 - sum(p["valid_nll"]["bf16"]) / 2)
    assert r["torchrun_resume"]["bit_identical"] is True and r["torchrun_resume"]["killed_after_checkpoints"] >= 2
    dec = r["decoding"]
    assert dec["sentences"] == 20 and dec["aiayn fp32"]["sent_s"] > 0 and "bleu" in dec["aiayn fp32"]
    assert {"CTranslate2 float32", "CTranslate2 int8"} <= set(dec)  # measured, or skipped with the reason
    assert "| base | aiayn eager |" in res.stdout
