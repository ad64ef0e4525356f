"""§5: a run from the first step to the last checkpoint, resumed after a crash bit for bit.

Read first: session.py (`train`), then trainer.py (the loop), step.py (one update), loss.py (§5.4)
and optim.py (§5.3, Eq. 3).
"""

from ..doors import lazy

__all__ = ["label_smoothed_loss", "make_optimizer", "noam_lr", "train", "train_step", "validate"]
__getattr__, __dir__ = lazy(__name__, {
    "train": "session",
    "label_smoothed_loss": "loss",
    "make_optimizer": "optim",
    "noam_lr": "optim",
    "train_step": "step",
    "validate": "step",
})
