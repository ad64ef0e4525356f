"""What /health says: the worker's state ("ok", "degraded" with its reason, "worker stopped"), the
queue, the connections, the limits in force, and the model or models served."""

from __future__ import annotations

from ..decode.translator import Translator
from .batcher import Batcher
from .edge import ConnectionCount, Limits
from .pool import ModelPool


def _state(batcher: Batcher, limits: Limits, connections: ConnectionCount | None) -> dict:
    """/health's status ("degraded" while a job is older than the request time limit or the
    connection table is full), its reason, the queue and the open connections."""
    oldest = batcher.oldest_s()
    full = connections is not None and connections.full()
    status = ("worker stopped" if not batcher.worker.is_alive() else
              "degraded" if oldest > limits.timeout_s or full else "ok")
    reason = ("the worker has stopped" if status == "worker stopped" else
              f"a job has waited {oldest:.1f} s, over the {limits.timeout_s:g} s limit" if oldest > limits.timeout_s
              else f"the connection table is full ({connections.open} of {connections.limit}): new requests are "
                   "refused with 503" if full else None)
    return {"status": status, "reason": reason,
            "queue": {"sentences": batcher.queued, "limit": limits.max_queue, "work": batcher.work,
                      "work_limit": limits.max_work, "client_work_limit": batcher.client_work,
                      "oldest_s": round(oldest, 3)},
            "connections": None if connections is None else connections.open}


def health_report(translator: Translator, batcher: Batcher, limits: Limits, max_subwords: int,
                  attention_subwords: int, connections: ConnectionCount | None = None) -> dict:
    """/health: the worker, the queue, the open connections (`_state`), the limits in force, the
    model and its decoding settings."""
    cfg, d = translator.model.cfg, translator.decode_cfg
    return {**_state(batcher, limits, connections),
            "limits": {"max_sentences": limits.max_sentences, "max_chars": limits.max_chars,
                       "max_subwords": max_subwords, "max_beam": limits.max_beam,
                       "max_attention_subwords": attention_subwords},
            "model": {"d_model": cfg.d_model, "N": cfg.N, "h": cfg.h, "vocab_size": cfg.vocab_size,
                      "parameters": sum(p.numel() for p in translator.model.parameters()),
                      "languages": None if translator.languages is None else
                      {"src": translator.languages[0], "tgt": translator.languages[1]},
                      "target_languages": translator.target_languages(), "directions": translator.directions},
            "decode": {"beam": d.beam, "alpha": d.alpha, "max_len_b": d.max_len_b,
                       "shortlist": translator.shortlist is not None}}


def pool_report(pool: ModelPool, batcher: Batcher, limits: Limits, connections: ConnectionCount | None = None
                ) -> dict:
    """/health of a server of many models: `_state`, the limits, every model with its directions and
    whether it is loaded, and the memory bound on the loaded ones."""
    return {**_state(batcher, limits, connections),
            "limits": {"max_sentences": limits.max_sentences, "max_chars": limits.max_chars,
                       "max_subwords": limits.max_subwords or None, "max_beam": limits.max_beam,
                       "max_attention_subwords": limits.max_attention_subwords},
            "model": None, "directions": pool.served_directions(), "models": pool.report(),
            "loaded_mb_limit": round(pool.max_bytes / 2**20, 1) if pool.max_bytes else None}
