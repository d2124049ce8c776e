"""The `gpusync` command. Each command parses options and calls the library; main() is the one
place exceptions become exit codes (see errors.py and README "Exit codes")."""
from __future__ import annotations

import math
import os

import click

from . import errors, verbosity
from ._version import __version__
from .detect.session import MODES
from .errors import BadInput, GpusyncError
from .processes import Terminated
from .reporters import FORMATS, VIEWS, render


class Finite(click.FloatRange):
    """click's FloatRange lets NaN through (every comparison with NaN is false), and a NaN
    tolerance or significance level would make every check pass: refuse NaN and infinities."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _set_verbose(ctx, param, value):
    if value:
        verbosity.set_level(verbosity.VERBOSE)


def _set_quiet(ctx, param, value):
    if value:
        verbosity.set_level(verbosity.QUIET)


def _verbosity(fn):
    """-q / -v, taken before or after the subcommand's name."""
    fn = click.option("-v", "--verbose", is_flag=True, expose_value=False,
                      callback=_set_verbose,
                      help="Also show tracebacks of failures in your code, and warnings from "
                           "building gpusync's built-in workloads.")(fn)
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_quiet,
                        help="Show errors only (reports still go to stdout).")(fn)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpusync")
@_verbosity
def cli():
    """Find the host<-device syncs in a PyTorch training step, and remove them."""


@cli.command()
@_verbosity
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--steps", type=click.IntRange(min=1), help="Measured steps (after warm-up).")
@click.option("--warmup", type=click.IntRange(min=0), help="Steps run first and not averaged.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the report here.")
@click.option("--max-syncs-per-step", type=click.IntRange(min=0),
              help="Exit 1 when any measured step syncs more often than this.")
@click.option("--mode", type=click.Choice(MODES), default="auto", show_default=True,
              help="simulate: predict CUDA syncs on any machine; cuda: observe them on a GPU.")
@click.option("--show", type=click.Choice(VIEWS), default="user", show_default=True,
              help="Place each site at your line that leads to it, or at the library line "
                   "that synced (tables; JSON has both).")
@click.option("--trace", type=click.Path(dir_okay=False),
              help="Also write the scan as a Chrome / Perfetto trace (JSON trace events): "
                   "steps, phases and each sync on the host's timeline.")
@click.option("--rank-timeout", type=Finite(min=0), default=600.0, show_default=True,
              help="Under torchrun: how long rank 0 waits for the other ranks' reports "
                   "after its own scan, in seconds.")
@click.option("--virtual-cuda/--no-virtual-cuda", default=True, show_default=True,
              help="simulate mode, scripts: run on a virtual CUDA device so the script takes "
                   "the branch a GPU run takes (--no-virtual-cuda: judge its CPU branch).")
def scan(target, script_args, steps, warmup, fmt, output, max_syncs_per_step, mode, show,
         trace, rank_timeout, virtual_cuda):
    """Report every host<-device sync of TARGET's training steps.

    TARGET: a script (train.py, run as __main__; arguments after --), file.py:factory,
    pkg.module:factory, a profile .yaml, or a built-in profile name. Default: the built-in
    example (sparsenn).
    """
    from . import outputs, runs
    from .runs import torchrun as ranks

    env = ranks.torchrun_env()
    if runs.follow(env):
        return  # a rank other than 0: rank 0 writes the one merged report
    outputs.check(target, output=output, trace=trace)  # before the scan, not after
    with outputs.trace_file(trace) as child_trace, runs.leading(env, rank_timeout) as lead:
        outcome = runs.scan(target, steps, warmup, mode, script_args, virtual_cuda,
                            command="scan", trace=child_trace, lead=lead)
        if outcome.report is not None:
            text = render(outcome.report, fmt, show)
            if output:
                outputs.deliver(output, text, "report")
            else:
                click.echo(text, nl=False)
    _raise_user_error(outcome)
    report = outcome.report
    assert report is not None  # no failure: the scan finished and reported
    if max_syncs_per_step is not None and report.max_syncs_per_step > max_syncs_per_step:
        raise GpusyncError(f"{report.max_syncs_per_step} syncs in one step, more than "
                           f"--max-syncs-per-step {max_syncs_per_step}",
                           errors.EXIT_REGRESSION)


def _raise_user_error(outcome) -> None:
    """The scanned code raised or ended the run: exit 3 with one line saying where (with -v,
    its traceback first)."""
    if outcome.failure is not None:
        if verbosity.verbose():
            click.echo(outcome.traceback, err=True, nl=False)
        hint = "" if verbosity.verbose() or not outcome.traceback else " (-v: the traceback)"
        where = "" if outcome.located else errors.raised_at(outcome.traceback)
        raise errors.UserCodeError(outcome.failure + where + hint)


def _scan_or_fail(target, steps, warmup, mode, command, lead=None, script_args=()):
    """baseline and gate: stdout is theirs (a message, a verdict), so when the code fails,
    the report of what ran goes to stderr, before the traceback."""
    from . import runs

    outcome = runs.scan(target, steps, warmup, mode, script_args, command=command, lead=lead)
    if outcome.failure is not None and outcome.report is not None:
        click.echo(render(outcome.report, "table"), err=True, nl=False)
    _raise_user_error(outcome)
    return outcome.report


@cli.command("baseline")
@_verbosity
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="gpusync-baseline.json",
              show_default=True)
@click.option("--steps", type=click.IntRange(min=1))
@click.option("--warmup", type=click.IntRange(min=0))
@click.option("--mode", type=click.Choice(MODES), default="auto", show_default=True)
@click.option("--timing", is_flag=True, help="Also record step-time samples (unscanned run).")
@click.option("--timing-steps", type=click.IntRange(min=10), default=30, show_default=True)
@click.option("--rank-timeout", type=Finite(min=0), default=600.0, show_default=True,
              help="Under torchrun: how long rank 0 waits for the other ranks' reports.")
def baseline_cmd(target, script_args, output, steps, warmup, mode, timing, timing_steps,
                 rank_timeout):
    """Record TARGET's syncs per step (and step times) as a baseline for `gpusync gate`.
    A script's arguments go after --; the gate runs it with them again."""
    import json

    from . import baseline, outputs, runs
    from .runs import torchrun as ranks

    env = ranks.torchrun_env()
    if runs.follow(env):
        return  # a rank other than 0: rank 0 writes the baseline
    outputs.check(target, output=output)  # before the scan, not after
    with runs.leading(env, rank_timeout) as lead:
        report = _scan_or_fail(target, steps, warmup, mode, "baseline", lead, script_args)
        samples = None
        if timing:
            samples = runs.step_times(target, report.mode, timing_steps, 3, lead=lead,
                                      script_args=script_args)
    data = baseline.from_report(report, samples, timing_device=report.device, steps=steps,
                                script_args=script_args)
    outputs.deliver(output, json.dumps(data, indent=2) + "\n", "baseline", say=False)
    click.echo(f"baseline written to {output}: {len(data['sites'])} site(s), "
               f"{data['syncs_per_step']:g} syncs/step ({report.mode}, {report.device})")


class _AfterDashes(click.Command):
    """Keeps what followed `--` (ctx.meta["after_dashes"]): click hands it to the positional
    arguments, so `gate --baseline b.json -- --lr 3` would take `--lr` for the target."""

    def parse_args(self, ctx, args):
        ctx.meta["after_dashes"] = args[args.index("--") + 1:] if "--" in args else []
        return super().parse_args(ctx, args)


def _split_dashes(target, script_args) -> tuple:
    """(target, script_args) with the words after `--` all script arguments."""
    after = click.get_current_context().meta.get("after_dashes", [])
    words = [target, *script_args] if target is not None else list(script_args)
    if after and len(words) == len(after):  # no target before `--`
        return None, tuple(words)
    return target, tuple(script_args)


@cli.command("gate", cls=_AfterDashes)
@_verbosity
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--baseline", "baseline_path", type=click.Path(dir_okay=False), required=True)
@click.option("--time-factor", type=Finite(min=1.0), default=1.1, show_default=True,
              help="Slower by more than this factor (median) AND significant -> regression.")
@click.option("--p", "p_max", type=Finite(0, 1, min_open=True), default=0.002,
              show_default=True, help="Significance level of the one-sided Mann-Whitney test.")
@click.option("--max-noise", type=Finite(min=0), default=0.10, show_default=True,
              help="Refuse to judge timings whose relative IQR exceeds this.")
@click.option("--timing/--no-timing", default=None,
              help="Gate step times too (default: when the baseline has them).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "github"]), default="text",
              show_default=True)
@click.option("--steps", type=click.IntRange(min=1))
@click.option("--warmup", type=click.IntRange(min=0))
@click.option("--mode", type=click.Choice(MODES), help="Default: the baseline's mode.")
@click.option("--rank-timeout", type=Finite(min=0), default=600.0, show_default=True,
              help="Under torchrun: how long rank 0 waits for the other ranks' reports.")
def gate_cmd(target, script_args, baseline_path, time_factor, p_max, max_noise, timing, fmt,
             steps, warmup, mode, rank_timeout):
    """Compare TARGET (default: the baseline's target, with its arguments) with a baseline.
    Exit 0 pass, 1 regression (or an unrecorded improvement), 2 bad input, 4 cannot judge."""
    from . import gate, runs
    from .runs import torchrun as ranks

    env = ranks.torchrun_env()
    if runs.follow(env):
        return  # a rank other than 0: rank 0 gives the verdict
    target, script_args = _split_dashes(target, script_args)
    with runs.leading(env, rank_timeout) as lead:
        verdict = _gate(target, script_args, baseline_path, time_factor, p_max, max_noise,
                        timing, steps, warmup, mode, env, lead)
    click.echo(gate.render(verdict, fmt), nl=False)
    if verdict.exit_code:
        raise SystemExitCode(verdict.exit_code)


def _gate(target, script_args, baseline_path, time_factor, p_max, max_noise, timing, steps,
          warmup, mode, env, lead):
    import torch

    from . import baseline, gate, runs

    data = baseline.load(baseline_path)
    world = env.world if env is not None else 1
    if data.get("ranks", 1) != world:
        raise BadInput(f"baseline {baseline_path} was recorded on {data.get('ranks', 1)} "
                       f"rank(s), this run has {world}: record it again with as many")
    mode = mode or data.get("mode", "auto")
    if mode == "cuda" and not torch.cuda.is_available():
        return gate.Verdict(status=gate.CANNOT_JUDGE,
                            notes=["the baseline was measured on a GPU; this machine has none"])
    recorded = data.get("target") or None
    if target is None or (recorded is not None and _same_target(target, recorded)):
        target = recorded  # one target however it is spelled: the baseline's run, again
        script_args = script_args or tuple(data.get("script_args") or ())
    steps = steps or data.get("steps")
    warmup = warmup if warmup is not None else data.get("warmup")
    report = _scan_or_fail(target, steps, warmup, mode, "gate", lead, script_args)
    problems = gate.compare_counts(data, report)
    timing_result = None
    if timing or (timing is None and "timing" in data):
        if "timing" not in data:
            raise BadInput(f"baseline {baseline_path} has no timing samples "
                           "(record them with `gpusync baseline --timing`)")
        if not torch.cuda.is_available():
            timing_result = (gate.CANNOT_JUDGE, "no GPU: step times are not gated on a CPU")
        else:
            base = data["timing"]["samples_ms"]
            now = runs.step_times(target, "cuda", len(base), 3, command="gate", lead=lead,
                                  script_args=script_args)
            timing_result = gate.judge_timing(base, now, time_factor, p_max, max_noise)
    verdict = gate.combine(problems, timing_result)
    if verdict.only_improvements:
        try:
            verdict.suggested_baseline = baseline.suggest(data, report, baseline_path,
                                                          script_args)
        except BadInput as e:  # the verdict still stands, and is printed
            verdict.notes.append(f"the suggested baseline was not written: {e}")
    return verdict


def _same_target(a: str, b: str) -> bool:
    """`./x.py` and `x.py`, `dir/../f.py:make` and `f.py:make`: one file, one target."""
    from .fileio import same_file

    if a == b:
        return True
    (file_a, _, fn_a), (file_b, _, fn_b) = a.rpartition(":"), b.rpartition(":")
    if not (file_a and file_b and fn_a.isidentifier()):
        file_a, fn_a, file_b, fn_b = a, "", b, ""
    return fn_a == fn_b and os.path.isfile(file_a) and same_file(file_a, file_b)


class SystemExitCode(GpusyncError):
    """A verdict that is not a pass: the gate already printed why."""

    def __init__(self, code: int):
        super().__init__("", code)


def _device(device: str | None) -> str:
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda needs a CUDA device, and torch sees none")
    return device


@cli.command("profiles")
@_verbosity
def profiles_cmd():
    """List the built-in profiles."""
    from .profiles import builtin_names, find_builtin, load_profile

    for name in builtin_names():
        path = find_builtin(name)
        assert path is not None  # builtin_names lists the files find_builtin finds
        profile = load_profile(path)
        click.echo(f"{name:20} {profile.description}")


@cli.group()
@_verbosity
def bench():
    """Time the built-in techniques' naive and optimized forms, or the scanner's overhead."""


def _technique_options(fn):
    """The options every technique benchmark (and `bench all`) takes."""
    for option in reversed([
        click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
                     help="Default: cuda when available."),
        click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True,
                     help="Steps per sample (a sample is their mean)."),
        click.option("--repeats", type=click.IntRange(min=2), default=10, show_default=True,
                     help="Samples per variant."),
        click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "html"]),
                     default="table", show_default=True),
    ]):
        fn = option(fn)
    return fn


def _technique_command(name: str):
    @_technique_options
    def command(device, steps, repeats, fmt):
        _echo(_run_techniques([name], device, steps, repeats, fmt))

    command.__doc__ = f"Measure the {name} technique's variants (naive first)."
    return bench.command(name)(_verbosity(command))


def _run_techniques(names, device, steps, repeats, fmt) -> str | None:
    """The techniques' report. Under torchrun, collectives runs first, on every rank (its
    process group is torchrun's); the others run on rank 0 only; other ranks return None."""
    import json

    from .bench.render import technique_table
    from .bench.techniques import TECHNIQUES
    from .progress import Progress
    from .runs import torchrun as ranks

    device = _device(device)
    env = ranks.torchrun_env()
    if env is not None:
        names = sorted(names, key=lambda name: name != "collectives")
        if env.rank != 0:
            if "collectives" in names:
                TECHNIQUES["collectives"](device, steps, repeats)
            return None
    results, not_run = [], {}
    with Progress("gpusync bench", delay=5.0) as progress:
        for k, name in enumerate(names, 1):
            progress.stage(f"technique {k}/{len(names)}: {name}")
            try:
                results.append(TECHNIQUES[name](device, steps, repeats, progress=progress))
            except GpusyncError as e:
                if len(names) == 1:
                    raise
                not_run[name] = str(e)  # `all` measures what this machine can run
    if fmt == "json":
        from .schemas import document

        payload = [r.to_dict() for r in results]
        if len(names) == 1:
            return json.dumps(document("gpusync-bench", payload[0]), indent=2) + "\n"
        return json.dumps(document("gpusync-bench-all", {"results": payload,
                                                         "not_run": not_run}), indent=2) + "\n"
    if fmt == "html":
        from .reporters.html import render_bench

        return render_bench(results, not_run)
    text = "\n".join(technique_table(r, fmt) for r in results)
    return text + "".join(f"\nnot run: {name}: {why}\n" for name, why in not_run.items())


def _register_techniques():
    from .bench.techniques import TECHNIQUES

    for name in TECHNIQUES:
        _technique_command(name)

    @bench.command("all")
    @_verbosity
    @_technique_options
    def bench_all(device, steps, repeats, fmt):
        """Measure every technique."""
        _echo(_run_techniques(list(TECHNIQUES), device, steps, repeats, fmt))


def _echo(text: str | None) -> None:
    if text is not None:  # None: a rank other than 0 under torchrun, which prints nothing
        click.echo(text, nl=False)


@cli.command("tune")
@_verbosity
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@_technique_options
@click.option("--warmup", type=click.IntRange(min=1), default=2, show_default=True,
              help="Steps each candidate runs before it is timed (scripts and factories).")
@click.option("--allow-approximate", is_flag=True,
              help="Also consider candidates marked approximate (e.g. semi_sync).")
@click.option("--tolerance", type=Finite(min=0), default=0.0, show_default=True,
              help="Largest difference from the baseline's losses a candidate may have.")
@click.option("--p", "p_max", type=Finite(0, 1, min_open=True), default=0.01,
              show_default=True, help="Significance a candidate must reach to be chosen.")
@click.option("--min-gain", type=Finite(0, 1), default=0.02, show_default=True,
              help="Smallest median speed-up a candidate must show to be chosen.")
@click.option("--timeout", type=Finite(min=1), default=900, show_default=True,
              help="Seconds one candidate run may take before it is stopped as failed.")
@click.option("--emit", type=click.Choice(["env", "python", "yaml"]),
              help="Print only the chosen settings, in this form (scripts and factories).")
@click.option("--knob", "knob_specs", multiple=True, metavar="env:NAME=V1,V2|arg:--FLAG=V1,V2",
              help="Also try your own setting: an environment variable or a script flag.")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Write the tuned settings (YAML) here.")
def tune_cmd(target, script_args, device, steps, repeats, fmt, warmup, allow_approximate,
             tolerance, p_max, min_gain, timeout, emit, knob_specs, output):
    """Measure settings of TARGET and keep the fastest that keeps its results.

    TARGET: your training script (train.py, run unchanged; its arguments after --) or
    file.py:factory: gpusync finds the torchrec pipeline and fbgemm TBE knobs it builds and
    tries them. A profile (.yaml or built-in name) with a tune block: its candidates.
    Default: the built-in profile sparsenn_pipeline.
    """
    from . import outputs, runs
    from .runs import torchrun as ranks

    env = ranks.torchrun_env()
    if runs.follow(env):
        return  # a rank other than 0: rank 0 writes the verdict
    outputs.check(target, output=output)  # before minutes of measuring, not after
    device = _device(device)
    rule = {"allow_approximate": allow_approximate, "tolerance": tolerance, "p_max": p_max,
            "min_gain": min_gain}
    _warn_unreachable(repeats, p_max)
    profile = _tune_profile(target)
    if profile is not None and profile.candidates:
        if knob_specs or emit:
            raise BadInput("--knob and --emit are for scripts and factories; a profile's tune "
                           "block lists its own candidates")
        if script_args:
            raise BadInput("arguments after -- are only for script targets")
        if env is not None:
            raise BadInput("a profile's tune block runs in one process: run it without "
                           "torchrun (under torchrun, tune a script or factory)")
        from .tune import render, run_tune, tuned_profile_text

        profile, result, decision = run_tune(target, device, steps, repeats, **rule)
        click.echo(render(profile, result, decision, fmt), nl=False)
        if output:
            outputs.deliver(output, tuned_profile_text(profile, result, decision),
                            "tuned profile")
        return
    from . import tune_script
    from .knobs import user

    specs = [*(profile.knobs if profile is not None else []), *knob_specs]
    extra = tuple(user.parse(spec, tuple(script_args)) for spec in specs)
    plan = tune_script.Plan(target, tuple(script_args), "cuda" if device == "cuda" else "simulate",
                            block=steps, repeats=repeats, warmup=warmup, timeout=timeout,
                            extra=extra)
    # a rank waits for the others' candidate runs as long as one may take, and a minute
    with runs.leading(env, timeout + 60) as lead:
        tuned = tune_script.tune_script(plan, rule, lead=lead)
    if env is not None:
        tuned.command = f"torchrun --nproc_per_node {env.world} -m {tuned.command}"
        tuned.notes.append(f"measured on {env.world} ranks: each candidate ran on every rank "
                           "at once; a sample is the slowest rank's step time, parity holds "
                           "on every rank's losses, syncs per step are the largest rank's")
    if tuned.runs[0].status == "failed":
        base = tuned.runs[0]
        raise errors.UserCodeError(f"the script as it is could not be timed: {base.reason}"
                                   + (f"\n{base.output}" if base.output else ""))
    if verbosity.verbose():  # what each failed candidate printed last, its traceback included
        for run in tuned.runs:
            if run.status == "failed" and run.output:
                click.echo(f"gpusync tune: candidate {run.candidate.name} failed: {run.reason}\n"
                           f"{run.output}", err=True)
    click.echo(tune_script.emit_text(tuned, emit) if emit else tune_script.render(tuned, fmt),
               nl=False)
    if output:
        outputs.deliver(output, tune_script.tuned_text(tuned), "tuned settings")


def _tune_profile(target):
    """TARGET's profile, or None for a script or factory. A profile with tune candidates is
    tuned by them; anything else by knobs, a profile's own `knobs:` among them."""
    from .targets import parse_target
    from .tune import DEFAULT_TARGET

    return getattr(parse_target(target or DEFAULT_TARGET), "profile", None)


def _warn_unreachable(repeats: int, p_max: float) -> None:
    from .gate import mann_whitney_greater

    best = mann_whitney_greater([2.0 + i for i in range(repeats)], [float(-i) for i in
                                                                    range(repeats)])
    if best >= p_max:
        verbosity.info(f"gpusync: warning: with {repeats} samples per candidate no difference "
                       f"can reach p < {p_max:g} (the best possible is p={best:.2g}): the "
                       "script's own settings will be kept; use more --repeats")


@cli.command("run", context_settings={"ignore_unknown_options": True})
@_verbosity
@click.argument("tuned")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cmd(tuned, command):
    """Run a script with the settings `gpusync tune -o TUNED` chose, without editing it.

    COMMAND: `python train.py ARGS` (or `train.py ARGS`).
    """
    import sys

    from . import knobs
    from .targets import ScriptTarget, as_main, compile_script, other_script, parse_target
    from .tune_script import load_tuned

    settings = load_tuned(tuned)
    words = list(command)
    if words and words[0] in ("python", "python3", sys.executable):
        words = words[1:]
    if not words or not words[0].endswith(".py"):
        raise BadInput("gpusync run takes a script: gpusync run TUNED -- python train.py ARGS")
    target = parse_target(words[0])  # a clear error for a missing script
    if not isinstance(target, ScriptTarget):
        raise BadInput(f"gpusync run takes a script, not {words[0]}")
    warning = other_script(tuned, target.path)
    if warning:
        click.echo(f"gpusync run: warning: {warning}", err=True)
    code = compile_script(target.path)
    with knobs.applied(settings, {}), as_main(target.path, words) as globs:
        exec(code, globs)  # as `python train.py ARGS`: its folder first on sys.path


@bench.command("overhead")
@_verbosity
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--profile", default="sparsenn", show_default=True)
@click.option("--mode", type=click.Choice(MODES), default="auto", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def bench_overhead(steps, warmup, profile, mode, fmt):
    """Step time of a profile with and without the scanner, interleaved in one process."""
    import json

    from .bench.overhead import format_table, measure_overhead
    from .schemas import document

    try:
        result = measure_overhead(profile, steps=steps, warmup=warmup, mode=mode)
    except GpusyncError:
        raise
    except (Exception, SystemExit) as e:  # the workload's own code: exit 3, where it raised
        import traceback

        where = errors.raised_at("".join(traceback.format_exception(e)))
        raise errors.UserCodeError(f"the workload raised {type(e).__name__}: {e}{where}",
                                   e) from None
    click.echo(json.dumps(document("gpusync-overhead", result), indent=2) if fmt == "json"
               else format_table(result))


_register_techniques()


def main(argv=None) -> int:
    verbosity.set_level(verbosity.NORMAL)  # -q / -v set it again for this run
    try:
        cli.main(args=argv, prog_name="gpusync", standalone_mode=False)
        return errors.EXIT_OK
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.UsageError as e:
        hint = f" (try '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        click.echo(f"gpusync: error: {e.format_message()}{hint}", err=True)
        return errors.EXIT_BAD_INPUT
    except click.ClickException as e:
        click.echo(f"gpusync: error: {e.format_message()}", err=True)
        return errors.EXIT_BAD_INPUT
    except click.exceptions.Abort:
        click.echo("gpusync: interrupted", err=True)
        return errors.EXIT_INTERRUPTED
    except KeyboardInterrupt:
        click.echo("gpusync: interrupted", err=True)
        return errors.EXIT_INTERRUPTED
    except Terminated as e:  # SIGTERM / SIGHUP while a child ran: it has ended (processes.py)
        click.echo(f"gpusync: terminated by {e}", err=True)
        return e.exit_code
    except SystemExitCode as e:
        return e.exit_code
    except GpusyncError as e:
        original = getattr(e, "original", None)
        if original is not None and verbosity.verbose():
            import traceback

            click.echo("".join(traceback.format_exception(original)), err=True, nl=False)
        prefix = "gpusync: error: " if isinstance(e, BadInput) else "gpusync: "
        click.echo(f"{prefix}{e}", err=True)
        return e.exit_code

