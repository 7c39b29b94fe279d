"""An op's ``name_path`` from the name stack JAX records: the module scopes, with
transforms dropped and the backward pass marked."""

from __future__ import annotations

from collections.abc import Sequence

from simplace.graph import BACKWARD_PREFIX, split_name_path

# Scopes JAX itself pushes onto name stacks; they are not modules.
_INTERNAL_SCOPES = frozenset({"rematted_computation"})


def module_path(stack: Sequence) -> str:
    """Clean a name stack (a ``NameStack`` or its ``.stack`` tuple) into an op's name_path.

    Scopes (flax modules, ``jax.named_scope``) form the path; transforms (``jvp``,
    ``vmap``...) are dropped, and a ``transpose`` transform marks a backward op, which
    gets ``BACKWARD_PREFIX``. A flax method scope ``enc.encode`` counts as module
    ``enc``. When a transform is followed by the root scope again (remat inside a
    gradient restates the whole path), the path restarts there.
    """
    stack = getattr(stack, "stack", stack)
    path: list[str] = []
    backward = False
    after_transform = False
    for el in stack:
        if type(el).__name__ == "Transform":
            backward = backward or el.name == "transpose"
            after_transform = bool(path)
            continue
        name = el.name
        if name in _INTERNAL_SCOPES or "->" in name:
            # "->": jnp.einsum scopes its equation ("bqhd,bkhd->bhqk"), which names no
            # module and would split one layer's ops across paths.
            continue
        owner, dot, method = name.partition(".")
        if dot and owner and method.isidentifier():
            # flax scopes a method other than __call__ as "<module>.<method>": the
            # method belongs to its module
            if path and path[-1] == owner:
                continue
            name = owner
        if after_transform and name == path[0]:
            path = []
        after_transform = False
        path.append(name)
    joined = "/".join(path)
    return BACKWARD_PREFIX + joined if backward else joined


def _common_module_prefix(paths: Sequence[str]) -> tuple[str, ...]:
    """Module components shared by all non-empty paths (e.g. a flax ``nn.scan`` module:
    the loop equation sits outside the module's scope, its body inside)."""
    common: tuple[str, ...] | None = None
    for p in paths:
        parts = split_name_path(p)[1]
        if not parts:
            continue
        if common is None:
            common = parts
        else:
            n = 0
            while n < min(len(common), len(parts)) and common[n] == parts[n]:
                n += 1
            common = common[:n]
        if not common:
            break
    return common or ()


def _join_path(path: str, extra: tuple[str, ...]) -> str:
    if not extra:
        return path
    sep = "" if not path or path.endswith("/") else "/"
    return path + sep + "/".join(extra)
