"""One SyncEvent per host<-device synchronization the detectors saw (or predicted)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    library: bool = False  # torch's or an installed package's code, not the user's

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function,
                "library": self.library}


# The copies' own advice (detect/rules.py ADVICE has them), here where the report, read without
# torch, sees them: a site of these that ran only before the measured steps gets SETUP_COPY.
COPY_ADVICE = {
    "D2H copy": "copy non_blocking into a pinned host buffer, record an event, read after "
    "event.query()/a host thread (event-gated copy)",
    "H2D copy": "pin the host memory (DataLoader(pin_memory=True)) and copy with "
    "non_blocking=True, ideally on a side stream (a train pipeline does this)",
    "H2D copy (torch.tensor)": "build it with torch.full/torch.arange on the device, or create "
    "it once outside the step",
    # a DataLoader pins in its own worker / pin-memory thread; tensor.pin_memory() on the main
    # thread is itself a host copy the step waits for
    "pageable non_blocking copy": "pin the host side so non_blocking=True is really "
    "asynchronous: a DataLoader's batches with DataLoader(..., pin_memory=True) (gpusync fix "
    "writes it); a tensor of your own through a pinned buffer kept across steps",
}
SETUP_COPY = ("a copy made only before the measured steps (building, warm-up): not per step, "
              "nothing to change; to skip it, make the tensor on the device "
              "(torch.tensor(..., device=...), torch.zeros(..., device=...))")


def package_path(file: str) -> str:
    """A library's file from its package name on ("transformers/trainer.py"); others as they
    are."""
    for marker in ("site-packages/", "dist-packages/"):
        file = file.rpartition(marker)[2] if marker in file else file
    return file


@dataclass(frozen=True)
class FrameworkStep:
    """The step of a framework's own loop that made a sync (its logging, its NaN/Inf loss
    filter, its progress bar, its checkpoint), named by detect/libraries/: a sync of
    `trainer.train()` lands on that one line of the user's, and this tells its rows apart."""

    label: str  # "Trainer NaN/Inf loss filter"
    file: str  # the framework's line that names the step
    line: int
    function: str
    text: str = ""  # that line's source text (a statement over several lines: joined)

    @property
    def short(self) -> str:
        """As the fix list shows it: "transformers/trainer.py:1922 Trainer._run_epoch"."""
        file = package_path(self.file.replace("\\", "/"))
        return f"{file}:{self.line} {self.function}"


# Phases a sync can be attributed to. "hook" events also carry the hook's name. "eval": a
# forward without autograd (validation, evaluation, inference) and its loop (phases.py).
FORWARD, BACKWARD, OPTIMIZER, HOOK, OTHER = "forward", "backward", "optimizer", "hook", "other"
EVAL = "eval"
# Stages of a train pipeline (torchrec's), which run batches other than the one in forward.
INPUT_DIST, EMB_LOOKUP, BATCH_COPY = "input_dist", "emb_lookup", "batch_copy"
PHASES = (FORWARD, BACKWARD, OPTIMIZER, HOOK, EVAL, INPUT_DIST, EMB_LOOKUP, BATCH_COPY, OTHER)

# a blocking copy from pinned memory: what to add at the copy's call; a framework's copy
# (accelerate's send_to_device) is not the user's to edit: its lever says how instead
PINNED_SOURCE = "the source is pinned already"
PINNED_DETAIL = PINNED_SOURCE + ": add non_blocking=True"


@dataclass
class SyncEvent:
    op: str  # rule name, e.g. "item", "nonzero", "bool-mask index", "tolist", "D2H copy"
    frames: tuple[Frame, ...]  # innermost first, gpusync / tool / stdlib frames removed
    phase: str = OTHER
    hook: str | None = None
    module: str | None = None  # module path inside the root nn.Module, e.g. "sparse_arch.tables.t0"
    step: int = 0  # set when the report is built (a step's end is known only later)
    stall_ms: float | None = None  # measured on a GPU only
    detail: str = ""  # e.g. "via IndexBackward0 (from forward)"
    advice: str = ""
    # why this sync was predicted, not seen: it is made in C++ code (DDP's reducer) whose GPU
    # path a virtual CUDA run cannot take; "" for a sync seen as the code ran
    predicted: str = ""
    ts: float = 0.0  # seconds since the scan began (a trace's timeline)
    framework: FrameworkStep | None = None  # the framework's step that made it, if known

    @property
    def location(self) -> Frame | None:
        """Where the user can act: their innermost frame (the library's when none is theirs)."""
        return next((f for f in self.frames if not f.library),
                    self.frames[0] if self.frames else None)

    @property
    def library(self) -> Frame | None:
        """The library line that synced, when the sync happened inside a library."""
        return self.frames[0] if self.frames and self.frames[0].library else None
