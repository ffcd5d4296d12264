"""The integer mixing plan: how many units (documents or tokens) each source contributes.

Pure and exact: shares are ``Fraction``s, the budget is apportioned to sources by largest
remainder (Hamilton), so a source's planned amount is within one unit of ``share x budget`` and
the plan sums to the budget. Policies (``MixingPolicy.policy``), with n_i a source's train
population in the declared unit:

- ``natural``: q_i = n_i / sum n (default budget: every train record once);
- ``ratios``: q_i as declared;
- ``temperature``: q_i proportional to n_i ** alpha (computed with 50-digit decimals, then exact);
- ``unimax``: the budget spread uniformly over sources, smallest first, none beyond
  ``max_epochs`` passes; what a capped source cannot take goes to the others.

``max_fraction`` caps a share; the excess is moved to uncapped sources in proportion to their
shares. A source asked for more than ``max_epochs`` passes, or shares that cannot be met, raise
``MixingError`` naming the source, what it needs, what it has and what would fit.
"""

from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction

from corpus_assets.core.runtime.config import MixingPolicy


class MixingError(ValueError):
    """The declared mixture cannot be realised from the train split."""


@dataclass(frozen=True)
class Population:
    """One source's train split: its documents and their tokens (packing tokenizer)."""

    source: str
    docs: int
    tokens: int


@dataclass(frozen=True)
class SourcePlan:
    source: str
    size: int  # population in the plan's unit
    natural: Fraction  # p_i: the source's share of the train split in the unit
    target: Fraction  # q_i: the share the policy asks for
    amount: int  # planned units: Hamilton share of the budget
    max_epochs: int | None
    cap_hit: bool

    @property
    def weight(self) -> Fraction:
        """Importance weight q_i / p_i of each sample drawn from this source."""
        return self.target / self.natural if self.natural else Fraction(0)


def hamilton(total: int, shares: dict[str, Fraction]) -> dict[str, int]:
    """Largest-remainder apportionment of ``total``; ties by the order of ``shares``."""
    exact = {name: share * total for name, share in shares.items()}
    out = {name: value.numerator // value.denominator for name, value in exact.items()}
    left = total - sum(out.values())
    by_remainder = sorted(exact, key=lambda name: -(exact[name] - out[name]))
    for name in by_remainder[:left]:
        out[name] += 1
    return out


def decimal_text(value: Fraction, places: int = 12) -> str:
    """``value`` rounded half-even to ``places`` decimals, without trailing zeros."""
    scaled = round(value * 10**places)
    sign, digits = ("-" if scaled < 0 else ""), str(abs(scaled)).rjust(places + 1, "0")
    whole, frac = digits[:-places], digits[-places:].rstrip("0")
    return f"{sign}{whole}.{frac}" if frac else f"{sign}{whole}"


def _normalised(weights: dict[str, Fraction]) -> dict[str, Fraction]:
    total = sum(weights.values())
    return {name: (w / total if total else Fraction(0)) for name, w in weights.items()}


def temperature_shares(sizes: dict[str, int], alpha: Decimal) -> dict[str, Fraction]:
    with localcontext() as context:
        context.prec = 50
        powered = {
            name: Fraction(Decimal(n) ** alpha) if n else Fraction(0) for name, n in sizes.items()
        }
    return _normalised(powered)


def unimax_amounts(sizes: dict[str, int], budget: int, caps: dict[str, int]) -> dict[str, Fraction]:
    """UniMax: uniform over sources (smallest population first), each at most its cap."""
    left, out = Fraction(budget), {}
    order = sorted(sizes, key=lambda name: (sizes[name], name))
    for rank, name in enumerate(order):
        out[name] = min(left / (len(order) - rank), Fraction(caps[name]))
        left -= out[name]
    if left:
        raise MixingError(
            f"unimax budget {budget} exceeds what max_epochs allow ({sum(caps.values())}); "
            f"set budget <= {sum(caps.values())} or raise max_epochs"
        )
    return {name: out[name] for name in sizes}


def apply_fraction_caps(
    shares: dict[str, Fraction], caps: dict[str, Fraction]
) -> tuple[dict[str, Fraction], set[str]]:
    """Clip shares at their caps and move the excess to uncapped sources, proportionally."""
    shares, capped = dict(shares), set()
    while over := [n for n in shares if n in caps and shares[n] > caps[n]]:
        excess = sum(shares[n] - caps[n] for n in over)
        for name in over:
            shares[name] = caps[name]
            capped.add(name)
        free = {n: s for n, s in shares.items() if n not in capped and s > 0}
        if not free:
            raise MixingError(
                f"max_fraction caps of {', '.join(sorted(capped))} leave {excess} of the mix "
                "to no other source; raise a cap or add a source"
            )
        for name, share in _normalised(free).items():
            shares[name] += excess * share
    return shares, capped


def _check_epochs(plans: list[SourcePlan], budget: int, unit: str) -> None:
    for plan in plans:
        have = None if plan.max_epochs is None else plan.size * plan.max_epochs
        if plan.amount and plan.size == 0:
            raise MixingError(
                f"source {plan.source!r} needs {plan.amount} {unit} but has no train records; "
                "give it a share of 0 or add records"
            )
        if plan.amount and have is not None and plan.amount > have:
            needed = -(-plan.amount // plan.size)
            fit = min(
                (
                    (p.size * p.max_epochs * p.target.denominator) // p.target.numerator
                    for p in plans
                    if p.max_epochs is not None and p.target
                ),
                default=0,
            )
            raise MixingError(
                f"source {plan.source!r} needs {plan.amount} {unit} but has {plan.size} "
                f"x max_epochs {plan.max_epochs} = {have}; it would need max_epochs >= "
                f"{needed}, or a budget <= {fit} (now {budget})"
            )


def plan_mixture(policy: MixingPolicy, populations: list[Population]) -> list[SourcePlan]:
    """The integer plan for ``populations`` (in config source order) under ``policy``."""
    tokens = policy.unit == "tokens"
    sizes = {p.source: (p.tokens if tokens else p.docs) for p in populations}
    natural = _normalised({name: Fraction(n) for name, n in sizes.items()})
    budget = policy.budget if policy.budget is not None else sum(sizes.values())
    epochs = {name: policy.epochs_of(name) for name in sizes}
    capped: set[str] = set()
    if policy.policy == "natural":
        shares = natural
    elif policy.policy == "ratios":
        shares = {name: Fraction((policy.ratios or {}).get(name, 0)) for name in sizes}
    elif policy.policy == "temperature":
        shares = temperature_shares(sizes, policy.alpha)
    else:
        caps = {name: sizes[name] * (epochs[name] or 0) for name in sizes}
        amounts = unimax_amounts(sizes, budget, caps)
        capped = {name for name in sizes if amounts[name] == caps[name]}
        shares = {name: amount / budget for name, amount in amounts.items()}
    fractions = {
        name: Fraction(own.max_fraction)
        for name, own in policy.sources.items()
        if own.max_fraction is not None and name in sizes
    }
    shares, clipped = apply_fraction_caps(shares, fractions)
    amounts = hamilton(budget, shares)
    plans = [
        SourcePlan(
            name,
            sizes[name],
            natural[name],
            shares[name],
            amounts[name],
            epochs[name],
            name in capped | clipped,
        )
        for name in sizes
    ]
    _check_epochs(plans, budget, policy.unit)
    return plans
