"""`gpusync bench`: time the built-in techniques' variants (one, or all), or the scanner's
overhead on a profile."""
from __future__ import annotations

import click

from .. import errors
from ..errors import GpusyncError
from ..reporters import render_as
from .common import echo
from .options import device_of, format_option, mode_option, technique_options, verbosity_options


@click.group("bench")
@verbosity_options
def bench_group():
    """Time the built-in techniques' naive and optimized forms, or the scanner's overhead."""


def run_techniques(names, mode, steps, repeats, fmt, every=False) -> str | None:
    """The techniques' report. Under torchrun, collectives runs first, on every rank (its
    process group is torchrun's); the others run on rank 0 only; other ranks return None."""
    from ..bench.techniques import TECHNIQUES
    from ..progress import Progress
    from ..reporters.bench import BenchRun
    from ..runs import torchrun_env

    device = device_of(mode)
    env = torchrun_env()
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
                if not every:
                    raise
                not_run[name] = str(e)  # `all` measures what this machine can run
    return render_as("bench", BenchRun(results, not_run, every), fmt)


def _technique_command(name: str) -> None:
    @technique_options("bench")
    def technique_command(mode, steps, repeats, fmt):
        echo(run_techniques([name], mode, steps, repeats, fmt))

    technique_command.__doc__ = f"Measure the {name} technique's variants (naive first)."
    bench_group.command(name)(verbosity_options(technique_command))


# bench/techniques.py's TECHNIQUES, by name: the subcommands exist before torch is imported
# (tests/unit/test_torch_free.py checks the two agree)
TECHNIQUE_NAMES = ("writeback", "streamer", "pipeline", "torchrec_pipeline", "collectives")


def _register_techniques() -> None:
    for name in TECHNIQUE_NAMES:
        _technique_command(name)


@bench_group.command("all")
@verbosity_options
@technique_options("bench")
def bench_all(mode, steps, repeats, fmt):
    """Measure every technique."""
    from ..bench.techniques import TECHNIQUES

    echo(run_techniques(list(TECHNIQUES), mode, steps, repeats, fmt, every=True))


@bench_group.command("overhead")
@verbosity_options
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--profile", default="sparsenn", show_default=True)
@mode_option(help="Where the scanned steps run, as for scan.")
@format_option("overhead", "table")
def overhead(steps, warmup, profile, mode, fmt):
    """Step time of a profile with and without the scanner, interleaved in one process."""
    from ..bench.overhead import measure_overhead

    try:
        result = measure_overhead(profile, steps=steps, warmup=warmup, mode=mode)
    except GpusyncError:
        raise
    except (Exception, SystemExit) as e:  # the workload's own code: exit 3, where it raised
        import traceback

        from ..runs.results import raised_at

        where = raised_at("".join(traceback.format_exception(e)))
        raise errors.UserCodeError(f"the workload raised {type(e).__name__}: {e}{where}",
                                   e) from None
    click.echo(render_as("overhead", result, fmt))


_register_techniques()
