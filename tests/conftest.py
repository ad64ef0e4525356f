import os
import sys
from pathlib import Path

import pytest
import torch

from aiayn.device import int8_kernel, int8_products

# one process's share of the cores: xdist's workers side by side must not oversubscribe them (OpenMP
# threads that wait spin, and a 5-second test took 55 s beside the other worker's busy test)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))
# and the processes the tests start get the same share (aiayn, PyTorch and OpenMP read it): two workers'
# children at two threads each on two cores spin at every barrier (the quick suite took 115 s, 52 s alone)
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
# inductor's on-disk cache does not key on oneDNN's ISA limit: kernels compiled without
# ONEDNN_MAX_CPU_ISA crashed compiled decoding run under it (the AVX2 stand-in), so each limit gets its own
if os.environ.get("ONEDNN_MAX_CPU_ISA") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor-aiayn-tests-{os.environ['ONEDNN_MAX_CPU_ISA'].lower()}")

# int8 decoding needs AVX2 (device.int8_kernel: VNNI's torch._int_mm, else fbgemm's 7-bit rows);
# without it aiayn refuses int8, so the int8 tests are skipped. torch._int_mm itself needs VNNI: without
# it oneDNN's product saturates (under ONEDNN_MAX_CPU_ISA=AVX2), so its own tests need VNNI.
requires_int8 = pytest.mark.skipif(not int8_kernel(), reason="int8 decoding needs AVX2, which this CPU lacks: "
                                   "aiayn refuses int8 here")
requires_vnni = pytest.mark.skipif(not int8_products(), reason="torch._int_mm needs VNNI (AVX-512 VNNI or "
                                   "AVX-VNNI), which this CPU lacks (or ONEDNN_MAX_CPU_ISA bars): aiayn takes fbgemm's "
                                   "kernel here")

def pytest_collection_modifyitems(items: list) -> None:
    """The modules with the most end-to-end (`slow`) tests first, each module's tests in their order:
    xdist hands whole modules to its workers in this order, and a heavy module taken last (training/
    sorts last) kept one worker busy minutes after the other had finished."""
    def module(item) -> str:
        return item.nodeid.split("::")[0]

    slow: dict[str, int] = {}
    for item in items:
        slow[module(item)] = slow.get(module(item), 0) + (item.get_closest_marker("slow") is not None)
    order = {name: i for i, name in enumerate(slow)}
    items.sort(key=lambda item: (-slow[module(item)], order[module(item)]))


# Multi30k lives beside the repository (../shared/data/multi30k); AIAYN_DATA overrides it.
DATA_DIR = Path(os.environ.get("AIAYN_DATA", Path(__file__).resolve().parents[2] / "shared/data/multi30k"))


@pytest.fixture
def multi30k_dir() -> Path:
    if not (DATA_DIR / "train.en.gz").exists():
        pytest.skip(f"Multi30k not found at {DATA_DIR} (set AIAYN_DATA)")
    return DATA_DIR


def _sentences(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """A toy parallel corpus with a learnable word-by-word mapping."""
    import random

    rng = random.Random(seed)
    en = "the a dog cat man woman runs sits big small red blue house street park near".split()
    de = "der ein hund katze mann frau läuft sitzt großer kleiner roter blauer haus straße park nahe".split()
    src, tgt = [], []
    for _ in range(n):
        idx = [rng.randrange(len(en)) for _ in range(rng.randint(3, 9))]
        src.append(" ".join(en[i] for i in idx))
        tgt.append(" ".join(de[i] for i in idx))
    return src, tgt


@pytest.fixture(scope="session")
def toy_corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("toy")
    for split, n, seed in (("train", 400, 0), ("valid", 20, 1), ("test", 20, 2)):
        s, t = _sentences(n, seed)
        (d / f"{split}.en").write_text("".join(x + "\n" for x in s))
        (d / f"{split}.de").write_text("".join(x + "\n" for x in t))
    return d


@pytest.fixture(scope="session")
def toy_prepared(toy_corpus, tmp_path_factory) -> Path:
    from aiayn.data.prepare import prepare

    out = tmp_path_factory.mktemp("toy_prepared")
    splits = {name: (toy_corpus / f"{name}.en", toy_corpus / f"{name}.de") for name in ("train", "valid", "test")}
    prepare(splits, out, "en", "de", vocab_size=60, max_len=32)
    return out


FR = {"der": "le", "ein": "un", "hund": "chien", "katze": "chat", "mann": "homme", "frau": "femme",
      "läuft": "court", "sitzt": "assis", "großer": "grand", "kleiner": "petit", "roter": "rouge",
      "blauer": "bleu", "haus": "maison", "straße": "rue", "park": "parc", "nahe": "près"}


def toy_multilingual(toy_corpus: Path, folder: Path) -> Path:
    """The toy corpus's en and de, and a French side word for word from the German."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            (folder / f"{split}.{lang}").write_text((toy_corpus / f"{split}.{lang}").read_text())
        de = (toy_corpus / f"{split}.de").read_text().splitlines()
        (folder / f"{split}.fr").write_text("".join(" ".join(FR[w] for w in line.split()) + "\n" for line in de))
    return folder


def random_translator(spm: Path, max_len_b: int = 12, seed: int = 0):
    """An untrained Transformer (d_model 32, 2 layers) on a prepared vocabulary, decoding in fp32."""
    from aiayn.config import DecodeConfig, ModelConfig
    from aiayn.data.tokenizer import load_tokenizer
    from aiayn.decode.translator import Translator
    from aiayn.models.transformer import Transformer

    tok = load_tokenizer(str(spm))
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=len(tok), d_model=32, d_ff=64, h=4, N=2, p_drop=0.0, max_positions=64)
    return Translator(Transformer(cfg).eval(), tok, DecodeConfig(max_len_b=max_len_b), precision="fp32")


def save_translator(translator, path: Path, **extra) -> Path:
    """`translator`'s model as a checkpoint (its config and vocabulary, `extra` in its metadata)."""
    from aiayn.checkpoint import model_tensors, save_weights
    from aiayn.config import Config

    cfg = Config()
    cfg.model, cfg.decode = translator.model.cfg, translator.decode_cfg
    save_weights(path, model_tensors(translator.model), cfg, translator.tokenizer, 0, extra)
    return path


def tiny_config(**train):
    from aiayn.config import Config

    cfg = Config()
    m = cfg.model
    m.d_model, m.d_ff, m.h, m.N, m.p_drop, m.max_positions = 32, 64, 4, 2, 0.1, 128
    cfg.data.max_tokens = 400
    t = cfg.train
    t.warmup_steps, t.lr_scale, t.valid_every, t.valid_bleu_sentences = 20, 1.0, 0, 0
    t.save_every_minutes, t.log_every, t.threads = 0.0, 5, 1
    t.precision = "fp32"  # the same numbers on every CPU class (auto would be bf16 on some)
    t.tokens_per_update = 0  # one small batch per update (the paper's 25k tokens would be an epoch here)
    cfg.decode.max_len_b = 12
    for k, v in train.items():
        setattr(t, k, v)
    return cfg


def overfit(model, vocab_size: int, steps: int, lr: float):
    """Train `model` on 4 random pairs with Adam; returns (final loss per token, src, tgt with BOS/EOS)."""
    from aiayn.training.loss import label_smoothed_loss

    src = torch.randint(4, vocab_size, (4, 6))
    tgt = torch.cat([torch.full((4, 1), 2), torch.randint(4, vocab_size, (4, 5)), torch.full((4, 1), 3)], 1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss, _, n = label_smoothed_loss(model(src, tgt[:, :-1]), tgt[:, 1:], 0.0, 0)
        opt.zero_grad()
        (loss / n).backward()
        opt.step()
    return (loss / n).item(), src, tgt


def check_baseline_toolkit(ckpt, toy_prepared, tmp_path, capsys, maps: tuple[str, ...]) -> None:
    """A baseline checkpoint through the toolkit: translate CLI (BLEU above an untrained model's),
    batch == one by one, attention plots (`maps`), and export refused with a clear message."""
    import sacrebleu

    from aiayn.cli import main
    from aiayn.decode.translator import Translator

    src = (toy_prepared / "valid.en.txt").read_text().splitlines()
    ref = (toy_prepared / "valid.de.txt").read_text().splitlines()
    out = tmp_path / "hyp.txt"
    # fp32: the recurrent model's bf16 batches are not yet equal to one by one (rounding in the
    # padded, packed encoder); the Transformer's are (tests/decode/test_translator.py)
    assert main(["translate", "--checkpoint", str(ckpt), "--input", str(toy_prepared / "valid.en.txt"),
                 "--output", str(out), "--ref", str(toy_prepared / "valid.de.txt"), "--precision", "fp32"]) == 0
    hyps = out.read_text().splitlines()
    assert sacrebleu.corpus_bleu(hyps, [ref]).score > 10  # an untrained model scores about 0
    t = Translator.load(ckpt, precision="fp32")
    assert t.translate(src) == hyps
    assert t.translate(src) == [t.translate([s])[0] for s in src]  # batch == one by one
    assert main(["plot", "attention", "--checkpoint", str(ckpt), "--src", src[0], "-o", str(tmp_path / "att")]) == 0
    for name in maps:
        assert (tmp_path / "att" / f"{name}.png").exists(), name
    assert main(["export", "hf", "--checkpoint", str(ckpt), "-o", str(tmp_path / "hf")]) == 2
    assert "only the Transformer can be exported" in capsys.readouterr().err


def check_serves(ckpt) -> None:
    """The server translates as the Translator does and returns a cross-attention whose rows sum to 1."""
    from fastapi.testclient import TestClient

    from aiayn.decode.translator import Translator
    from aiayn.serve.app import create_app

    t = Translator.load(ckpt)
    with TestClient(create_app(t)) as client:
        r = client.post("/translate", json={"sentences": ["the big dog"]})
        assert r.status_code == 200 and r.json()["translations"] == t.translate(["the big dog"])
        check_attention_body(client.post("/attention", json={"sentence": "the big dog"}))


def check_attention_body(r) -> None:
    """/attention's answer: a row per output token, a column per source token, each row sums to 1."""
    assert r.status_code == 200
    body = r.json()
    w = body["weights"]
    assert len(w) == len(body["target_tokens"]) and all(len(row) == len(body["source_tokens"]) for row in w)
    assert all(abs(sum(row) - 1) < 1e-4 for row in w)


def check_cached_steps_and_padding(m, vocab: int = 23, atol: float = 1e-5) -> None:
    """An incremental decoder's cached steps equal its teacher-forced forward (with a padded
    source in the batch), and right-padding a source changes nothing."""
    src = torch.randint(4, vocab, (3, 7))
    src[1, 4:] = 0
    tgt = torch.randint(4, vocab, (3, 6))
    cache = m.start_decoding(src)
    steps = torch.stack([m.decode_step(tgt[:, t], cache) for t in range(6)], 1)
    assert torch.allclose(m(src, tgt), steps, atol=atol)
    one = src[:1, :5]
    padded = torch.cat([one, torch.zeros(1, 3, dtype=torch.long)], 1)
    assert torch.allclose(m(one, tgt[:1]), m(padded, tgt[:1]), atol=atol)


def check_overfits(m, steps: int) -> None:
    """A tiny model learns 4 random pairs by heart, and the one beam search finds them."""
    from aiayn.decode.search import beam_search

    loss, src, tgt = overfit(m.train(), 20, steps, 1e-2)
    assert loss < 0.05
    assert torch.equal(m.eval()(src, tgt[:, :-1]).argmax(-1), tgt[:, 1:])
    hyps = beam_search(m, src, beam=4, max_len_b=8)
    assert [h[0].tokens for h in hyps] == tgt[:, 1:-1].tolist()


def check_grouped_cache(m, vocab: int = 23) -> None:
    """Beam search's grouped cache (one encoding per source, g rows) decodes as g copies of the
    source would, through a reorder within the sentences and the drop of a finished sentence."""
    src = torch.randint(4, vocab, (2, 6))
    toks = [torch.randint(4, vocab, (6,)) for _ in range(3)]
    grouped = m.start_decoding(src, group=3)
    single = m.start_decoding(src.repeat_interleave(3, 0))
    for tok in toks[:2]:
        assert torch.allclose(m.decode_step(tok, grouped), m.decode_step(tok, single), atol=1e-6)
    rows = torch.tensor([2, 2, 0, 4, 3, 5])  # beams move within their sentence
    grouped.reorder(rows)
    single.reorder(rows, rows)
    assert torch.allclose(m.decode_step(toks[2], grouped), m.decode_step(toks[2], single), atol=1e-6)
    grouped.reorder(torch.tensor([3, 4, 5]), torch.tensor([1]))  # sentence 0 finished
    single.reorder(torch.tensor([3, 4, 5]), torch.tensor([3, 4, 5]))
    assert torch.allclose(m.decode_step(toks[0][3:], grouped), m.decode_step(toks[0][3:], single), atol=1e-6)


# -- shared by the tests that run aiayn in another process -----------------------------------------
STEPS = 40
TINY = ["--model.d_model", "32", "--model.d_ff", "64", "--model.h", "4", "--model.N", "2", "--model.p_drop", "0.1",
        "--model.max_positions", "128", "--data.max_tokens", "400", "--train.warmup_steps", "20",
        "--train.lr_scale", "0.5", "--train.valid_every", "0", "--train.valid_bleu_sentences", "0",
        "--train.save_every_minutes", "0", "--train.save_every", "5", "--train.log_every", "4",
        "--train.threads", "1", "--train.tokens_per_update", "0", "--train.max_steps", str(STEPS)]


def aiayn(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *args]


def tiny_treebank(folder: Path) -> Path:
    trees = ["( (S (NP-SBJ (DT The) (NN dog)) (VP (VBZ runs)) (. .)) )",
             "( (S (NP-SBJ (DT A) (NN cat)) (VP (VBZ sits) (PP (IN on) (NP (DT the) (NN mat)))) (. .)) )",
             "( (S (NP-SBJ (NNP Bob)) (VP (VBD saw) (NP (DT a) (NN dog))) (. .)) )"]
    for name, reps in (("wsj_0001.mrg", 30), ("wsj_0002.mrg", 30), ("wsj_0165.mrg", 1), ("wsj_0190.mrg", 1)):
        (folder / name).write_text("\n".join(trees * reps) + "\n")
    return folder


def kill_after_parts(cmd: list[str], parts: Path, n: int = 3) -> int:
    """Start `cmd` in a new process, SIGKILL it once `parts` (a resumable output's OUTPUT.parts/) holds
    n finished chunks, and return how many it holds then."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(list(parts.glob("[0-9]*.json"))) < n:
        assert proc.poll() is None and time.time() < deadline, "the command ended before the kill"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return len(list(parts.glob("[0-9]*.json")))
