import math
import os
import re

import pytest

from aiayn.config import Config, ConfigError
from aiayn.overrides import apply_overrides, load_yaml, preset
from aiayn.presets import PRESETS


def test_yaml_round_trip(tmp_path):
    cfg = preset("big")
    cfg.train.adam_betas = (0.9, 0.997)
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    back = load_yaml(tmp_path / "c.yaml")
    assert back == cfg


def test_presets_follow_table3():
    assert preset("base").model.d_model == 512 and preset("base").model.head_dim_k == 64
    big = preset("big").model
    assert (big.d_model, big.d_ff, big.h, big.p_drop) == (1024, 4096, 16, 0.3)
    a1 = preset("table3-A-h1").model
    assert a1.h * a1.head_dim_k == 512 and a1.head_dim_v == 512
    assert preset("table3-C-N2").model.N == 2 and preset("table3-C-N2").model.n_dec == 2
    assert preset("table3-D-ls0.2").train.label_smoothing == 0.2
    for name in PRESETS:
        preset(name).validate()


def test_every_preset_trains_in_auto_precision_and_the_cpu_presets_by_updates():
    """The same model on every CPU class, only the time differs: no preset forces a precision, and the
    CPU presets stop at a number of updates with checkpoints every so many updates, never at a clock."""
    for name in PRESETS:
        assert preset(name).train.precision == "auto", name
    for name in ("multi30k", "multi30k-rnn", "multi30k-conv", "parse", "parse-paper"):
        t = preset(name).train
        assert t.max_minutes == 0 and t.save_every_minutes == 0 and t.save_every > 0, name
        assert t.max_steps == {"parse": 4900, "parse-paper": 4900}.get(name, 2750) and t.max_steps // t.save_every == 20
    from aiayn.evidence.plan import protocol

    main = preset("multi30k").train  # the main job trains as the evidence suites' reference rows did
    same = protocol(main.max_steps)
    assert (main.max_steps, main.save_every, main.keep_last) == (
        same["train.max_steps"], same["train.save_every"], same["train.keep_last"])


def test_overrides_are_typed_and_checked():
    cfg = apply_overrides(Config(), {"train.lr_scale": "2", "model.pre_norm": "true", "model.d_k": "32"})
    assert cfg.train.lr_scale == 2.0 and cfg.model.pre_norm is True and cfg.model.d_k == 32
    with pytest.raises(ConfigError, match="train.nope"):
        apply_overrides(Config(), {"train.nope": "1"})
    with pytest.raises(ConfigError, match="model.N"):
        apply_overrides(Config(), {"model.N": "many"})
    with pytest.raises(ConfigError, match="precision"):
        apply_overrides(Config(), {"train.precision": "fp8"}).validate()
    with pytest.raises(ConfigError, match="divisible"):
        apply_overrides(Config(), {"model.h": "7"}).validate()
    # the None defaults are integers or null: a word or a fraction once passed, and failed later (a traceback)
    for key in ("model.d_k", "model.d_v", "model.N_dec", "decode.max_tokens"):
        for bad in ("abc", "2.5", "[1, 2]"):
            with pytest.raises(ConfigError, match=f"{key}: expected an integer or null"):
                apply_overrides(Config(), {key: bad})
        assert apply_overrides(Config(), {key: "null"}).validate() is not None
    assert apply_overrides(Config(), {"model.d_k": "64", "model.d_v": "64"}).validate().model.d_k == 64
    for key, value, says in (("train.threads", "1000000", "at most 1,024"),  # 10^6 OpenMP threads: SIGSEGV
                             ("train.seed", "-1", ">= 0"), ("train.seed", str(1 << 32), "at most 4,294,967,295"),
                             ("model.pad_id", "37000", "a vocabulary id, in [0, 37000)")):
        with pytest.raises(ConfigError, match=re.escape(f"{key} must be {says}")):
            apply_overrides(Config(), {key: value}).validate()


def test_a_model_config_made_in_code_is_checked_where_it_is_made():
    """The model constructors no longer check their config: one made in code is checked when made,
    one from a file or overrides by Config.validate (which train, load and the CLI call)."""
    from aiayn.config import ModelConfig

    with pytest.raises(ConfigError, match="divisible"):
        ModelConfig(d_model=512, h=7)
    with pytest.raises(ConfigError, match="p_drop"):
        ModelConfig(p_drop=1.5)
    assert ModelConfig(d_model=64, h=4).head_dim_k == 16


def test_bad_yaml_names_the_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_yaml(p)
    p.write_text("model:\n  d_modle: 3\n")
    with pytest.raises(ConfigError, match="d_modle"):
        load_yaml(p)


def test_a_config_file_that_is_not_one_is_one_error(tmp_path):
    """A folder, a binary file, a stray 2 MB file, a FIFO (never opened for a blocking read) or YAML nested
    past Python's recursion limit given as --config: a ConfigError naming it."""
    (tmp_path / "binary.yaml").write_bytes(b"\x93NUMPY\x01\x00")
    (tmp_path / "huge.yaml").write_text("# padding\n" * 200_000)
    (tmp_path / "nested.yaml").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(tmp_path / "pipe.yaml")
    for name, says in (("", "not a readable config file"), ("binary.yaml", "invalid UTF-8 at byte 0"),
                       ("huge.yaml", "2,000,000 bytes, at most 1 MiB"), ("pipe.yaml", "not a regular file"),
                       ("nested.yaml", "invalid YAML: maximum recursion depth")):
        with pytest.raises(ConfigError, match=says):
            load_yaml(tmp_path / name)
    (tmp_path / "ok.yaml").write_text("# padding\n" * 100_000 + "decode: {beam: 5}\n")  # under 1 MiB: read
    assert load_yaml(tmp_path / "ok.yaml").decode.beam == 5


def test_decoding_limits_keep_the_length_penalty_finite():
    """§6.1's length penalty ((5 + |Y|) / 6)^alpha at the largest alpha and output length a config
    allows is a finite float (1e30 overflowed it: a traceback); one step past the limit is refused."""
    from aiayn.config import DecodeConfig
    from aiayn.decode.search import length_penalty
    from aiayn.presets import DECODE_LIMITS, MODEL_LIMITS

    assert math.isfinite(length_penalty(MODEL_LIMITS["max_positions"], DECODE_LIMITS["alpha"]))
    assert math.isfinite(((5 + MODEL_LIMITS["max_positions"]) / 6) ** DECODE_LIMITS["alpha"])
    DecodeConfig(alpha=DECODE_LIMITS["alpha"], max_len_b=DECODE_LIMITS["max_len_b"]).validate()
    for key, value in (("alpha", 10.5), ("max_len_b", 1 << 17), ("max_len_a", 2048.0), ("beam", 1025)):
        with pytest.raises(ConfigError, match=f"decode.{key} must be at most"):
            DecodeConfig(**{key: value, "nbest": 1}).validate()


@pytest.mark.parametrize("key, value, says", [
    ("decode.step", "turbo", "decode.step must be auto, modules, fused, compiled or graphed, got 'turbo'"),
    ("model.attention", "flash", "model.attention must be one of auto, sdpa, explicit, got 'flash'"),
    ("train.fused_loss", "maybe", "train.fused_loss: expected true/false, got 'maybe'"),
])
def test_the_step_and_kernel_switches_refuse_what_they_do_not_know_naming_the_key(key, value, says):
    from aiayn.config import Config
    from aiayn.overrides import apply_overrides

    with pytest.raises(ConfigError) as e:
        apply_overrides(Config(), {key: value}).validate()
    assert says in str(e.value)
