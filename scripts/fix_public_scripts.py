"""Run `gpusync fix` on the public training scripts of scripts/public_scripts.yaml, the way a
user meets it, and check what it offers.

    python scripts/fix_public_scripts.py [--root /work/public_scripts] [--only NAME ...] [--jobs 2]

For each script (its folder copied to a temporary one: the fetched files are never changed)
this runs `python -m gpusync fix SCRIPT --format json -- ARGS`, checks that `git apply`
takes the patch in the copy, applies it, scans the patched script and compares its syncs per
step with what fix reported. It prints a table (patches kept / dropped / refused per script,
syncs per step before and after) and, without --only, writes docs/fix-public.md. The patches
themselves (lines of the authors' code) stay in the temporary folder (--keep to look at them).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from public_scripts import REPO, execute, run_env  # noqa: E402


def _fix(copy: Path, root: Path, entry: dict[str, Any], python: str, timeout: float
         ) -> dict[str, Any]:
    env = run_env(copy.parent, {**entry, "dir": copy.name})
    # the scan's arguments where the manifest has them (a script that uses the GPU only when
    # told to: char_rnn's --cuda), as scripts/public_scripts.py scans it
    args = [*map(str, entry.get("scan_args", entry.get("args", [])))]
    cmd = [python, "-m", "gpusync", "fix", entry["script"], "--format", "json", "-o",
           "fix.json", "--", *args]
    rc, _, err, timed_out = execute(cmd, copy, env, timeout, False)
    out: dict[str, Any] = {"name": entry["name"], "rc": rc, "timed_out": timed_out,
                           "error": "" if rc == 0 else err.strip().splitlines()[-1:]}
    if rc != 0 or not (copy / "fix.json").exists():
        return out
    data = json.loads((copy / "fix.json").read_text())
    out["fix"] = data
    if data["diff"]:
        (copy / "fix.patch").write_text(data["diff"])
        subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
        check = subprocess.run(["git", "apply", "fix.patch"], cwd=copy, text=True,
                               capture_output=True)
        out["git_apply"] = check.returncode == 0 or check.stderr.strip()
        scan = [python, "-m", "gpusync", "scan", entry["script"], "--format", "json", "--",
                *args]
        rc, stdout, _, _ = execute(scan, copy, env, timeout, False)
        out["rescan"] = json.loads(stdout)["syncs_per_step"] if rc == 0 and stdout else None
    return out


def _one(root: Path, entry: dict[str, Any], python: str, timeout: float, keep: Path | None
         ) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="gpusync-fixpub-", dir=keep))
    copy = folder / entry["dir"]
    shutil.copytree(root / entry["dir"], copy, symlinks=True)
    stubs = root / "_stubs"
    if stubs.exists():
        shutil.copytree(stubs, folder / "_stubs", symlinks=True)
    try:
        return _fix(copy, root, entry, python, timeout)
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def _row(r: dict[str, Any]) -> list[str]:
    fix = r.get("fix")
    if fix is None:
        return [r["name"], f"exit {r['rc']}" + (" (timed out)" if r["timed_out"] else ""),
                "", "", "", " ".join(r["error"])]
    spp = fix["syncs_per_step"]
    patches = "; ".join(f"{p['remedy']} at {p['sites'][0]['file']}:{p['sites'][0]['line']}"
                        for p in fix["patches"])
    dropped = "; ".join(f"{d['remedy']} at {d['site']['file']}:{d['site']['line']}: "
                        f"{d['reason']}" for d in fix["dropped"])
    refused = "; ".join(f"{x['remedy']} at {x['site']['file']}:{x['site']['line']}: "
                        f"{x['reason']}" for x in fix["refused"])
    after = "-" if spp["after"] is None else f"{spp['after']:g}"
    rescan = r.get("rescan")
    check = "" if not fix["patches"] else (
        f"git apply {'ok' if r.get('git_apply') is True else r.get('git_apply')}; "
        f"rescan {rescan:g}/step" if rescan is not None else "rescan failed")
    return [r["name"], f"{spp['before']:g} -> {after}", patches or "-", dropped or "-",
            refused or "-", check]


HEADER = ["script", "syncs/step", "patches kept", "dropped (why)", "refused (why)", "checked"]


def _doc(rows: list[list[str]], python: str) -> str:
    machine = f"{platform.platform()}, {os.cpu_count()} cores, no GPU: the virtual CUDA device"
    head = (f"# `gpusync fix` on public training scripts\n\nMade by `python "
            f"scripts/fix_public_scripts.py` on {datetime.date.today()} ({machine}); the "
            "scripts, their sources and edits are those of docs/public-scripts.md. Each "
            "kept patch was applied with `git apply` in a copy of the script's folder and "
            "the patched script scanned again.\n\n")
    table = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    table += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return head + "\n".join(table) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/work/public_scripts")
    ap.add_argument("--manifest", default=str(REPO / "scripts" / "public_scripts.yaml"))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--keep", help="keep each copy (with fix.json, fix.patch) under this folder")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(argv)
    entries = [e for e in yaml.safe_load(Path(args.manifest).read_text())["scripts"]
               if "script" in e and (not args.only or e["name"] in args.only)]
    keep = Path(args.keep).resolve() if args.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda e: _one(Path(args.root), e, args.python, args.timeout,
                                               keep), entries))
    rows = [_row(r) for r in results]
    for row in rows:
        print(" | ".join(row))
    if not args.only:
        (REPO / "docs" / "fix-public.md").write_text(_doc(rows, args.python))
    return 0 if all(r.get("fix") is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
