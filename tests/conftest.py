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
