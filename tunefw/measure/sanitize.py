"""`tunefw verify --sanitize memcheck,racecheck`: the verification once more per tool under
NVIDIA's compute-sanitizer (memcheck: out-of-bounds and misaligned device accesses; racecheck:
shared-memory hazards), recording each tool's error count and the verdicts of its run.

The sanitized program is this module (``python -m tunefw.measure.sanitize JOBS OUT
[CACHE_DIR]``, JOBS a file of the jobs and the --families file): it verifies the jobs as
`tunefw verify` does, each in an isolated GPU worker (a process the sanitizer follows), and
writes the result file."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tunefw.errors import UserError
from tunefw.measure.verify import Job, run_verify, status_counts
from tunefw.templates.family_module import FamilyModule, load_family_module

TOOLS = ("memcheck", "racecheck")
JOB_TIMEOUT_S = 600.0  # per job: under racecheck a kernel with much shared memory crawls
REPORT_LINES = 20  # of the sanitizer's own lines (its first findings), kept per tool
PREFIX = "========= "
# Anchored at the line's end: past --print-limit a second line says "ERROR SUMMARY: N errors
# were not printed. ...", which is not the total.
_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) errors?\s*$", re.MULTILINE)
_HAZARDS = re.compile(r"RACECHECK SUMMARY: .*\((\d+) errors?, \d+ warnings?\)")


def parse_tools(text: str) -> list[str]:
    """The tools of --sanitize (comma-separated, each once, in the order given)."""
    tools = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if not tools or unknown:
        raise UserError(f"--sanitize {text!r}: expected {', '.join(TOOLS)} or both, "
                        "comma-separated")
    return list(dict.fromkeys(tools))


def sanitizer() -> str:
    """The compute-sanitizer on PATH."""
    found = shutil.which("compute-sanitizer")
    if found is None:
        raise UserError("--sanitize needs compute-sanitizer on PATH (it ships with the CUDA "
                        "toolkit, in its bin directory)")
    return found


def errors_in(tool: str, text: str) -> int | None:
    """The errors a run's summaries count (memcheck 'ERROR SUMMARY: N errors', racecheck
    'RACECHECK SUMMARY: ... (N errors, M warnings)', one per process), or None if none printed."""
    found = (_HAZARDS.findall(text) if tool == "racecheck" else []) or _ERRORS.findall(text)
    return sum(int(n) for n in found) if found else None


def report_lines(text: str) -> list[str]:
    """The sanitizer's own lines, summaries and its banner left out: its findings first."""
    lines = [line[len(PREFIX):].rstrip() for line in text.splitlines() if line.startswith(PREFIX)]
    kept = [line for line in lines if line.strip() and line != "COMPUTE-SANITIZER"
            and "SUMMARY: " not in line]
    return kept[:REPORT_LINES]


def tool_result(tool: str, text: str, rows: list[dict], expected: int,
                exit_code: int | None, note: str | None = None) -> dict:
    """One tool's entry of the result file, from what its run printed (``text``) and the rows
    its verification wrote (of ``expected``): clean means no error and every job verified."""
    errors = errors_in(tool, text)
    if note is None and errors is None:
        note = "the sanitizer printed no summary"
    if note is None and len(rows) < expected:
        said = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(PREFIX.strip())]
        note = (f"verified {len(rows)} of {expected} jobs (exit {exit_code})"
                + (f": {said[-1].strip()[:200]}" if said else ""))
    return {"tool": tool, "errors": errors, "clean": errors == 0 and len(rows) == expected,
            "verified": len(rows), "statuses": status_counts(rows),
            "all_ok": len(rows) == expected and all(r["status"] == "OK" for r in rows),
            "exit_code": exit_code, "note": note, "report": report_lines(text),
            "verdicts": [r["status"] for r in rows]}


def verdict(entry: dict) -> str:
    """A tool's result in a few words: clean, or what was wrong."""
    if entry["note"]:
        return f"NOT CLEAN: {entry['note']}"
    if entry["errors"]:
        return f"NOT CLEAN: {entry['errors']} error(s)"
    return "clean" if entry["all_ok"] else "clean (but not every verdict is OK)"


def _child_env() -> dict:
    """The child imports this tunefw, and PyTorch allocates each tensor by itself (so memcheck
    sees every buffer's own bounds, not a cached block around it)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


def run_tool(tool: str, jobs: list[Job], cache_dir: str | None = None,
             timeout_s: float | None = None, families: FamilyModule | None = None) -> dict:
    """Verify ``jobs`` under one tool (the run and its workers killed after ``timeout_s``);
    its entry of the result file."""
    with tempfile.TemporaryDirectory(prefix="tunefw-sanitize-") as tmp:
        jobs_path, out_path = Path(tmp) / "jobs.json", Path(tmp) / "result.json"
        module = families and families.path
        jobs_path.write_text(json.dumps({"jobs": [j.as_dict() for j in jobs],
                                         "families": str(module) if module else None}))
        # API errors off: cuda-bindings' cuInit probes every driver entry point with
        # cuGetProcAddress, and memcheck counted each missing one (34 "errors", none a kernel's).
        cmd = [sanitizer(), f"--tool={tool}", "--target-processes=all", "--print-limit=20",
               "--report-api-errors=no", sys.executable, "-m", "tunefw.measure.sanitize",
               str(jobs_path), str(out_path), *([cache_dir] if cache_dir else [])]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=_child_env(), start_new_session=True)
        note = None
        try:
            text, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
            note = f"stopped after {timeout_s:g} s"
        rows = json.loads(out_path.read_text())["rows"] if out_path.is_file() else []
    return tool_result(tool, text, rows, len(jobs), proc.returncode, note)


def sanitize(result: dict, jobs: list[Job], tools: list[str],
             cache_dir: str | None = None, families: FamilyModule | None = None) -> None:
    """Add each tool's entry to a `tunefw verify` result (its "sanitize" list and "clean"), and
    to each row its verdict under each tool."""
    entries = [run_tool(tool, jobs, cache_dir, families=families) for tool in tools]
    for i, row in enumerate(result["rows"]):
        row["sanitize"] = {e["tool"]: (e["verdicts"][i] if i < len(e["verdicts"]) else None)
                           for e in entries}
    for entry in entries:
        del entry["verdicts"]  # in the rows now
    result["sanitize"] = entries
    result["sanitize_clean"] = all(e["clean"] and e["all_ok"] for e in entries)


def main(argv: list[str]) -> int:
    """The sanitized program: verify the jobs of JOBS, write the result file OUT."""
    jobs_path, out_path, *cache = argv
    request = json.loads(Path(jobs_path).read_text())
    jobs = [Job.from_dict(d) for d in request["jobs"]]
    result = run_verify(jobs, cache[0] if cache else None, timeout_s=JOB_TIMEOUT_S,
                        families=load_family_module(request["families"]))
    Path(out_path).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
