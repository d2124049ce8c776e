"""gpusync's subcommands, one module each (memray's Command): a module holds its click
command (options and a run function that parses them and calls the library); cli.py adds
them to the `gpusync` group. Shared option helpers: options.py; what commands do alike
(torchrun, the scanned code's failure): common.py."""
from . import baseline, bench, gate, profiles, run, scan, tune

COMMANDS = (scan.command, baseline.command, gate.command, tune.command, run.command,
            profiles.command, bench.group)
