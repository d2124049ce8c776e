"""--mode says where the code runs for every command (commands/options.py mode_option); the
--device cpu|cuda that tune and bench took before is kept, hidden, for a release: it becomes
the --mode it meant, with a note on stderr."""
import click
import pytest
import torch

from gpusync.cli import cli
from gpusync.modes import MODES
from tests.conftest import run_main
from tests.unit.test_json_contract import _fake_technique

COMMANDS = [("scan",), ("baseline",), ("gate",), ("fix",), ("tune",), ("bench", "writeback"),
            ("bench", "all"), ("bench", "overhead")]


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_spells_where_it_runs_as_mode(path):
    options = {p.name: p for p in _command(path).params if isinstance(p, click.Option)}
    mode = options["mode"]
    assert mode.opts == ["--mode"] and list(mode.type.choices) == list(MODES)
    device = options.get("device")
    assert device is None or device.hidden  # the old spelling, never shown in --help
    assert "--device" not in _command(path).get_help(click.Context(_command(path)))


@pytest.fixture
def devices(monkeypatch):
    """The device each benchmark run was given, the technique a fake."""
    from gpusync.bench import techniques

    seen = []

    def fake(device, steps, repeats, progress=None):
        seen.append(device)
        return _fake_technique(device, steps, repeats, progress)

    monkeypatch.setitem(techniques.TECHNIQUES, "writeback", fake)
    return seen


@pytest.mark.parametrize("args,old", [(["--mode", "simulate"], False),
                                      (["--device", "cpu"], True),
                                      (["--device", "cpu", "--mode", "simulate"], True)])
def test_bench_runs_on_the_cpu_for_either_spelling(devices, args, old):
    proc = run_main("bench", "writeback", *args, "--steps", "1", "--repeats", "2",
                    "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert devices == ["cpu"]
    assert ("--device is deprecated and will be removed: use --mode simulate" in proc.stderr
            ) is old


def test_the_old_spelling_and_another_mode_is_bad_input(devices):
    proc = run_main("bench", "writeback", "--device", "cpu", "--mode", "cuda")
    assert proc.returncode == 2 and devices == []
    assert "--device cpu is the old spelling of --mode simulate" in proc.stderr
    assert "give --mode only" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="has a GPU")
@pytest.mark.parametrize("args", [["--mode", "cuda"], ["--device", "cuda"]])
def test_cuda_without_a_gpu_is_bad_input_for_either_spelling(devices, args):
    proc = run_main("bench", "writeback", *args)
    assert proc.returncode == 2 and devices == []
    assert "--mode cuda needs a CUDA device, and torch sees none" in proc.stderr


@pytest.mark.parametrize("args,mode", [(["--mode", "simulate"], "simulate"),
                                       (["--device", "cpu"], "simulate"),
                                       ([], "cuda" if torch.cuda.is_available() else "simulate")])
def test_tune_hands_the_resolved_mode_to_its_plan(monkeypatch, tmp_path, args, mode):
    from gpusync import tune_script
    from gpusync.errors import BadInput

    plans = []

    def stop(plan, rule, lead=None):
        plans.append(plan)
        raise BadInput("stopped by the test")

    monkeypatch.setattr(tune_script, "tune_script", stop)
    (tmp_path / "train.py").write_text("pass\n")
    proc = run_main("tune", "train.py", *args, cwd=tmp_path)
    assert proc.returncode == 2 and "stopped by the test" in proc.stderr
    assert [p.mode for p in plans] == [mode]
