"""The law search's design, pure (numpy / scipy; no Ray): candidates and their costs, the
bootstrap refit, and the proposal rule. :class:`LawDesign` is the loop of :mod:`sweeps.law`;
:func:`run_design` drives it without Ray (tests, ``studies/law_search.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from moe_core.errors import FitError
from scaling.bootstrap import NoiseComponents, group_noise_bootstrap, kernel_matrix, log2_axis
from scaling.crossing import sign_changes
from scaling.fit import fit
from scaling.interval import noise_model_name, resolve_widen, widen
from scaling.laws import Points, get_law

CONFIRM = 2
"""Refits in a row (a batch apart) whose interval must be narrow enough before the search stops:
stopping at the first narrow interval selects resamples that happen to agree, and such intervals
held the truth too rarely on simulated studies (studies/law_search.py)."""


SEED_QUANTILE = 0.25
"""The space-filling start picks among the candidates whose marginal cost is at most this
quantile of all (see ``LawDesign._seed_design``)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One trial the searcher may run: the law's variables, the search point that sets them, and
    what it costs (FLOPs) given what else runs."""

    x: dict[str, float]
    point: dict[str, Any]
    trial_flops: float
    """6·N2·D2: the trial's own training."""
    parent: str | None = None
    parent_flops: float = 0.0
    """6·N1·D1: its parent's, paid once per parent."""
    branch: str | None = None
    """Its WSD branch group (trials that differ only in their budget share a stable run)."""
    stable_flops: float = 0.0
    """The part of ``trial_flops`` in the stable phase (shared within the branch group)."""

    @property
    def own_flops(self) -> float:
        """What it costs once its parent and stable run are paid: its decay (all of its
        training without a branch group)."""
        return self.trial_flops - self.stable_flops if self.branch is not None else self.trial_flops


@dataclass
class Ledger:
    """What the chosen trials pay: parents once, each branch group's stable run up to its
    longest member's decay, every trial its decay."""

    parents: set[str] = field(default_factory=set)
    stable: dict[str, float] = field(default_factory=dict)

    def marginal(self, c: Candidate) -> float:
        cost = 0.0 if c.parent is None or c.parent in self.parents else c.parent_flops
        if c.branch is None:
            return cost + c.trial_flops
        return cost + c.own_flops + max(0.0, c.stable_flops - self.stable.get(c.branch, 0.0))

    def add(self, c: Candidate) -> float:
        cost = self.marginal(c)
        if c.parent is not None:
            self.parents.add(c.parent)
        if c.branch is not None:
            self.stable[c.branch] = max(self.stable.get(c.branch, 0.0), c.stable_flops)
        return cost


@dataclass(frozen=True)
class Estimate:
    """The target's point estimate and bootstrap interval after a refit."""

    value: float
    lo: float
    hi: float
    n_trials: int
    params: dict[str, float]

    @property
    def rel_width(self) -> float:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)) or self.value == 0:
            return math.inf
        return (self.hi - self.lo) / abs(self.value)

    def to_dict(self) -> dict[str, Any]:
        def f(v: float) -> float | None:
            return float(v) if math.isfinite(v) else None

        return {"value": f(self.value), "ci": [f(self.lo), f(self.hi)],
                "rel_width": f(self.rel_width), "n_trials": self.n_trials,
                "params": self.params}


def _gap_fn(cfg, law, params: Mapping[str, float]) -> Callable[[np.ndarray], np.ndarray]:
    """ln D ↦ L_MoE(D) − L_Upc(D1 = D, D2 = D) (000 Eq. 13), vectorised; the from-scratch law
    is ``law.scratch`` (with ``N1`` when the law is Eq. 12)."""
    scratch = dict(cfg.scratch)
    n1 = {"N1": scratch.get("N1", 1.0)} if "N1" in law.variables else {}
    sc_law = get_law("chinchilla" if "B" in scratch else "chinchilla_d")
    sc_params = {k: v for k, v in scratch.items() if k in sc_law.param_names}

    def gaps(lnd: np.ndarray) -> np.ndarray:
        d = np.exp(np.atleast_1d(lnd))
        xs = {"D": d, **({"N": np.full_like(d, n1["N1"])} if "N" in sc_law.variables else {})}
        xu = {"D1": d, "D2": d, **{k: np.full_like(d, v) for k, v in n1.items()}}
        return sc_law.predict(sc_params, xs) - law.predict(params, xu)

    return gaps


def _ln_target(cfg, law, params: Mapping[str, float]) -> float:
    """The target of one parameter set, on the scale the interval is formed on: ln D* (±inf
    when one path wins on the whole range), α3, or ln L at ``loss_at``."""
    if cfg.target == "alpha3":
        return float(params["alpha3"])
    if cfg.target == "loss_at":
        x = {k: np.array([v]) for k, v in cfg.loss_at}
        return float(law.log_predict(params, x)[0])
    gaps = _gap_fn(cfg, law, params)
    lo, hi = cfg.dstar_range
    r = sign_changes(lambda g: float(gaps(np.array([g]))[0]), lo, hi, n=200, vectorized=gaps)
    if r.value is not None:
        return math.log(r.value)
    return math.inf if (r.winner_everywhere == "upcycled" or r.crossings) else -math.inf


def percentile_interval(T: np.ndarray, level: float) -> tuple[float, float]:
    """The ``level`` percentile interval of bootstrap values as order statistics (no
    interpolation, so ±inf — one path winning on the whole range — stays ±inf, not NaN)."""
    t = np.sort(np.asarray(T, dtype=float))
    n = len(t)
    lo = t[int(math.floor((1 - level) / 2 * (n - 1)))]
    hi = t[int(math.ceil((1 + level) / 2 * (n - 1)))]
    return float(lo), float(hi)


class LawDesign:
    """The searcher's state and decisions, free of Ray: candidates, observations, refits,
    proposals and the stopping rule (``cfg`` is a :class:`sweeps.law.config.LawSearchConfig`)."""

    # defaults of a fresh design, and of one pickled by an older version (a resumed experiment)
    narrow = 0
    """Consecutive refits whose interval was narrow enough."""
    _fit_on: tuple[int, ...] = ()
    _noise = NoiseComponents(1e-4, 0.0, 0)
    """Noise variance in ln L from the last refit: a trial's own, and the part common to its group
    (WSD stable run, else parent)."""
    _load: np.ndarray | None = None

    def _widen(self) -> tuple[float, str]:
        """``law.widen`` resolved (``auto``: calibrated for the noise model; a config from before
        the key: 1), the factor the target's interval is widened by, and its source."""
        cfg = self.cfg
        return resolve_widen(getattr(cfg, "widen", 1.0), noise_model_name(
            getattr(cfg, "noise", "groups"), getattr(cfg, "length", None)))

    def __init__(self, cfg, candidates: Sequence[Candidate], seed: int = 0):
        if not candidates:
            raise FitError("law search: no candidates")
        self.cfg, self.candidates = cfg, list(candidates)
        self.law = get_law(cfg.law)
        self.fixed = dict(cfg.fix)
        free = [p for p in self.law.params if p.name not in self.fixed]
        self.seed_size = cfg.seed_trials or len(free) + 2
        self.max_trials = min(cfg.max_trials or len(self.candidates), len(self.candidates))
        # a bootstrap by trial over fewer than 2·p + 1 trials (p free parameters) gives
        # intervals that miss the truth (resamples repeat most trials): no stop before
        self.min_trials = min(max(self.seed_size, 2 * len(free) + 1), self.max_trials)
        self.observed: dict[int, float] = {}
        self.failed: set[int] = set()
        self.pending: set[int] = set()
        self.queue: list[int] = []
        self.seeded = False
        self.ledger = Ledger()
        self.spent = 0.0
        self.seed = seed
        self.rounds = 0
        self.history: list[dict[str, Any]] = []
        self.estimate: Estimate | None = None
        self._ensemble: np.ndarray | None = None
        self._gidx = self._group_index()

    # ---- bookkeeping ----------------------------------------------------------------------

    @property
    def issued(self) -> int:
        return len(self.observed) + len(self.pending) + len(self.failed)

    def _available(self) -> list[int]:
        used = set(self.observed) | self.pending | self.failed | set(self.queue)
        return [i for i in range(len(self.candidates)) if i not in used]

    def take(self) -> int | None:
        """The next candidate to run (None: wait for the running batch, or finished)."""
        if not self.queue and not self.finished:
            if not self.seeded:
                self.queue = self._seed_design()
                self.seeded = True
            elif not self.pending:
                self.refit()
                if not self.finished:
                    self.queue = self.propose(self.cfg.batch)
        if not self.queue or self.issued >= self.max_trials:
            self.settle()
            return None
        i = self.queue.pop(0)
        self.pending.add(i)
        self.spent += self.ledger.add(self.candidates[i])
        return i

    def settle(self) -> None:
        """Once the search is over and nothing runs, refit on every trial: the last trials'
        losses enter the final estimate (a stop at ``max_trials`` comes before their refit)."""
        if self.finished and not self.pending and self.observed and \
                sorted(self.observed) != list(self._fit_on):
            self.refit()

    def observe(self, i: int, loss: float | None) -> None:
        self.pending.discard(i)
        if loss is None or not math.isfinite(loss) or loss <= 0:
            self.failed.add(i)
        else:
            self.observed[i] = float(loss)

    @property
    def finished(self) -> bool:
        """The interval is narrow enough, the trial budget is spent, or nothing is left."""
        if self.issued >= self.max_trials and not self.queue:
            return True
        if self.narrow >= CONFIRM:
            return True
        return self.seeded and not self.queue and not self._available() and not self.pending

    # ---- the space-filling start ---------------------------------------------------------

    def _unit(self) -> np.ndarray:
        """Candidates in [0, 1]^d of log variables."""
        X = np.log(np.array([[c.x[v] for v in self.law.variables] for c in self.candidates]))
        span = X.max(axis=0) - X.min(axis=0)
        return (X - X.min(axis=0)) / np.where(span > 0, span, 1.0)

    def _seed_design(self) -> list[int]:
        """Greedy maximin in log space, each pick among the cheapest quarter
        (``SEED_QUANTILE``) of the candidates *at their marginal cost given the picks before it*
        (a parent or stable run already paid for makes its other trials cheap), from the
        cheapest: spread out without buying the box's most expensive corner or opening a parent
        or stable run per seed trial."""
        U, led = self._unit(), Ledger()
        avail, chosen = list(range(len(self.candidates))), []
        while len(chosen) < min(self.seed_size, len(self.candidates)):
            cost = np.array([led.marginal(self.candidates[i]) for i in avail])
            if not chosen:  # nothing to spread from: the cheapest
                pick = avail[int(np.argmin(cost))]
            else:
                pool = [i for i, c in zip(avail, cost) if c <= np.quantile(cost, SEED_QUANTILE)]
                d = np.min(np.linalg.norm(U[pool][:, None, :] - U[chosen][None, :, :], axis=2),
                           axis=1)
                pick = int(pool[int(np.argmax(d))])
            chosen.append(pick)
            led.add(self.candidates[pick])
            avail.remove(pick)
        return chosen[:self.max_trials]

    # ---- refit and interval --------------------------------------------------------------

    def points(self) -> Points:
        idx = sorted(self.observed)
        x = {v: np.array([self.candidates[i].x[v] for i in idx]) for v in self.law.variables}
        labels = tuple(str(i) for i in idx)
        return Points(x, np.array([self.observed[i] for i in idx]), labels)

    def refit(self) -> Estimate | None:
        """Fit the law to every finished trial, bootstrap it by trial, and form the target's
        interval; None (and no estimate) while there are too few trials."""
        pts = self.points()
        free = [p for p in self.law.params if p.name not in self.fixed]
        if len(pts) < len(free) + 1:
            return None
        self.rounds += 1
        seed = self.seed * 7919 + self.rounds
        by_group = getattr(self.cfg, "noise", "trials") == "groups"
        try:
            r = fit(self.law, pts, fixed=self.fixed, bootstrap=0 if by_group else
                    self.cfg.bootstrap, seed=seed, n_jobs=1, max_starts=64)
            if by_group:
                groups = [self._group(i) for i in sorted(self.observed)]
                boot, comp = group_noise_bootstrap(self.law, pts, r, groups, self.cfg.bootstrap,
                                                   seed=seed, icc=self.cfg.icc,
                                                   length=getattr(self.cfg, "length", None))
                self._noise = replace(comp, own=max(comp.own, 1e-8))
            else:
                boot = r.bootstrap
        except FitError:
            return None
        names = [p.name for p in free]
        samples = [{**self.fixed, **dict(zip(names, row))} for row in boot
                   if np.all(np.isfinite(row))]
        if len(samples) < 10:
            return None
        T = np.array([_ln_target(self.cfg, self.law, s) for s in samples])
        lo, hi = percentile_interval(T, self.cfg.ci)
        t0 = _ln_target(self.cfg, self.law, r.params)
        value, lo, hi = (v if self.cfg.target == "alpha3" else math.exp(v) for v in (t0, lo, hi))
        # the calibrated widening (law.widen), in ln(target) about the estimate, before the
        # stopping rule: every report and the state file carry the widened interval
        factor, source = self._widen()
        lo, hi = widen(value, lo, hi, factor)
        est = Estimate(value, lo, hi, len(pts), dict(r.params))
        self.estimate = est
        if not by_group:
            dof = max(1, len(pts) - len(free))
            self._noise = NoiseComponents(max(float(np.sum(r.residuals ** 2)) / dof, 1e-6),
                                          0.0, 0)
        self._ensemble = self._predictions(samples, self._proposal_targets(samples, T, est))
        self.history.append({"trials": len(pts), "flops": self.spent, **est.to_dict(),
                             "widen": factor, "widen_source": source,
                             "noise": {"sigma": math.sqrt(self._noise.total),
                                       "icc": self._noise.icc,
                                       "by": "groups" if by_group else "trials",
                                       "length": self._noise.length}})
        ok = self.cfg.ci_width is not None and len(pts) >= self.min_trials and \
            est.rel_width <= self.cfg.ci_width
        self.narrow = self.narrow + 1 if ok else 0
        self._fit_on = tuple(sorted(self.observed))
        return est

    def _proposal_targets(self, samples: list[dict[str, float]], T: np.ndarray,
                          est: Estimate) -> np.ndarray:
        """What the proposals shrink. For D*, the upcycled ln L on the diagonal at the current
        D* estimate: with the from-scratch law given, Var(D*) ≈ Var(gap(D̂*)) / slope² (delta
        method), and unlike ln D* it is finite in every resample (a resample where one path
        wins on the whole range has no D*, which no covariance can use)."""
        if self.cfg.target != "dstar":
            return T
        d0 = est.value
        if not (math.isfinite(d0) and d0 > 0):  # no crossing: where the laws come closest
            diag = np.array(sorted({c.x["D1"] for c in self.candidates}))
            gap = _gap_fn(self.cfg, self.law, est.params)(np.log(diag))
            d0 = float(diag[int(np.argmin(np.abs(gap)))])
        x = {v: np.array([d0]) for v in ("D1", "D2")}
        x.update({v: np.array([dict(self.cfg.scratch).get("N1", 1.0)])
                  for v in self.law.variables if v not in x})
        return np.array([float(self.law.log_predict(s, x)[0]) for s in samples])

    def _predictions(self, samples: list[dict[str, float]], T: np.ndarray) -> np.ndarray:
        """[B, 1 + n]: each resample's target and ln L̂ at every candidate (finite targets)."""
        X = {v: np.array([c.x[v] for c in self.candidates]) for v in self.law.variables}
        keep = np.isfinite(T)
        rows = [np.concatenate([[t], self.law.log_predict(s, X)])
                for s, t, k in zip(samples, T, keep) if k]
        return np.array(rows) if rows else np.zeros((0, 1 + len(self.candidates)))

    # ---- proposals -----------------------------------------------------------------------

    def propose(self, k: int) -> list[int]:
        """The ``k`` candidates that most shrink Var(target) per FLOP (docs/law-search.md),
        chosen as packages (:meth:`_best_package`); uncertainty sampling per FLOP while too few
        resamples have a finite target."""
        avail = self._available()
        room = min(k, self.max_trials - self.issued, len(avail))
        if room <= 0:
            return []
        Z = self._ensemble
        led = Ledger(set(self.ledger.parents), dict(self.ledger.stable))
        out: list[int] = []
        if Z is None or len(Z) < 10:
            # too few finite targets for covariances: the least-known losses per FLOP
            var = np.ones(len(self.candidates)) if Z is None or len(Z) < 2 else Z[:, 1:].var(0)
            for _ in range(room):
                costs = np.array([led.marginal(self.candidates[i]) for i in avail])
                pick = avail.pop(int(np.argmax(var[avail] / np.maximum(costs, 1e-30))))
                led.add(self.candidates[pick])
                out.append(pick)
            return out
        C = self._augmented(np.cov(Z, rowvar=False))
        while len(out) < room and avail:
            for pick in self._best_package(C, avail, led)[:room - len(out)]:
                avail.remove(pick)
                led.add(self.candidates[pick])
                out.append(pick)
                C = self._condition(C, pick)
        return out

    def _group(self, i: int) -> str | None:
        """The noise group of candidate ``i``: its parent, else its WSD stable run. A parent's
        initialisation and data order carry most of a trial's seed noise; stable runs off one
        fixed parent are nearly independent (docs/findings.md §10), so the stable runs of one
        parent (other seeds or knobs) share one effect."""
        c = self.candidates[i]
        return c.parent if c.parent is not None else c.branch

    def _group_index(self) -> list[int | None]:
        """Each candidate's group as an index among the groups (None: on its own)."""
        names: dict[str, int] = {}
        return [None if g is None else names.setdefault(g, len(names))
                for g in (self._group(i) for i in range(len(self.candidates)))]

    def _augmented(self, C: np.ndarray) -> np.ndarray:
        """The ensemble covariance [target, ln L̂ at each candidate] extended by latent noise
        effects z ~ N(0, I) (:meth:`_loadings`), so that an observation of candidate c is
        ln L̂_c + (τ·R z)_c + e: branches of one stable run are not independent evidence."""
        self._load = self._loadings()
        if self._load is None:
            return C
        n, r = C.shape[0], self._load.shape[1]
        out = np.zeros((n + r, n + r))
        out[:n, :n] = C
        out[n:, n:] = np.eye(r)
        return out

    def _loadings(self) -> np.ndarray | None:
        """τ·R, [candidates, r]: each candidate's loading on the latent effects, with
        R·Rᵀ = K the correlation of the shared noise between candidates — the group indicator
        (one effect per group: equicorrelated), or with ``law.length`` ℓ the fading kernel
        exp(−d²/2ℓ²) within a group, d in octaves of D2 (:func:`scaling.bootstrap.kernel_matrix`,
        the one the bootstrap draws from), so a branch near one already run tells less that is
        new than one far away. Candidates without a group: no shared part. None: no shared
        noise modelled."""
        if not getattr(self, "_gidx", None):
            self._gidx = self._group_index()
        shared = self._noise.shared
        grouped = np.array([g is not None for g in self._gidx])
        if shared <= 0 or not grouped.any():
            return None
        length = getattr(self.cfg, "length", None)
        if length is None or math.isinf(length):
            R = np.zeros((len(self._gidx), 1 + max(g for g in self._gidx if g is not None)))
            for i, g in enumerate(self._gidx):
                if g is not None:
                    R[i, g] = 1.0
        else:
            X = {v: np.array([c.x[v] for c in self.candidates]) for v in self.law.variables}
            t = log2_axis(Points(X, np.ones(len(self.candidates))))
            K = kernel_matrix([None if g is None else str(g) for g in self._gidx], t, length)
            K *= np.outer(grouped, grouped)
            lam, V = np.linalg.eigh(K)
            keep = lam > 1e-10 * lam.max()
            R = V[:, keep] * np.sqrt(lam[keep])
        return math.sqrt(shared) * R

    def _obs(self, C: np.ndarray, i: int) -> tuple[np.ndarray, float]:
        """(Cov(state, y_i), Var y_i) for an observation y_i = ln L̂_i + a_i·z + e of candidate
        ``i`` (a_i: its row of :meth:`_loadings`)."""
        c, n = i + 1, len(self.candidates) + 1
        load = self._load
        if load is None or C.shape[0] == n:  # no shared noise modelled
            return C[:, c], C[c, c] + self._noise.own
        a = load[i]
        h = C[:, c] + C[:, n:] @ a
        return h, float(h[c] + C[c, n:] @ a + a @ C[n:, n:] @ a) + self._noise.own

    def _condition(self, C: np.ndarray, pick: int) -> np.ndarray:
        """The ensemble covariance after observing candidate ``pick`` (the linear-Gaussian
        update; the group effect, when modelled, is part of the state)."""
        h, v = self._obs(C, pick)
        return C - np.outer(h, h) / v

    def _best_package(self, C: np.ndarray, avail: list[int], led: Ledger) -> list[int]:
        """The candidates to issue next, head first: the package with the largest expected
        reduction of Var(target) per FLOP (docs/law-search.md: scored one at a time, a group's
        fixed cost would fall on its first member and no group would open for its branches).
        Each candidate ``h`` heads a package: ``h`` plus the available members its fixed cost
        serves (:meth:`_serves`), added in order of gain per own cost while the package's gain
        per FLOP rises (gains conditioned on the members already in, as in a batch)."""
        best, best_score = [avail[0]], -math.inf
        decay = {i: self.candidates[i].own_flops for i in avail}
        for h in avail:
            ch = self.candidates[h]
            fixed = led.marginal(ch) - decay[h]
            members = [i for i in avail if i != h and self._serves(ch, self.candidates[i])] \
                if fixed > 0 else []
            Ch, pack = self._condition(C, h), [h]
            gain = self._gain(C, h)
            cost = fixed + decay[h]
            score = gain / max(cost, 1e-30)
            while members:
                g = np.array([self._gain(Ch, i) for i in members])
                j = int(np.argmax(g / np.maximum([decay[i] for i in members], 1e-30)))
                new = (gain + g[j]) / max(cost + decay[members[j]], 1e-30)
                if new <= score:
                    break
                gain, cost, score = gain + g[j], cost + decay[members[j]], new
                pack.append(members.pop(j))
                Ch = self._condition(Ch, pack[-1])
            if score > best_score:
                best, best_score = pack, score
        return best

    def _gain(self, C: np.ndarray, i: int) -> float:
        h, v = self._obs(C, i)
        return float(h[0] ** 2 / v)

    @staticmethod
    def _serves(head: Candidate, other: Candidate) -> bool:
        """Whether paying ``head``'s fixed cost makes ``other`` cost only its own decay: the same
        branch group with a stable part no longer than the head's, or (no branch groups) the
        same parent."""
        if head.branch is not None:
            return other.branch == head.branch and other.stable_flops <= head.stable_flops
        return head.parent is not None and other.branch is None and other.parent == head.parent

    # ---- state ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything a resumed search needs (JSON-safe)."""
        return {"observed": {str(k): v for k, v in self.observed.items()},
                "failed": sorted(self.failed), "pending": sorted(self.pending),
                "queue": list(self.queue), "seeded": self.seeded, "spent": self.spent,
                "rounds": self.rounds, "history": self.history,
                "parents": sorted(self.ledger.parents), "stable": self.ledger.stable,
                "estimate": None if self.estimate is None else self.estimate.to_dict(),
                "fit_on": list(self._fit_on), "narrow": self.narrow}

    def load_state(self, st: Mapping[str, Any]) -> None:
        self.observed = {int(k): float(v) for k, v in st["observed"].items()}
        self.failed, self.pending = set(st["failed"]), set(st["pending"])
        self.queue, self.seeded = list(st["queue"]), bool(st["seeded"])
        self.spent, self.rounds = float(st["spent"]), int(st["rounds"])
        self.history = list(st["history"])
        self.ledger = Ledger(set(st["parents"]), dict(st["stable"]))
        if st.get("estimate") is not None and st.get("fit_on"):
            # rebuild the last refit exactly: its trials, its round (the bootstrap's seed)
            full, history = self.observed, self.history
            self.observed = {i: full[i] for i in st["fit_on"]}
            self.rounds -= 1
            self.refit()
            self.observed, self.history = full, history
        self.narrow = int(st.get("narrow", 0))


def run_design(design: LawDesign, evaluate: Callable[[Candidate], float | None],
               parallel: int = 1) -> LawDesign:
    """Drive a design without Ray (tests, ``studies/law_search.py``): run each issued candidate
    through ``evaluate`` in batches of up to ``parallel``, until the design finishes."""
    while True:
        batch = []
        while len(batch) < parallel:
            i = design.take()
            if i is None:
                break
            batch.append(i)
        if not batch:  # nothing pending either: every issued candidate was in a batch
            if design.estimate is None or len(design.observed) > design.estimate.n_trials:
                design.refit()
            return design
        for i in batch:
            design.observe(i, evaluate(design.candidates[i]))
