"""A persistent cache of compiled XLA programs, so that a second run pays no compilation.

Compiling can be most of what a short search spends (an RL run compiles the policy, its
update, the imitation step and the batched simulator), leaving little time to train.
JAX can keep compiled programs on disk (``jax_compilation_cache_dir``); a later process
that compiles the same program (same graph, machine, batch size, JAX version) loads it
instead, in a fraction of the time.

The command line turns the cache on (``enable``) in ``cache_dir()``:
``$SIMPLACE_COMPILE_CACHE`` if set (``off``, ``0`` or an empty value turn it off), else
``<SIMPLACE_HOME>/cache/jax`` when ``$SIMPLACE_HOME`` is set, else the platform's user
cache directory (``~/.cache/simplace/jax`` on Linux). A cache directory the user already
gave JAX (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is left as it is. Library
users call ``enable()`` themselves: importing simplace never changes JAX's global
configuration.

Budgets still count compilation: a warm cache makes it cheaper, not free (loading and
tracing remain), and benchmarks say whether the cache was on.
"""

from __future__ import annotations

import os
from pathlib import Path

# Why a cache: under a 30 s budget on this project's 2-core VM, RL on rnnlm spent about
# 25 s in XLA compilation (119 programs: the policy, its update, the imitation step, the
# batched simulator), so it trained for one update.
ENV_CACHE = "SIMPLACE_COMPILE_CACHE"
_OFF = ("", "0", "off", "false", "no")
# Programs that compiled faster than this are not worth a disk round trip; the default
# (1 s) would skip most of simplace's programs on a fast host, whose many 0.1-0.5 s
# compilations add up to most of a short search's budget.
MIN_COMPILE_TIME_S = 0.05
# JAX's options as environment variables, read when JAX is imported.
_ENV_DIR = "JAX_COMPILATION_CACHE_DIR"
_ENV_MIN_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def cache_dir() -> Path | None:
    """Where the compilation cache lives, or None when ``$SIMPLACE_COMPILE_CACHE`` turns
    it off (module docstring)."""
    env = os.environ.get(ENV_CACHE)
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env).expanduser().absolute()
    home = os.environ.get("SIMPLACE_HOME", "").strip()
    if home:
        return Path(home).expanduser().absolute() / "cache" / "jax"
    import platformdirs

    return Path(platformdirs.user_cache_dir("simplace", appauthor=False)) / "jax"


def enable(path: str | os.PathLike | None = None) -> Path | None:
    """Turn JAX's persistent compilation cache on in ``path`` (default ``cache_dir()``);
    returns the directory in use, or None when it is off. A directory JAX was already
    given is kept. A directory that cannot be created leaves the cache off (a warning
    says why): a cache is never a reason for a command to fail.

    Before JAX is imported, the cache is set in JAX's environment variables, which JAX
    reads when it is imported: a command that never needs JAX does not wait for it."""
    import sys

    jax = sys.modules.get("jax")
    current = (jax.config.jax_compilation_cache_dir if jax is not None
               else os.environ.get(_ENV_DIR))
    if current:
        return Path(current)
    target = Path(path) if path is not None else cache_dir()
    if target is None:
        return None
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        import warnings

        warnings.warn(f"simplace: no compilation cache ({target}: {err.strerror or err}); "
                      f"set {ENV_CACHE} to a writable folder, or to 'off'", stacklevel=2)
        return None
    if jax is None:
        os.environ[_ENV_DIR] = str(target)
        os.environ[_ENV_MIN_TIME] = str(MIN_COMPILE_TIME_S)
        return target
    jax.config.update("jax_compilation_cache_dir", str(target))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    return target
