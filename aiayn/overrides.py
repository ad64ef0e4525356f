"""Dotted keys over the configs: command-line overrides, the paper's presets (Table 3) and YAML files.

Presets are plain data: a dict of dotted overrides applied on top of the defaults (config.py), so
``big`` reads exactly as Table 3 describes it. Every value is coerced to its field's type and checked.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import io
import tokenize
from pathlib import Path
from typing import Any

import yaml

from .config import Config, show
from .errors import ConfigError
from .presets import PRESETS


def _coerce(value: Any, current: Any, key: str) -> Any:
    """A command-line string parsed into the type of the field it overrides; a value from a file
    (YAML, a checkpoint's JSON) checked against that type (`N: 2.5` is refused, 2 becomes 2.0)."""
    if isinstance(value, str) and not isinstance(current, str):
        if isinstance(current, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{key}: expected true/false, got {show(value)}")
        try:
            value = yaml.safe_load(value)
            if isinstance(current, float) and isinstance(value, str):
                value = float(value)  # 2e-3 is a string to YAML 1.1
        except (yaml.YAMLError, ValueError):
            raise ConfigError(f"{key}: expected {type(current).__name__}, got {show(value)}") from None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if current is None:  # every None default is `int | None` (d_k, d_v, N_dec, decode.max_tokens)
        if value is None or (number and isinstance(value, int)):
            return value
        raise ConfigError(f"{key}: expected an integer or null, got {show(value)}")
    if isinstance(current, bool) and isinstance(value, bool):
        return value
    if isinstance(current, int) and not isinstance(current, bool) and number and isinstance(value, int):
        return value
    if isinstance(current, float) and number and not (isinstance(value, int) and abs(value) > 1e300):
        return float(value)  # NaN and inf pass here; validate() names them
    if isinstance(current, tuple) and isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value):
        return tuple(value)
    if isinstance(current, str) and isinstance(value, str):
        return value
    raise ConfigError(f"{key}: expected {type(current).__name__}, got {show(value)}")


def config_keys(cfg: Config | None = None) -> dict[str, Any]:
    """Every dotted key of a config and its value (the defaults when cfg is None)."""
    return _flatten((cfg or Config()).to_dict())


@functools.cache
def descriptions() -> dict[str, str]:
    """Every dotted key's one line: the comment beside its field in config.py (or the comment lines
    just above it), so the help, `aiayn config` and the code read one source."""
    source = inspect.getsource(inspect.getmodule(Config))
    lines = source.split("\n")
    comments = {t.start[0]: t.string.lstrip("#").strip()
                for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT}
    sections = {f.type if isinstance(f.type, str) else f.type.__name__: f.name for f in dataclasses.fields(Config)}
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ClassDef) and node.name in sections):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                above, line = [], stmt.lineno - 1
                while line in comments and lines[line - 1].lstrip().startswith("#"):  # comment-only lines
                    above.insert(0, comments[line])
                    line -= 1
                text = comments.get(stmt.end_lineno) or " ".join(above)
                out[f"{sections[node.name]}.{stmt.target.id}"] = text
    return out


def commented_yaml(cfg: Config, title: str = "") -> str:
    """The config as YAML that load_yaml reads back, each key with its description as a comment."""
    about = descriptions()
    lines = [f"# {title}"] if title else []
    for section, values in cfg.to_dict().items():
        lines.append(f"{section}:")
        for key, value in values.items():
            text = yaml.safe_dump({key: list(value) if isinstance(value, tuple) else value},
                                  default_flow_style=True, width=1 << 20).strip()[1:-1]
            lines.append(f"  {text}" + (f"  # {about[f'{section}.{key}']}" if about.get(f"{section}.{key}") else ""))
    return "\n".join(lines) + "\n"


def _unknown_key(key: str) -> ConfigError:
    """An error that names the key and, when some are close, the keys the user probably meant
    (those it begins first, then the most similar: at most two)."""
    keys = list(config_keys())
    close = [k for k in keys if k.startswith(key)][:1] + difflib.get_close_matches(key, keys, n=2, cutoff=0.75)
    close = list(dict.fromkeys(close))[:2]
    hint = (f"; did you mean {' or '.join(map(repr, close))}?" if close else
            " (keys are model.*, data.*, train.*, decode.*; `aiayn config` prints them all)")
    return ConfigError(f"unknown config key {key!r}{hint}")


def apply_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """Set dotted keys (``train.lr_scale``) on a config; unknown keys are an error."""
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        sub = getattr(cfg, section, None)
        if sub is None or not dataclasses.is_dataclass(sub) or not name:
            raise _unknown_key(key)
        if name not in {f.name for f in dataclasses.fields(sub)}:
            raise _unknown_key(key)
        setattr(sub, name, _coerce(value, getattr(sub, name), key))
    return cfg


def preset(name: str) -> Config:
    """A fresh Config for a named preset (see PRESETS)."""
    if name not in PRESETS:
        close = [p for p in PRESETS if p.lower() == name.lower()] or difflib.get_close_matches(name, PRESETS, n=2)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ConfigError(f"unknown preset {name!r}; {hint}presets: {', '.join(PRESETS)}")
    return apply_overrides(Config(), PRESETS[name])


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def from_dict(d: dict[str, Any], base: Config | None = None) -> Config:
    """Build a Config from a nested dict (as written by `to_dict` / YAML)."""
    return apply_overrides(base or Config(), _flatten(d))


def load_yaml(path: str | Path, base: Config | None = None) -> Config:
    path = Path(path)
    try:
        size = path.stat().st_size  # missing: OSError below
        if not path.is_file() or size > 1 << 20:  # a config is a few hundred bytes; a FIFO is never opened (it blocks)
            why = f"{size:,} bytes, at most 1 MiB" if path.is_file() else "not a regular file"
            raise ConfigError(f"{path}: not a readable config file ({why})")
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError) as e:  # missing, a binary file, no permission
        why = f"invalid UTF-8 at byte {e.start}" if isinstance(e, UnicodeDecodeError) else e.strerror
        raise ConfigError(f"{path}: not a readable config file ({why})") from None
    except (yaml.YAMLError, RecursionError) as e:  # RecursionError: nested past Python's limit
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"{where}: invalid YAML: {what}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return from_dict(data, base)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
