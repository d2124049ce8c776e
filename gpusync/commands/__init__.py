"""gpusync's subcommands, one module each (memray's Command): a module holds its click
command (options and a run function that parses them and calls the library); cli.py adds
them to the `gpusync` group. Shared option helpers: options.py; what commands do alike
(torchrun, the scanned code's failure): common.py."""
from . import baseline, bench, fix, gate, host_probe, profiles, run, scan, tune

COMMANDS = (scan.scan_command, baseline.baseline_command, gate.gate_command, tune.tune_command,
            fix.fix_command, run.run_command, profiles.profiles_command, bench.bench_group,
            host_probe.host_probe_command)
