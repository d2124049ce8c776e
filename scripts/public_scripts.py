"""Run public PyTorch training scripts plainly and under `gpusync scan`, the way users meet it.

    python scripts/public_scripts.py [--root /work/public_scripts] [--only NAME ...]

For each script in the manifest (scripts/public_scripts.yaml) this runs `python SCRIPT ARGS` and
`python -m gpusync scan SCRIPT --format json -- ARGS` in the script's folder, compares the
script's own output (plain stdout+stderr vs the scan's stderr less gpusync's own lines) and exit
status, and checks the reported sites against the manifest's expected ones. It prints a table
and writes docs/public-scripts.md. The scripts themselves live outside the repository (their
licences are their authors'); the manifest names each one's repository, path and commit.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import difflib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
# gpusync's own stderr lines: progress ("gpusync scan: scanning x (5s elapsed)"), notes and
# errors ("gpusync: ..."), the observer build message. A script's output never starts so.
GPUSYNC_LINE = re.compile(r"^gpusync( [a-z]+)?: ")
PER_STEP_TOLERANCE = 0.005


@dataclass
class Run:
    rc: int
    lines: list[str]
    report: dict[str, Any] | None = None
    timed_out: bool = False


@dataclass
class Result:
    name: str
    entry: dict[str, Any]
    plain: Run
    scan: Run
    output_same: str = ""
    diff: list[str] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    false_alarms: list[str] = field(default_factory=list)
    verdict: str = ""


def run_env(root: Path, entry: dict[str, Any]) -> dict[str, str]:
    """The environment both runs share: one thread, unbuffered output (so stdout and stderr
    interleave the same way in both), the manifest's PYTHONPATH entries (relative to the
    script's folder) after this checkout's gpusync, then the caller's."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "PYTHONHASHSEED": "0"})
    cwd = root / entry["dir"]
    paths = [str(REPO)] + [str((cwd / p).resolve()) for p in entry.get("pythonpath", [])]
    # what the caller's PYTHONPATH adds (a GPU machine's carried wheels) stays, after these
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update({k: str(v) for k, v in (entry.get("env") or {}).items()})
    return env


def execute(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float,
            merge: bool) -> tuple[int, str, str, bool]:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, text=True,
                              errors="replace", stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT if merge else subprocess.PIPE)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return -1, out, err, True
    return proc.returncode, proc.stdout, proc.stderr or "", False


def normalise(text: str, entry: dict[str, Any]) -> list[str]:
    """The manifest's `normalize` pairs (regex, replacement) run on both outputs: timings, and
    what the GPU branch prints differently by design (the device's name)."""
    rules = [(re.compile(p), r) for p, r in entry.get("normalize", [])]
    drops = [re.compile(p) for p in entry.get("drop", [])]
    out = []
    for line in text.splitlines():
        for pattern, repl in rules:
            line = pattern.sub(repl, line)
        if not any(d.search(line) for d in drops):
            out.append(line.rstrip())
    return out


def run_plain(root: Path, entry: dict[str, Any], python: str, timeout: float) -> Run:
    cmd = [python, entry["script"], *map(str, entry.get("args", []))]
    rc, out, _, timed_out = execute(cmd, root / entry["dir"], run_env(root, entry), timeout, True)
    return Run(rc, normalise(out, entry), timed_out=timed_out)


def run_scan(root: Path, entry: dict[str, Any], python: str, timeout: float) -> Run:
    cmd = [python, "-m", "gpusync", "scan", entry["script"], "--format", "json",
           *map(str, entry.get("scan_options", [])), "--",
           *map(str, entry.get("scan_args", entry.get("args", [])))]
    rc, out, err, timed_out = execute(cmd, root / entry["dir"], run_env(root, entry), timeout,
                                      False)
    # keepends: the script's last line may be empty ('...\n\n'); a join on "\n" would lose it
    own = "".join(line for line in err.splitlines(keepends=True)
                  if not GPUSYNC_LINE.match(line))
    try:
        report = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        report = None
    return Run(rc, normalise(own, entry), report, timed_out)


def compare_output(res: Result) -> None:
    plain, scan = res.plain, res.scan
    if res.entry.get("not_compared"):
        # The script's GPU branch computes something else (e.g. a loader that shuffles only
        # with an accelerator): only the exit status can be compared.
        same = (plain.rc == 0) == (scan.rc == 0) and not scan.timed_out
        res.output_same = "not compared" + ("" if same else f", exit {plain.rc} vs {scan.rc}")
        return
    same_rc = (plain.rc == 0) == (scan.rc == 0) and not scan.timed_out
    if plain.lines == scan.lines:
        res.output_same = "identical" if same_rc else f"identical, exit {plain.rc} vs {scan.rc}"
        return
    res.diff = list(difflib.unified_diff(plain.lines, scan.lines, "plain", "scan", n=1,
                                         lineterm=""))[:40]
    order = "same lines, other order" if sorted(plain.lines) == sorted(scan.lines) else "differs"
    res.output_same = order if same_rc else f"{order}, exit {plain.rc} vs {scan.rc}"


def site_key(site: dict[str, Any], cwd: Path) -> str:
    path = Path(site["file"])
    try:
        rel = path.resolve().relative_to(cwd.resolve()).as_posix()
    except ValueError:
        rel = path.as_posix()
    return f"{site['op']} @ {rel}:{site['line']}"


def describe(site: dict[str, Any], key: str) -> str:
    where = "setup" if site.get("setup") else f"{site.get('per_step')}/step"
    process = f", {site['process']}" if site.get("process") else ""
    return f"{key} [{site.get('phase')}, {where}, count {site.get('count', '?')}{process}]"


def check_site(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """What differs between an expected site and the reported one at the same op and line."""
    wrong = []
    if "phase" in want and want["phase"] != got["phase"]:
        wrong.append(f"phase {got['phase']} (expected {want['phase']})")
    if bool(want.get("setup", False)) != bool(got.get("setup")):
        wrong.append(f"setup {got.get('setup')} (expected {bool(want.get('setup', False))})")
    if "per_step" in want and abs(float(want["per_step"]) - float(got["per_step"])) > \
            PER_STEP_TOLERANCE:
        wrong.append(f"per_step {got['per_step']} (expected {want['per_step']})")
    if "count" in want and int(want["count"]) != int(got["count"]):
        wrong.append(f"count {got['count']} (expected {want['count']})")
    # `spawned: true`: made in a process the script spawned (the site's `process`)
    if bool(want.get("spawned", False)) != bool(got.get("process")):
        wrong.append(f"process {got.get('process')} (expected "
                     f"{'a spawned one' if want.get('spawned') else 'the scanned one'})")
    return wrong


def library_name(site: dict[str, Any]) -> str:
    lib = site.get("library")
    return f"{Path(lib['file']).name}:{lib['function']}" if lib else ""


def pick(want: dict[str, Any], candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The reported site an expected one names: same op and line (and phase, module or library
    frame where the manifest gives them, for two sites on one line); the one whose figures
    agree first."""
    fits = [c for c in candidates
            if want.get("phase", c["phase"]) == c["phase"]
            and want.get("module", c.get("module")) == c.get("module")
            and want.get("library", library_name(c)) == library_name(c)]
    for site in fits:
        if not check_site(want, site):
            return site
    return fits[0] if fits else None


def compare_sites(res: Result, root: Path) -> None:
    cwd = root / res.entry["dir"]
    reported: dict[str, list[dict[str, Any]]] = {}
    for site in (res.scan.report or {}).get("sites", []):
        reported.setdefault(site_key(site, cwd), []).append(site)
    for want in res.entry.get("expected_sites", []):
        key = f"{want['op']} @ {want['file']}:{want['line']}"
        got = pick(want, reported.get(key, []))
        if got is None:
            res.misses.append(describe(want, key))
            continue
        reported[key].remove(got)
        wrong = check_site(want, got)
        (res.mismatched if wrong else res.matched).append(
            f"{key}: {', '.join(wrong)}" if wrong else key)
    res.false_alarms = [describe(site, key) for key, sites in reported.items()
                        for site in sites]


def judge(res: Result) -> None:
    report = res.scan.report
    if res.scan.timed_out:
        res.verdict = "TIMEOUT under scan"
    elif report is None:
        res.verdict = f"CRASH: no report (exit {res.scan.rc})"
    elif report.get("error") and res.plain.rc == 0:
        res.verdict = f"CRASH under scan: {str(report['error']).splitlines()[0][:90]}"
    elif res.output_same not in ("identical", "not compared"):
        res.verdict = "OUTPUT DIFFERS"
    elif res.misses or res.false_alarms or res.mismatched:
        res.verdict = "sites differ"
    else:
        res.verdict = "ok"


def run_one(root: Path, entry: dict[str, Any], python: str, timeout: float) -> Result:
    plain = run_plain(root, entry, python, timeout)
    scan = run_scan(root, entry, python, timeout)
    res = Result(entry["name"], entry, plain, scan)
    compare_output(res)
    compare_sites(res, root)
    judge(res)
    return res


def gpusync_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                              text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "gpusync") else "")


def table_rows(results: list[Result]) -> list[list[str]]:
    rows = []
    for r in results:
        sites = (r.scan.report or {}).get("sites", [])
        rows.append([r.name, r.output_same, f"exit {r.plain.rc}/{r.scan.rc}", str(len(sites)),
                     f"{len(r.matched)}/{len(r.entry.get('expected_sites', []))}",
                     str(len(r.misses) + len(r.mismatched)), str(len(r.false_alarms)),
                     r.verdict])
    return rows


HEADER = ["script", "output plain vs scan", "exit plain/scan", "sites", "expected matched",
          "misses", "false alarms", "verdict"]


def print_table(results: list[Result]) -> None:
    rows = [HEADER] + table_rows(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def doc_details(r: Result) -> list[str]:
    e = r.entry
    src = e["source"]
    out = [f"### {r.name}", "",
           f"- source: `{src['repo']}` `{src['path']}` at `{src['commit']}`",
           f"- exercises: {e.get('exercises', '')}",
           f"- edits: {e.get('edits', 'none')}",
           f"- command: `python {e['script']} {' '.join(map(str, e.get('args', [])))}`"
           f" (in `{e['dir']}/`)",
           f"- output: {r.output_same}; exit plain {r.plain.rc}, scan {r.scan.rc}; "
           f"verdict: **{r.verdict}**"]
    for title, items in (("matched", r.matched), ("wrong figures", r.mismatched),
                         ("misses", r.misses), ("false alarms", r.false_alarms)):
        if items:
            out.append(f"- {title}: " + "; ".join(f"`{i}`" for i in items))
    if r.diff:
        out += ["", "```diff", *r.diff, "```"]
    notes = str(e.get("notes", "")).strip()
    if notes:
        out += ["", notes]
    return out + [""]


def doc_classes(classes: list[dict[str, Any]]) -> list[str]:
    out = ["## Classes found, with minimal repros", "",
           "Run each repro plainly and under `python -m gpusync scan FILE` (a repro that",
           "names \"cuda\" runs on a GPU or under the scan only).", ""]
    for c in classes:
        out += [f"### {c['name']} ({c['status']})", "",
                f"- scripts: {', '.join(c.get('scripts', []))}",
                f"- effect: {c['effect']}", "", "```python", c["repro"].rstrip(), "```", ""]
    return out


def write_doc(path: Path, results: list[Result], python: str, manifest: dict[str, Any],
              manifest_path: Path) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = manifest.get("title", "gpusync scan on public PyTorch training scripts")
    where = manifest_path.resolve().relative_to(REPO) if manifest_path.resolve().is_relative_to(
        REPO) else manifest_path
    lines = [f"# {title}", "",
             f"Run {now}, gpusync commit {gpusync_commit()}, torch "
             f"{subprocess.run([python, '-c', 'import torch; print(torch.__version__)'], capture_output=True, text=True).stdout.strip()}.",  # noqa: E501
             *([manifest["intro"].rstrip(), ""] if manifest.get("intro") else []),
             f"Generated by `python scripts/public_scripts.py` from `{where}`",
             "(each script run plainly and under `gpusync scan --format json`; see the script's",
             "docstring). Expected sites are read off each script against CUDA's kernels; the",
             "reasoning is in each entry's notes. Plain runs take the CPU branch, scans the",
             "virtual GPU's, so lines that print the device are normalised (`normalize` in the",
             "manifest). Re-run the whole campaign from the repository root with",
             "`PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python scripts/public_scripts.py",
             "--root DIR`, DIR holding each script fetched at the commit the manifest names",
             "(with the edits its `edits` field lists, the stand-ins for packages the venv",
             "lacks in `DIR/_stubs/site-packages`, and `DIR/PATCHES.md` listing every edit).",
             "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    lines += ["", "## Per script", ""]
    for r in results:
        lines += doc_details(r)
    lines += doc_classes(manifest.get("classes", []))
    path.write_text("\n".join(lines))


def run_all(root: Path, entries: list[dict[str, Any]], python: str, timeout: float,
            jobs: int) -> list[Result]:
    """Every entry's result, in the manifest's order; with jobs > 1 several folders at once
    (a GPU machine's cores), each folder's entries one after another."""
    def folder(group: list[dict[str, Any]]) -> list[Result]:
        out = []
        for entry in group:
            print(f"== {entry['name']}", file=sys.stderr, flush=True)
            out.append(run_one(root, entry, python, timeout))
        return out

    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(entry["dir"], []).append(entry)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = dict(zip(groups, pool.map(folder, groups.values()), strict=True))
    by_name = {r.name: r for results in done.values() for r in results}
    return [by_name[e["name"]] for e in entries]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/work/public_scripts", help="folder of fetched scripts")
    ap.add_argument("--manifest", default=str(REPO / "scripts" / "public_scripts.yaml"))
    ap.add_argument("--only", nargs="*", help="names to run (default: all)")
    ap.add_argument("--doc", default=None,
                    help="markdown to write (default: docs/ and the manifest's name, "
                         "public_scripts.yaml -> docs/public-scripts.md, when every script "
                         "runs, none with --only; '' for none)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--jobs", type=int, default=1,
                    help="folders run at once (a folder's scripts run in order: dlrm_resume "
                         "reads what dlrm wrote)")
    ap.add_argument("--scan-option", action="append", default=[], metavar="OPTION",
                    help="one more option for every scan (repeat it; e.g. --scan-option=--gpu "
                         "--scan-option=h100: the same checks with the cost model recording)")
    args = ap.parse_args(argv)
    root = Path(args.root)
    manifest = yaml.safe_load(Path(args.manifest).read_text())
    entries = manifest["scripts"]
    if args.only:
        entries = [e for e in entries if e["name"] in args.only]
    if args.scan_option:
        entries = [{**e, "scan_options": [*e.get("scan_options", []), *args.scan_option]}
                   for e in entries]
    results = run_all(root, entries, args.python, args.timeout, args.jobs)
    sys.stderr.flush()
    print_table(results)
    for r in results:
        if r.diff:
            print(f"\n{r.name}:\n" + "\n".join(r.diff[:20]))
    # the manifest's own document: a framework run wrote over the public scripts' table
    default = REPO / "docs" / (Path(args.manifest).stem.replace("_", "-") + ".md")
    doc = args.doc if args.doc is not None else ("" if args.only else str(default))
    if doc:
        write_doc(Path(doc), results, args.python, manifest, Path(args.manifest))
    return 0 if all(r.verdict == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
