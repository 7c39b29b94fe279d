"""simplace.compile_cache: where the persistent compilation cache lives, and that a
second process loads what the first compiled (in subprocesses: the cache is global JAX
configuration)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from simplace import compile_cache

# A program big enough to pass the minimum compile time, compiled and run.
_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from simplace import compile_cache
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    print("DIR", compile_cache.enable())
    def f(x):
        for _ in range(30):
            x = jnp.sin(x) @ x.T + jnp.cos(x)
        return x
    jax.jit(f)(jnp.ones((64, 64))).block_until_ready()
    print("HITS", events.count("/jax/compilation_cache/cache_hits"))
""")


# The same, with the cache turned on before JAX is imported (as the command line does):
# enable() must not import JAX, and JAX must take the cache from it.
_SCRIPT_BEFORE_JAX = textwrap.dedent("""
    import sys
    from simplace import compile_cache
    print("DIR", compile_cache.enable())
    print("JAX IMPORTED", "jax" in sys.modules)
""") + _SCRIPT.replace('print("DIR", compile_cache.enable())',
                     'print("AGAIN", compile_cache.enable())')


def _run(env_cache, script=_SCRIPT):
    env = {k: v for k, v in os.environ.items() if k != "SIMPLACE_COMPILE_CACHE"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    if env_cache is not None:
        env["SIMPLACE_COMPILE_CACHE"] = env_cache
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SIMPLACE_COMPILE_CACHE", str(tmp_path / "c"))
    assert compile_cache.cache_dir() == tmp_path / "c"
    for off in ("off", "0", "", "false"):
        monkeypatch.setenv("SIMPLACE_COMPILE_CACHE", off)
        assert compile_cache.cache_dir() is None
    monkeypatch.delenv("SIMPLACE_COMPILE_CACHE")
    monkeypatch.setenv("SIMPLACE_HOME", str(tmp_path / "home"))
    assert compile_cache.cache_dir() == tmp_path / "home" / "cache" / "jax"


def test_a_second_process_reuses_what_the_first_compiled(tmp_path):
    where = tmp_path / "jax-cache"
    first = _run(str(where))
    assert f"DIR {where}" in first and _hits(first) == 0
    assert any(where.iterdir()), "the first process wrote no compiled program"
    # The same programs in a new process: loaded from the cache, not compiled.
    assert _hits(_run(str(where))) >= 1


def test_turned_on_before_jax_is_imported_it_waits_for_jax_and_is_used(tmp_path):
    where = tmp_path / "jax-cache"
    first = _run(str(where), _SCRIPT_BEFORE_JAX)
    assert f"DIR {where}" in first and "JAX IMPORTED False" in first
    assert f"AGAIN {where}" in first and _hits(first) == 0
    assert any(where.iterdir()), "JAX did not take the cache set before its import"
    assert _hits(_run(str(where), _SCRIPT_BEFORE_JAX)) >= 1


def _hits(out: str) -> int:
    return int(re.search(r"HITS (\d+)", out).group(1))


def test_off_turns_it_off():
    out = _run("off")
    assert "DIR None" in out and _hits(out) == 0


def test_a_folder_that_cannot_be_made_warns_and_runs_without_cache(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    out = _run(str(tmp_path / "a-file" / "jax"))
    assert "DIR None" in out and _hits(out) == 0


@pytest.mark.slow
def test_the_cli_fills_the_cache(tmp_path):
    env = {**os.environ, "SIMPLACE_COMPILE_CACHE": str(tmp_path / "c")}
    out = subprocess.run([sys.executable, "-m", "simplace", "optimize", "mlp", "--small",
                          "--cost-model", "haswell_k40x4", "--method", "rl-gnn",
                          "--episodes", "64"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert any((tmp_path / "c").iterdir())
