"""The checks of the files and folders a command writes, made before it starts its work
(so that no result is lost to a bad path): writable, not an input of the command, an
image format matplotlib writes."""

from __future__ import annotations

from simplace.errors import SimplaceError

# Options naming files a command writes, and folders it writes into: all are checked
# before the command starts its work (see main), so that no result is lost to a bad path.
OUTPUT_FILES = {"out": "--out", "gantt": "--gantt", "history": "--history",
                "checkpoint": "--checkpoint"}


OUTPUT_DIRS = {"records_dir": "--records-dir", "cost_model_dir": "--cost-model-dir"}


def check_outputs(args) -> None:
    """Refuse, before any work, output paths that cannot be written (``OutputError``,
    exit 2): a missing folder, a directory, a read-only place."""
    from simplace._jsonfile import check_output_dir, check_output_path

    for dest, option in OUTPUT_FILES.items():
        if getattr(args, dest, None) is not None:
            check_output_path(getattr(args, dest), option)
    _check_inputs_are_not_outputs(args)
    if getattr(args, "gantt", None) is not None:
        _check_image_format(args.gantt, "--gantt")
    for dest, option in OUTPUT_DIRS.items():
        # calibrate --refit only reads its records.
        if dest == "records_dir" and getattr(args, "refit", False):
            continue
        # Only calibrate and validate --update write models; the other commands read
        # --cost-model-dir (simplace.paths checks that it is a folder).
        if dest == "cost_model_dir" and not (args.command == "calibrate"
                                             or getattr(args, "update", False)):
            continue
        if getattr(args, dest, None) is not None:
            check_output_dir(getattr(args, dest), option)


def _check_inputs_are_not_outputs(args) -> None:
    """An output written over an input file (``optimize g.json --out g.json``) would
    destroy it: refuse. Rewriting a placement file in place (``simulate --placement
    p.json --out p.json``) and re-saving a graph over itself stay allowed."""
    import os

    def same(a, b) -> bool:
        try:
            return os.path.samefile(a, b)
        except OSError:  # one of them does not exist (yet): not the same file
            return False

    inputs = [("MODEL", getattr(args, "model", None)),
              ("--cost-model", getattr(args, "cost_model", None)),
              ("--placement", getattr(args, "placement", None))]
    inputs += [("P.JSON", p) for p in getattr(args, "placements", None) or []]
    for dest, option in OUTPUT_FILES.items():
        out = getattr(args, dest, None)
        if out is None:
            continue
        for what, path in inputs:
            allowed = (dest == "out" and ((args.command == "simulate" and what == "--placement")
                                          or (args.command == "graph" and what == "MODEL")))
            if path is not None and not allowed and same(out, path):
                raise SimplaceError(f"{option} {out} is the {what} file this command reads: "
                                    "writing there would destroy it. Choose another path.")


def _check_image_format(path: str, option: str) -> None:
    """matplotlib picks the format from the file name: refuse one it cannot write now,
    not after the simulation."""
    from pathlib import Path

    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise SimplaceError(f"{option} {path}: the file name must end in an image format "
                            f"matplotlib writes: .png, .svg, .pdf ... ({', '.join(formats)}).")
