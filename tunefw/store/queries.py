"""The reads and writes the CLI and the sweep need, each in one short function."""
from __future__ import annotations

from collections import Counter
from typing import Protocol

from sqlalchemy import Select, delete, func, select
from sqlalchemy.orm import Session

from tunefw.errors import UserError
from tunefw.outcome import NOT_COUNTED, Outcome, Status, cublas_ratio, fingerprint_key
from tunefw.problem import GemmProblem
from tunefw.store.models import Problem, Study, Trial, Winner


class StudyFile(Protocol):
    """What a new study row is made of (tunefw.study.spec.StudySpec is one: the store knows the
    study file only by these)."""

    name: str
    problems: list[GemmProblem]
    labels: list[str]

    def to_dict(self) -> dict: ...


def create_study(s: Session, spec: StudyFile) -> Study:
    """A new study with its problems, from a validated study file."""
    if s.scalar(select(Study).where(Study.name == spec.name)) is not None:
        raise UserError(f"study {spec.name!r} already exists (tunefw study delete {spec.name})")
    study = Study(name=spec.name, spec=spec.to_dict(), round=0)
    for p, label in zip(spec.problems, spec.labels):
        study.problems.append(Problem(key=p.key(), M=p.M, N=p.N, K=p.K, dtype=p.dtype,
                                      layout=p.layout, gate=p.gate, label=label))
    s.add(study)
    s.flush()
    return study


def get_study(s: Session, name: str | None) -> Study:
    """The named study, or (name None) the most recently created one."""
    if name is None:
        study = s.scalar(select(Study).order_by(Study.created_at.desc(), Study.id.desc()))
        if study is None:
            raise UserError(f"no study yet in {database_of(s)}: create one with "
                            "`tunefw study create NAME --from FILE`")
        return study
    study = s.scalar(select(Study).where(Study.name == name))
    if study is None:
        known = s.scalars(select(Study.name)).all()
        hint = f"; known: {', '.join(known)}" if known else ""
        raise UserError(f"study {name!r} not found in {database_of(s)}{hint}")
    return study


def database_of(s: Session) -> str:
    """The database a session reads, as messages show it (password masked)."""
    from tunefw.store.files import shown_url
    return shown_url(str(s.get_bind().url))


def optuna_name(study_name: str, problem_key: str, round_: int) -> str:
    """The Optuna study of one (study, problem, round): `STUDY/MxNxK:dtype:TN/rROUND`."""
    return f"{study_name}/{problem_key}/r{round_}"


def optuna_study_names(study: Study) -> set[str]:
    """Every Optuna study a tunefw study can own: each problem in each round so far (exact
    names: deleting study `p` must not touch the searches of a study named like `p/q`)."""
    return {optuna_name(study.name, p.key, r) for p in study.problems
            for r in range(study.round + 1)}


def list_studies(s: Session) -> list[Study]:
    return list(s.scalars(select(Study).order_by(Study.id)))


def delete_study(s: Session, name: str) -> Study:
    study = get_study(s, name)
    s.execute(delete(Winner).where(Winner.problem_id.in_([p.id for p in study.problems])))
    s.execute(delete(Trial).where(Trial.study_id == study.id))
    s.delete(study)
    return study


def as_problem(p: Problem) -> GemmProblem:
    return GemmProblem(p.M, p.N, p.K, p.dtype, p.layout, p.gate)


def record_trial(s: Session, study: Study, problem: Problem, family: str, config: dict,
                 key: str, outcome: Outcome, source_hash: str, optuna_trial: int | None,
                 attempts: int = 1, reused_from: int | None = None,
                 retry_of: int | None = None) -> Trial:
    """Write one finished trial (the driver's only kind of write during a sweep)."""
    row = Trial(
        study_id=study.id, problem_id=problem.id, round=study.round, optuna_trial=optuna_trial,
        family=family, config=config, config_key=key, source_hash=source_hash,
        status=outcome.status.value, log=outcome.log or "", median_ms=outcome.median_ms,
        min_ms=outcome.min_ms, iqr_ms=outcome.iqr_ms, tflops=outcome.tflops,
        rel_err=outcome.rel_err, cublas_tflops=outcome.cublas_tflops,
        fingerprint=outcome.fingerprint, fingerprint_key=fingerprint_key(outcome.fingerprint)
        if outcome.fingerprint else "", gpu=outcome.gpu, evaluator=outcome.evaluator,
        compile_s=outcome.compile_s, ptxas_regs=outcome.ptxas_regs,
        ptxas_smem_bytes=outcome.ptxas_smem_bytes, ptxas_spill_bytes=outcome.ptxas_spill_bytes,
        attempts=attempts, reused_from=reused_from,
        retry_of=retry_of)
    s.add(row)
    s.flush()
    return row


def problem_trials(s: Session, study: Study, problem: Problem) -> list[Trial]:
    return list(s.scalars(select(Trial).where(
        Trial.problem_id == problem.id, Trial.round == study.round).order_by(Trial.id)))


def study_trials(s: Session, study: Study, problem: GemmProblem | None = None,
                 status: str | None = None) -> list[tuple[Trial, Problem]]:
    """The round's trials of a study with their problems, by id; ``problem`` keeps those of
    one shape (any dtype), ``status`` those of one outcome."""
    query = select(Trial, Problem).join(Problem, Trial.problem_id == Problem.id).where(
        Trial.study_id == study.id, Trial.round == study.round)
    if problem is not None:
        query = query.where(Problem.M == problem.M, Problem.N == problem.N,
                            Problem.K == problem.K)
    if status is not None:
        query = query.where(Trial.status == status)
    return [(t, p) for t, p in s.execute(query.order_by(Trial.id))]


def find_reusable(s: Session, problem: GemmProblem, key: str, source_hash: str,
                  evaluator: str, fp_key: str) -> Trial | None:
    """A stored measurement of the same config, problem, sources, evaluator and device."""
    return s.scalar(
        select(Trial).join(Problem, Trial.problem_id == Problem.id).where(
            Problem.key == problem.key(), Trial.config_key == key,
            Trial.source_hash == source_hash, Trial.evaluator == evaluator,
            Trial.fingerprint_key == fp_key, Trial.reused_from.is_(None),
            Trial.status.notin_([*NOT_COUNTED, Status.TIMEOUT.value]))
        .order_by(Trial.id).limit(1))


def _ranked(problem: Problem, round_: int) -> Select:
    """A problem's OK trials of a round, best first: by the ratio to cuBLAS (the search's
    objective), trials without a cuBLAS figure last, ties by id."""
    return select(Trial).where(
        Trial.problem_id == problem.id, Trial.round == round_,
        Trial.status == Status.OK.value).order_by(Trial.ratio.desc().nulls_last(), Trial.id)


def round_source_hashes(s: Session, study: Study) -> dict[str, set[str]]:
    """The kernel sources (family -> source hashes) the study's current round was measured with."""
    rows = s.execute(select(Trial.family, Trial.source_hash).where(
        Trial.study_id == study.id, Trial.round == study.round).distinct())
    found: dict[str, set[str]] = {}
    for family, source_hash in rows:
        if source_hash:  # rows written without one (older files) say nothing of the source
            found.setdefault(family, set()).add(source_hash)
    return found


def best_trial(s: Session, problem: Problem, round_: int) -> Trial | None:
    return s.scalar(_ranked(problem, round_).limit(1))


def top_trials(s: Session, problem: Problem, round_: int, n: int) -> list[Trial]:
    """The best n OK trials, one per distinct config."""
    rows = s.scalars(_ranked(problem, round_))
    seen, out = set(), []
    for r in rows:
        if len(out) >= n:
            break
        if r.config_key not in seen:
            seen.add(r.config_key)
            out.append(r)
    return out


def previous_round_best(s: Session, study: Study, problem: Problem,
                        n: int) -> list[tuple[str, dict]]:
    """The (family, config) of the problem's n best configs in each round before the study's
    current one, the latest round first, each config once (none in round 0): where a new
    round's search starts. Every earlier round, not only the last: a round's fresh search can
    miss what an older one found (llama3_8b's round 1 never asked 256x4096x4096's round-0 best,
    0.947x cuBLAS, and exported a config at 0.833x), and a later round would lose it for good."""
    seen, out = set(), []
    for round_ in range(study.round - 1, -1, -1):
        for t in top_trials(s, problem, round_, max(1, n)):
            if t.config_key not in seen:
                seen.add(t.config_key)
                out.append((t.family, dict(t.config)))
    return out


def outcome_counts(s: Session, problem: Problem, round_: int) -> Counter:
    rows = s.execute(select(Trial.status, func.count()).where(
        Trial.problem_id == problem.id, Trial.round == round_).group_by(Trial.status))
    return Counter({status: n for status, n in rows})


def set_winner(s: Session, problem: Problem, trial: Trial, tflops: float,
               cublas_tflops: float | None, confirmed: bool) -> Winner:
    winner = s.get(Winner, problem.id) or Winner(problem_id=problem.id)
    winner.trial_id = trial.id
    winner.family = trial.family
    winner.config = trial.config
    winner.tflops = tflops
    winner.cublas_tflops = cublas_tflops
    winner.confirmed = confirmed
    winner.fingerprint = trial.fingerprint
    winner.evaluator = trial.evaluator
    s.merge(winner)
    return winner


def evaluated_count(counts: Counter) -> int:
    """The trials that count toward a problem's budget, of its outcome counts."""
    return sum(n for status, n in counts.items() if status not in NOT_COUNTED)


def has_work(s: Session, study: Study, budget: int, confirm_top: int) -> bool:
    """Whether a launch of the study's round has anything to do: a problem short of ``budget``
    evaluated trials, or (where the study confirms, ``confirm_top`` > 0) one with OK trials and
    no winner confirmed from this round."""
    for problem in study.problems:
        counts = outcome_counts(s, problem, study.round)
        if evaluated_count(counts) < budget:
            return True
        if confirm_top and counts.get(Status.OK.value, 0) \
                and not confirmed_in_round(s, problem, study.round):
            return True
    return False


def unconfirmed(s: Session, study: Study) -> list[Problem]:
    """The round's problems with OK trials and no winner confirmed from it (export takes their
    best screened trial, whose figure the confirmation has not re-timed)."""
    return [p for p in study.problems if best_trial(s, p, study.round) is not None
            and not confirmed_in_round(s, p, study.round)]


def confirmed_in_round(s: Session, problem: Problem, round_: int) -> bool:
    """Whether the problem's winner was confirmed from a trial of this round (a launch cut
    during confirmation keeps these and confirms only the rest)."""
    winner = s.get(Winner, problem.id)
    if winner is None or not winner.confirmed:
        return False
    trial = s.get(Trial, winner.trial_id)
    return trial is not None and trial.round == round_


def problem_summary(s: Session, study: Study, problem: Problem) -> dict:
    """The `study show --json` entry of one problem."""
    counts = outcome_counts(s, problem, study.round)
    evaluated = evaluated_count(counts)
    winner = s.get(Winner, problem.id)
    best = None
    if winner is not None:
        best = {"family": winner.family, "config": winner.config, "tflops": winner.tflops,
                "trial_id": winner.trial_id, "cublas_tflops": winner.cublas_tflops,
                "ratio": cublas_ratio(winner.tflops, winner.cublas_tflops),
                "confirmed": winner.confirmed, **_screen(s.get(Trial, winner.trial_id))}
    else:
        t = best_trial(s, problem, study.round)
        if t is not None:
            best = {"family": t.family, "config": t.config, "tflops": t.tflops,
                    "trial_id": t.id, "cublas_tflops": t.cublas_tflops, "ratio": t.ratio,
                    "confirmed": False, **_screen(t)}
    return {"M": problem.M, "N": problem.N, "K": problem.K, "dtype": problem.dtype,
            "gate": problem.gate, "label": problem.label, "evaluated": evaluated,
            "ok": counts.get(Status.OK.value, 0), "outcomes": dict(sorted(counts.items())),
            "best": best}


def _screen(t: Trial | None) -> dict:
    """What the best config's own trial measured (a confirmation re-times it): its screen
    figures and ptxas's view of its kernel."""
    return {"screen_ratio": t.ratio if t else None, "screen_tflops": t.tflops if t else None,
            "ptxas_regs": t.ptxas_regs if t else None,
            "ptxas_smem_bytes": t.ptxas_smem_bytes if t else None,
            "ptxas_spill_bytes": t.ptxas_spill_bytes if t else None,
            "source_hash": t.source_hash if t else None}
