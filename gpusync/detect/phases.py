"""Where in a training step a sync happens: forward (and in which module), backward, a hook,
the optimizer, or elsewhere; and which step it belongs to.

Everything is installed through torch's removable global hooks; `uninstall` removes them all.
"""
from __future__ import annotations

import functools
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from . import patches
from .events import (
    BACKWARD,
    EVAL,
    FORWARD,
    HOOK,
    OPTIMIZER,
    OTHER,
    Frame,
)
from .frames import is_internal
from .libraries import pytorch, torchrec
from .steps import StepCounter

_ENGINE_FRAME = ("graph.py", "_engine_run_backward")
_MODULE_FILE = "torch/nn/modules/module.py"
_CUSTOM_FN_FRAME = ("function.py", "BackwardCFunction.apply")
# Key under which forward frames are stored on autograd nodes (node.metadata).
NODE_KEY = "gpusync_forward"


_MAX_SPANS = 200_000  # a trace keeps the first ones of a very long run


class PhaseTracker:
    """Phases (which module runs, backward, optimizer) and step signals for a StepCounter.

    Only the thread that installed it counts: another thread's forwards and optimizer steps
    belong to another training loop (a second watch() in a thread has its own tracker)."""

    def __init__(self, root: torch.nn.Module | None = None, auto_steps: bool = True,
                 position: Callable[[], int] = lambda: 0):
        self.root = root
        self.t0 = time.perf_counter()
        self.steps = StepCounter(position, explicit=not auto_steps, clock=self.now)
        self.spans: list[tuple[str, float, float]] = []  # top-level phases, for a trace
        self._span_start = 0.0
        self._module_stack: list[torch.nn.Module] = []
        self._paths: dict[int, dict[int, str]] = {}
        self._in_optimizer = 0
        self._in_backward = 0
        self._in_closure = 0  # an optimizer step's closure runs (forward and backward)
        # since a top-level forward (or a batch fetched) without autograd: an evaluation loop,
        # until the next training work
        self._eval = False
        # the top-level modules trained so far: all of them in eval mode when a batch is
        # fetched, it is an evaluation loop's (Hugging Face's Trainer fetches its eval batches
        # with autograd on, after model.eval())
        self._trained: weakref.WeakSet = weakref.WeakSet()
        self._training_loaders: set[int] = set()  # datasets trained on during a pass (held)
        self._loaders: dict[int, _Epoch] = {}  # by the id of the dataset a DataLoader reads
        self._fetch_placed: list[str] = []  # boundaries the latest batch request placed
        # >0 while a DataLoader makes a batch in this thread (num_workers=0): the forwards of
        # its transforms (torchvision's are modules) are the data's, not the model's work
        self.fetching = 0
        self._handles: list = []
        self._thread = threading.get_ident()

    # -- install / uninstall -------------------------------------------------------------
    def install(self) -> None:
        import torch.autograd as autograd

        self._thread = threading.get_ident()
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._fwd_pre),
            nn_module.register_module_forward_hook(self._fwd_post, always_call=True),
            optim_module.register_optimizer_step_pre_hook(self._opt_pre),
            optim_module.register_optimizer_step_post_hook(self._opt_post),
            patches.add_layer(optim_module.Optimizer, "__init__", self._optimizer_made),
            patches.add_layer(autograd, "_engine_run_backward", self._backward),
        ]

    def uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._module_stack.clear()
        self._in_optimizer = 0
        self._in_backward = 0
        self._in_closure = 0
        self._eval = False
        self._loaders.clear()  # the datasets it held

    def now(self) -> float:
        """Seconds since the tracker was made (the scan's clock: events, steps, spans)."""
        return time.perf_counter() - self.t0

    def _span(self, phase: str) -> None:
        if len(self.spans) < _MAX_SPANS:
            self.spans.append((phase, self._span_start, self.now()))

    def _ours(self) -> bool:
        return threading.get_ident() == self._thread

    def _between_work(self) -> bool:
        """Outside every module forward, optimizer step and backward pass."""
        return not self._module_stack and not self._in_optimizer and not self._in_backward

    # -- hooks -----------------------------------------------------------------------------
    def batch_fetched(self, loader: object = None, source: object = None) -> None:
        """A DataLoader hands out a batch: outside any forward, backward or optimizer step that
        is the next iteration beginning, so copying the batch to the device belongs to it
        (not to the step before). Under no_grad (a validation loader) it moves only the
        forward count's boundary, as a forward there does."""
        if not self._ours():
            return
        if loader is not None:
            self._batch_from(loader)
        self._fetch_placed = []
        if self._between_work():
            training = torch.is_grad_enabled() and not self._evaluating(loader or source)
            self._eval = self._eval or not training
            self._fetch_placed = self.steps.work_starts(training=training)

    def fetch(self, iterator: object) -> _Fetch:
        """Around a DataLoader iterator's __next__: the batch is asked for (batch_fetched), it
        is made (the forwards of its transforms are not the model's), or the loader ran out."""
        self.batch_fetched(iterator)
        return _Fetch(self, iterator, self._ours())

    def _evaluating(self, iterator: object) -> bool:
        """A batch of `iterator` (its loader's) is an evaluation loop's: not a loader trained
        on before, and every top-level module trained so far in eval mode (model.eval()).
        Hugging Face's Trainer fetches its eval batches with autograd on; its training loader,
        known by then, still begins the next step after an evaluation, before model.train()."""
        dataset = getattr(iterator, "_dataset", iterator)
        if iterator is not None and id(dataset) in self._training_loaders:
            return False
        modules = list(self._trained)
        return bool(modules) and not any(m.training for m in modules)

    def loader_ran_out(self, loader: object) -> None:
        """A DataLoader iterator raised StopIteration: no batch, so no step begins; an epoch's
        end when training happened since its first batch, else an evaluation loop's end."""
        if not self._ours():
            return
        self.steps.retract(self._fetch_placed)
        self._fetch_placed = []
        epoch = self._loaders.get(id(getattr(loader, "_dataset", loader)))
        if epoch is None or epoch.iterator() is not loader or epoch.ended:
            return
        epoch.ended = True
        epoch.until = self.steps.trained()
        if epoch.until > epoch.trained:
            self.steps.epoch_ended()
        else:
            self._eval = False

    def _batch_from(self, loader: object) -> None:
        """A batch is asked of a DataLoader iterator. A new iterator over a dataset whose
        previous one was trained on begins the next epoch (a loop that stops by the loader's
        length, as Lightning's does, never sees it run out)."""
        dataset = getattr(loader, "_dataset", loader)
        epoch = self._loaders.get(id(dataset))
        # trained on while its pass ran: up to its end where it ran out (an evaluation loader
        # run once per epoch sees the next epoch's training after its own pass)
        fed = epoch is not None and (
            self.steps.trained() if epoch.until is None else epoch.until) > epoch.trained
        if fed:
            self._training_loaders.add(id(dataset))  # _loaders holds it: its id stays its own
        if epoch is not None and epoch.iterator() is loader:
            return
        if epoch is not None:
            if not epoch.ended and fed:
                self.steps.epoch_ended()
            self.steps.next_epoch_begins()
        try:
            ref = weakref.ref(loader)
        except TypeError:  # an iterator that cannot be weakly held: no epochs from it
            return
        self._loaders[id(dataset)] = _Epoch(dataset, ref, self.steps.trained())

    def _fwd_pre(self, module, args):
        if not self._ours() or self.fetching:
            return
        if self._between_work():
            training = torch.is_grad_enabled()
            self._eval = not training
            if training and module.training:
                self._trained.add(module)
            self.steps.work_starts(training=training)
            self._span_start = self.now()
            self.steps.begin(FORWARD, FORWARD)  # may stop the run: before the push
        self._module_stack.append(module)

    def _fwd_post(self, module, args, output):
        if not self._ours():
            return
        # always_call=True: runs on exceptions too, so the stack cannot drift.
        if self._module_stack and self._module_stack[-1] is module:
            self._module_stack.pop()
        elif module in self._module_stack:
            del self._module_stack[self._module_stack.index(module):]
        if self._between_work():
            self._span(EVAL if self._eval else FORWARD)
            self.steps.end(FORWARD)

    def _opt_pre(self, optimizer, args, kwargs):
        if not self._ours():
            return
        if self._in_optimizer == 0:  # an optimizer stepping others (torchrec's) is one step
            self.steps.work_starts()
            self._eval = False
            self._span_start = self.now()
            self.steps.begin(OPTIMIZER, id(optimizer))
        self._in_optimizer += 1
        # the outermost step's closure: an optimizer stepping others hands it on as it is
        return self._closure_as_work(args, kwargs) if self._in_optimizer == 1 else None

    def _closure_as_work(self, args, kwargs):
        """`optimizer.step(closure)` runs the closure inside the step (Lightning's
        training_step, LBFGS's loss): what it runs is the step's forward and backward, not the
        optimizer's work, so the closure is handed on in a wrapper that sets the step aside
        while it runs. None (arguments unchanged) without a closure."""
        if "closure" in kwargs:
            if callable(kwargs["closure"]):
                return args, {**kwargs, "closure": self._as_work(kwargs["closure"])}
        elif len(args) > 1 and callable(args[1]):
            return (args[0], self._as_work(args[1]), *args[2:]), kwargs
        return None

    def _as_work(self, closure):
        @functools.wraps(closure)
        def run(*args, **kwargs):
            if not self._ours():
                return closure(*args, **kwargs)
            depth, start = self._in_optimizer, self._span_start
            self._in_optimizer, self._in_closure = 0, self._in_closure + 1
            try:
                return closure(*args, **kwargs)
            finally:
                self._in_optimizer, self._in_closure = depth, self._in_closure - 1
                self._span_start = start

        return run

    def _opt_post(self, optimizer, args, kwargs):
        if not self._ours():
            return
        self._in_optimizer = max(0, self._in_optimizer - 1)
        if self._in_optimizer == 0:
            self._span(OPTIMIZER)
            self.steps.end(OPTIMIZER)

    def _optimizer_made(self, call, *args, **kwargs):
        if self._ours():
            self.steps.optimizers_made = True
        return call(*args, **kwargs)

    def _backward(self, call, *args, **kwargs):
        outer = self._ours() and self._in_backward == 0
        if outer:
            self.steps.work_starts()
            self._eval = False
            self._span_start = self.now()
            self.steps.begin(BACKWARD, BACKWARD)
        self._in_backward += int(outer)
        try:
            return call(*args, **kwargs)
        finally:
            if outer:
                self._in_backward -= 1
                self._span(BACKWARD)
                self.steps.end(BACKWARD)

    def end_step(self) -> None:
        self.steps.end_step()

    # -- queries ---------------------------------------------------------------------------
    def module_path(self) -> str | None:
        if not self._module_stack:
            return None
        return self.path_of(self._module_stack[-1], self._module_stack[0])

    def path_of(self, module: torch.nn.Module, outer: torch.nn.Module) -> str:
        root = self.root if self.root is not None else outer
        table = self._paths.get(id(root))
        if table is None:
            table = {id(m): name for name, m in root.named_modules()}
            self._paths[id(root)] = table
        name = table.get(id(module))
        if name is None:  # a module outside the declared root
            return type(module).__name__
        return name or type(root).__name__

    def classify(self, raw: list[tuple[str, int, str]]):
        """Return (phase, name, forward frames or None, module path or None); name is the hook
        for HOOK and the autograd node for BACKWARD."""
        in_scaler, stage, hook, moving = _facts(raw)
        if torch._C._current_graph_task_id() != -1:
            return self._classify_backward(hook)
        if self._in_optimizer or in_scaler:
            return OPTIMIZER, None, None, None
        if stage is not None:  # a pipeline working on a batch ahead: not this step's forward
            return stage, None, None, self.module_path()
        if self._module_stack:
            return (EVAL if self._eval else FORWARD), None, None, self.module_path()
        if self._in_closure:  # the closure computes the loss: the step's forward
            return FORWARD, None, None, None
        if self._eval and not torch.is_grad_enabled() and not moving:
            return EVAL, None, None, None  # the evaluation loop, between its forwards
        if torch.is_grad_enabled():
            # autograd is back on: the loop left its no-grad region (an RL agent acting under
            # inference_mode between its training steps), so a later no-grad sync before the
            # next forward is not evaluation's
            self._eval = False
        return OTHER, None, None, None

    def _classify_backward(self, hook: str | bool | None):
        if isinstance(hook, str):
            return HOOK, hook, None, None
        if hook:
            return BACKWARD, None, None, None
        node = torch._C._current_autograd_node()
        metadata: dict = node.metadata if node is not None else {}  # type: ignore[assignment]
        origin = metadata.get(NODE_KEY)
        if origin is not None:
            frames, module = origin
            return BACKWARD, None, frames, module
        return BACKWARD, node.name() if node is not None else None, None, None


class _Fetch:
    def __init__(self, tracker: PhaseTracker, iterator: object, ours: bool):
        self.tracker, self.iterator, self.ours = tracker, iterator, ours

    def __enter__(self) -> None:
        self.tracker.fetching += self.ours

    def __exit__(self, kind, error, tb) -> None:
        self.tracker.fetching -= self.ours
        if kind is StopIteration:
            self.tracker.loader_ran_out(self.iterator)


@dataclass
class _Epoch:
    """A DataLoader's current pass: its dataset (held, so its id stays its own), the iterator,
    and the optimizer steps and backward passes begun before its first batch and, once it ran
    out, before its end."""

    dataset: object
    iterator: weakref.ref
    trained: int
    ended: bool = False
    until: int | None = None  # trained() when it ran out (None: it has not)


# What a stack says, by the identity of capture()'s cached list: (list, facts); the list is
# held, so its id is not reused while the entry is kept.
_stack_facts: dict[int, tuple[list, tuple]] = {}


def _facts(raw: list[tuple[str, int, str]]) -> tuple[bool, str | None, str | bool | None, bool]:
    """(in GradScaler.step, pipeline stage, what runs inside backward: a hook's name, True for
    user code in a custom autograd Function's backward, None for the engine's own nodes, in
    Module._apply: a module moved, under the no_grad of its own that is no evaluation)."""
    found = _stack_facts.get(id(raw))
    if found is not None and found[0] is raw:
        return found[1]
    facts = (_in_scaler_step(raw), _pipeline_stage(raw), _backward_code(raw),
             any(fn == "Module._apply" and f.endswith(_MODULE_FILE) for f, _, fn in raw))
    if len(_stack_facts) >= 4096:
        _stack_facts.clear()
    _stack_facts[id(raw)] = (raw, facts)
    return facts


def _backward_code(raw: list[tuple[str, int, str]]) -> str | bool | None:
    # Frames called by the autograd engine: inner to _engine_run_backward on the CPU, all of
    # them on a CUDA device thread (which has no caller frames).
    region = raw
    for i, (f, _, fn) in enumerate(raw):
        if f.endswith(_ENGINE_FRAME[0]) and fn == _ENGINE_FRAME[1]:
            region = raw[:i]
            break
    user = [fr for fr in region if not is_internal(fr[0])]
    if not user:
        return None
    if any(f.endswith(_CUSTOM_FN_FRAME[0]) and fn == _CUSTOM_FN_FRAME[1] for f, _, fn in region):
        return True
    named = [fn for _, _, fn in user if not fn.endswith("<lambda>")]
    return named[-1] if named else user[-1][2]


def _in_scaler_step(raw: list[tuple[str, int, str]]) -> bool:
    """GradScaler.step reads found_inf just before it steps the optimizer: the user wrote
    `scaler.step(optimizer)`, so that is the optimizer phase."""
    return any(fn == "GradScaler.step" and f.endswith(pytorch.SCALER_FILE) for f, _, fn in raw)


def _pipeline_stage(raw: list[tuple[str, int, str]]) -> str | None:
    """The innermost torchrec train pipeline stage the stack is in, if any."""
    for file, _, function in raw:
        if torchrec.PIPELINE_DIR in file:
            stage = torchrec.STAGES.get(function.rpartition(".")[2])
            if stage is not None:
                return stage
    return None


def remember_forward(output, frames: tuple[Frame, ...], module: str | None,
                     since: int | None = None) -> None:
    """Store where an op ran in forward on its autograd node, so a sync in its backward is
    reported at that forward line (e.g. `x[mask]`, whose backward runs nonzero again). With
    `since` (autograd's sequence number when the op began), also on the nodes the op made
    inside: a composite's own (ctc_loss's CtcLossBackward0 under its mean's node), numbered
    from `since` on, where the nodes of its inputs, made before, are not."""
    outs = output if isinstance(output, (tuple, list)) else (output,)
    end = torch._C._autograd._get_sequence_nr()
    for out in outs:
        fn = getattr(out, "grad_fn", None) if isinstance(out, torch.Tensor) else None
        todo = [fn] if fn is not None else []
        while todo:
            node = todo.pop()
            if NODE_KEY not in node.metadata:
                node.metadata[NODE_KEY] = (frames, module)
            if since is None:
                break
            todo += [n for n, _ in node.next_functions
                     if n is not None and since <= n._sequence_nr() < end]
