"""The simulator's prediction of one measured run against a fixed bar: joint and TPOT-only attainment
within ATTAINMENT_TOLERANCE and TPOT p50 within TPOT_TOLERANCE (sim.validate; sim/bands.py judges by
repeated runs instead)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ATTAINMENT_TOLERANCE = 0.05
TPOT_TOLERANCE = 0.10


@dataclass(frozen=True)
class Check:
    policy: str
    level: dict
    measured_joint: float
    predicted_joint: float
    measured_tpot_only: float
    predicted_tpot_only: float
    measured_tpot_p50_ms: float | None
    predicted_tpot_p50_ms: float | None

    @property
    def tpot_p50_error(self) -> float | None:
        if not self.measured_tpot_p50_ms or self.predicted_tpot_p50_ms is None:
            return None
        return self.predicted_tpot_p50_ms / self.measured_tpot_p50_ms - 1

    @property
    def within(self) -> bool:
        err = self.tpot_p50_error
        return (abs(self.predicted_joint - self.measured_joint) <= ATTAINMENT_TOLERANCE
                and abs(self.predicted_tpot_only - self.measured_tpot_only) <= ATTAINMENT_TOLERANCE
                and (err is None or abs(err) <= TPOT_TOLERANCE))


def as_dict(c: Check) -> dict:
    return {**asdict(c), "tpot_p50_error": c.tpot_p50_error, "within": c.within}


def print_checks(checks: list[Check], other: str = "sim") -> None:
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"{'policy':>12} {'level':>28} {'joint meas/' + other:>15} {'tpot-only meas/' + other:>19} "
          f"{'TPOT p50 ms meas/' + other:>21} ok")
    for c in checks:
        level = " ".join(f"{k}={v:g}" for k, v in c.level.items())
        print(f"{c.policy:>12} {level:>28} {c.measured_joint:7.2f}/{c.predicted_joint:<7.2f} "
              f"{c.measured_tpot_only:9.2f}/{c.predicted_tpot_only:<9.2f} "
              f"{fmt(c.measured_tpot_p50_ms):>10}/{fmt(c.predicted_tpot_p50_ms):<10} "
              f"{'yes' if c.within else 'no'}")
