"""One update and one validation (§5): the batches of an epoch and a rank's share of them, the
label-smoothed loss normalized by the update's target tokens, validation loss, perplexity and BLEU."""

from __future__ import annotations

import contextlib
import logging
import math

import numpy as np
import sacrebleu
import torch
import torch.distributed as dist
from torch import nn

from ..config import Config
from ..data.batches import Batch, TokenData, bucket_length, collate, make_batches
from ..data.directions import epoch_pool
from ..data.mixing import corpus_pool
from ..data.tokenizer import Tokenizer
from ..decode.translator import Translator
from ..device import autocast
from . import guided
from .loss import label_smoothed_loss, smoothed_sums
from .optim import set_lr
from .processes import Dist
from .scaling import LossScaler

log = logging.getLogger("aiayn")


# -- one update ----------------------------------------------------------------------------
def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list[tuple[Batch, float]],
               total_tokens: int, cfg: Config, lr: float, world: int, device: torch.device,
               scaler: LossScaler | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer update from this rank's micro-batches, each with a weight (0 for a stand-in
    batch that only keeps DDP's collective calls in step). The loss is the label-smoothed sum
    divided by the update's global target-token count; `scaler` scales it in fp16 (scaling.py).
    Returns (loss sum, NLL sum) of this rank as float64 tensors on the device: reading them
    (float()) waits for the GPU, so the trainer reads them only when it logs."""
    model.train()
    scaler = scaler or LossScaler(device, "fp32")
    loss_total = nll_total = torch.zeros((), dtype=torch.float64, device=device)
    align_layer = guided.layer(cfg)  # None: the paper's loss alone
    for j, (batch, weight) in enumerate(batches):
        batch = batch.to(device)
        if bucketed(cfg):
            bucketed_shapes(batch.inputs())
        sync = j == len(batches) - 1 or not isinstance(model, nn.parallel.DistributedDataParallel)
        with (contextlib.nullcontext() if sync else model.no_sync()):
            with autocast(device, cfg.train.precision):
                out = model(*batch.inputs()) if align_layer is None else model(*batch.inputs(), align_layer=align_layer)
            logits, attention = (out, None) if align_layer is None else out
            loss, nll = smoothed_sums(logits, batch.tgt_out, cfg.train.label_smoothing, cfg.model.pad_id,
                                      reuse_logits=True, fused=cfg.train.fused_loss)
            del logits, out  # its storage now holds its gradient
            total = loss if attention is None else loss + cfg.train.guided_alignment * guided.alignment_loss(
                attention[:, cfg.train.guided_head], batch.align)
            # DDP averages gradients over ranks; scaling by world makes that a global-token mean.
            scaler.scale(total * (weight * world / total_tokens)).backward()
        loss_total = loss_total + weight * loss.detach().double()
        nll_total = nll_total + weight * nll.double()
    set_lr(optimizer, lr)
    scaler.step(model, optimizer, cfg.train.clip_norm)
    optimizer.zero_grad(set_to_none=True)
    return loss_total, nll_total


def compile_model(model: nn.Module) -> nn.Module:
    """`train.compile`: the model under torch.compile, with room for one graph per length of the
    bucket ladder (train.compile_buckets; data.batches.bucket_length: 21 up to 256 subwords)."""
    limit = 2 * len({bucket_length(n) for n in range(1, 1025)})  # 29 lengths up to 1,024, and room
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, limit)
    return torch.compile(model)


def bucketed(cfg: Config) -> bool:
    """Whether batches are padded to the bucket ladder: `train.compile` with `train.compile_buckets`."""
    return cfg.train.compile and cfg.train.compile_buckets


def bucketed_shapes(inputs: tuple[torch.Tensor, ...]) -> None:
    """Tell torch.compile what varies in bucketed batches: the sentences in a batch (dynamic), not
    their padded length (static, one of the ladder's): one specialized graph per length, whatever
    the batch size, instead of one graph generic in every dimension."""
    for x in inputs:
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_static(x, 1)


def epoch_batches(data: TokenData, cfg: Config, epoch: int) -> list[np.ndarray]:
    """The epoch's batches in training order; they depend only on (seed, epoch, max_tokens, data);
    many directions are mixed at data.mix_temperature (data/directions.epoch_pool), weighted corpora by
    their weights (data/mixing.corpus_pool)."""
    pool = None if data.directions is None else epoch_pool(data.directions, cfg.data.mix_temperature,
                                                           cfg.train.seed, epoch)
    if data.corpora is not None:
        pool = corpus_pool(*data.corpora, cfg.train.seed, epoch)
    return make_batches(data.src_lens, data.tgt_lens, cfg.data.max_tokens, cfg.train.seed, epoch, pool)


def shard(group: list[np.ndarray], rank: int, world: int) -> list[tuple[np.ndarray, float]]:
    """This rank's batches of an update (strided), with weight 1. Ranks left short get the
    group's first batch with weight 0, so every rank runs as many forward/backward passes."""
    per_rank = math.ceil(len(group) / world)
    mine = [(b, 1.0) for b in group[rank::world]]
    return mine + [(group[0], 0.0)] * (per_rank - len(mine))


# -- validation ----------------------------------------------------------------------------
@torch.no_grad()
def validate(model: nn.Module, data: TokenData, cfg: Config, device: torch.device, env: Dist | None = None
             ) -> dict[str, float]:
    """Label-smoothed loss, NLL per token and perplexity on the validation split; under DDP each
    rank takes every world-th batch and the sums are all-reduced (collective)."""
    env = env or Dist(device=device)
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)  # loss, NLL, tokens
    for idx in make_batches(data.src_lens, data.tgt_lens, cfg.data.max_tokens, 0, 0)[env.rank::env.world]:
        b = collate(data, idx).to(device)
        with autocast(device, cfg.train.precision):
            logits = model(*b.inputs())
        loss, nll, k = label_smoothed_loss(logits, b.tgt_out, cfg.train.label_smoothing, cfg.model.pad_id)
        sums += torch.tensor([loss.item(), nll.item(), k], dtype=torch.float64)
    if env.world > 1:
        sums = sums.to(device)
        dist.all_reduce(sums)
    loss_sum, nll_sum, n = sums.tolist()
    return {"valid_loss": loss_sum / n, "valid_nll": nll_sum / n, "valid_ppl": math.exp(min(nll_sum / n, 50))}


def valid_bleu(model: nn.Module, tokenizer: Tokenizer, src: list[str], ref: list[str], cfg: Config,
               device: torch.device, env: Dist | None = None) -> float:
    """Greedy-search sacreBLEU on validation sentences (cheap enough to run during training);
    under DDP each rank translates every world-th sentence and all gather the translations."""
    env = env or Dist(device=device)
    precision = "auto" if cfg.train.precision == "fp16" else cfg.train.precision  # decoding has no fp16
    mine = Translator(model, tokenizer, cfg.decode, device, precision, quiet=True).translate(
        src[env.rank::env.world], beam=1)
    shares: list = [mine]
    if env.world > 1:
        shares = [None] * env.world
        dist.all_gather_object(shares, mine)
    hyps = [""] * len(src)
    for rank, share in enumerate(shares):
        hyps[rank::env.world] = share
    return sacrebleu.corpus_bleu(hyps, [ref]).score
