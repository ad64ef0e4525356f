import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

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
    from aiayn.data import prepare

    out = tmp_path_factory.mktemp("toy_prepared")
    splits = {name: (toy_corpus / f"{name}.en", toy_corpus / f"{name}.de") for name in ("train", "valid", "test")}
    prepare(splits, out, "en", "de", vocab_size=60, max_len=32)
    return out


def tiny_config(**train):
    from aiayn.config import Config

    cfg = Config()
    m = cfg.model
    m.d_model, m.d_ff, m.h, m.N, m.p_drop, m.max_positions = 32, 64, 4, 2, 0.1, 128
    cfg.data.max_tokens = 400
    t = cfg.train
    t.warmup_steps, t.lr_scale, t.valid_every, t.valid_bleu_sentences = 20, 1.0, 0, 0
    t.save_every_minutes, t.log_every, t.threads = 0.0, 5, 1
    t.tokens_per_update = 0  # one small batch per update (the paper's 25k tokens would be an epoch here)
    cfg.decode.max_len_b = 12
    for k, v in train.items():
        setattr(t, k, v)
    return cfg


def overfit(model, vocab_size: int, steps: int, lr: float):
    """Train `model` on 4 random pairs with Adam; returns (final loss per token, src, tgt with BOS/EOS)."""
    from aiayn.loss import label_smoothed_loss

    src = torch.randint(4, vocab_size, (4, 6))
    tgt = torch.cat([torch.full((4, 1), 2), torch.randint(4, vocab_size, (4, 5)), torch.full((4, 1), 3)], 1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss, _, n = label_smoothed_loss(model(src, tgt[:, :-1]), tgt[:, 1:], 0.0, 0)
        opt.zero_grad()
        (loss / n).backward()
        opt.step()
    return (loss / n).item(), src, tgt
