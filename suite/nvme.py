"""The NVMe tier's folder on the runner's side: resolving where a trial swaps, and emptying it.

`methods.nvme_path` names a folder on the drive (empty: `<store.dir>/nvme`, resolved when the
trial runs: `resolved`); a trial swaps into its own folder under it, `<nvme_path>/<trial id>`
(`suite.methods.swap_dir`), which DeepSpeed fills with a file per swapped partition and state,
and which the launcher removes when the trial's ranks have ended, whatever the outcome (`empty`):
a failed trial leaves no swap files behind, and the drive folder keeps whatever else it holds.
The checks before a launch (writable, O_DIRECT, free space for the predicted swap) are
`suite.config.validate.nvme_problems`'.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from suite.config import Trial
from suite.methods import on_nvme, swap_dir

DEFAULT_FOLDER = "nvme"
"""The default drive folder, under the store: `<store.dir>/nvme`."""


def resolved(t: Trial, store_dir: str | Path) -> Trial:
    """`t` with its drive folder an absolute path (the store's `nvme/` where none is given). Not
    in the id: the same trial, whose record then says where it swapped."""
    if not on_nvme(t):
        return t
    folder = Path(t.methods.nvme_path or Path(store_dir) / DEFAULT_FOLDER).expanduser().absolute()
    return replace(t, methods=replace(t.methods, nvme_path=str(folder)))


def empty(t: Trial) -> None:
    """Remove the trial's swap folder and every file in it (after its ranks have ended)."""
    if on_nvme(t) and t.methods.nvme_path:
        shutil.rmtree(swap_dir(t), ignore_errors=True)
