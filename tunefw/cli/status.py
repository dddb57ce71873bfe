"""`tunefw status` (the studies' progress, who is launching them, their last launch's workers
and where idle GPU time went, recent errors; also as --json) and `tunefw db upgrade`."""
from __future__ import annotations

import typer

from tunefw.cli.common import JSON_HELP, open_db, out, state, takes_db
from tunefw.cli.render import launch_line, print_json, tag

db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
RECENT_ERRORS = 3


def status_data() -> list[dict]:
    """Per study: trials evaluated of the budget, the last launch's figures (per worker, idle
    time by cause), the result kind and the most recent failed trials."""
    from sqlalchemy import select
    from tunefw.report.data import result_kind
    from tunefw.store import queries as q
    from tunefw.store.lease import db_now, holder_of
    from tunefw.store.models import Trial
    rows = []
    with open_db().session() as s:
        now = db_now(s.connection())
        for study in q.list_studies(s):
            lease = holder_of(s.connection(), study.id)
            budget = study.spec["trials"]
            summaries = [q.problem_summary(s, study, p) for p in study.problems]
            target = budget * len(summaries)
            done = sum(min(r["evaluated"], budget) for r in summaries)
            stats = study.stats or {}
            errors = s.scalars(select(Trial).where(
                Trial.study_id == study.id, Trial.status.notin_(["OK", "INVALID"]))
                .order_by(Trial.id.desc()).limit(RECENT_ERRORS))
            rows.append({
                "name": study.name, "round": study.round, "evaluated": done, "target": target,
                "state": "done" if done >= target else ("in progress" if done else "not started"),
                "kind": result_kind(study.backend, study.fingerprint or {}, stats),
                "stats": stats,
                "lease": None if lease is None else {  # the launch running it (or a dead one's)
                    "holder": lease.named(), "host": lease.host, "pid": lease.pid,
                    "last_beat_s": round((now - lease.beat_at).total_seconds(), 1),
                    "stale": lease.stale(now)},
                "workers": [{"gpu": gpu, "busy": busy,
                             "trials_per_s": stats["trials_per_s_per_gpu"].get(gpu, 0.0)}
                            for gpu, busy in (stats.get("gpu_busy") or {}).items()],
                "errors": [{"id": t.id, "status": t.status,
                            "first_line": ((t.log or "").strip().splitlines() or [""])[0][:100]}
                           for t in errors]})
    return rows


@takes_db
def status(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Studies in progress, the workers of their last launch, and recent errors."""
    studies = status_data()
    if as_json:
        print_json(studies)
        return
    if not studies:
        out.print("no studies yet")
        return
    for study in studies:
        kind, stats = study["kind"], study["stats"]
        out.print(f"[bold]{study['name']}[/] round {study['round']}: {study['evaluated']}/"
                  f"{study['target']} evaluated, {study['state']}")
        lease = study["lease"]
        if lease is not None:
            out.print(f"  launched by {lease['holder']}, last heartbeat {lease['last_beat_s']:.0f} "
                      "s ago" + (f" (stale: {lease['stale']}; the next launch takes it over)"
                                 if lease["stale"] else ""), markup=False, highlight=False)
        line = launch_line(stats, kind)
        if line:
            out.print(f"  {line}", markup=False, highlight=False)
        for w in study["workers"]:
            out.print(f"  worker GPU {w['gpu']}: {w['trials_per_s']:.2f} trials/s, busy "
                      f"{w['busy']:.0%}{tag(kind)}", markup=False, highlight=False)
        starved = stats.get("starved_s") or {}
        if any(starved.values()):
            out.print("  GPU idle, waiting on: " + ", ".join(
                f"{cause} {seconds:.1f} s" for cause, seconds in starved.items() if seconds)
                + (f" (sampler: {stats['asks']} asks in {stats['ask_s']:.1f} s)"
                   if "asks" in stats else "") + tag(kind), markup=False, highlight=False)
        for e in study["errors"]:
            out.print(f"  trial {e['id']} {e['status']}: {e['first_line']}", markup=False)


@db_app.command("upgrade")
@takes_db
def db_upgrade() -> None:
    """Upgrade an older tunefw database to this version's schema."""
    from tunefw.store import upgrade_store
    before, after = upgrade_store(state["db"])
    out.print(f"database schema {before} -> {after}" if before != after
              else f"database schema {after}: already current")
