"""Where one rank's bytes are, by when they are alive (`Layout`, of `Term`s, each with the source
line it reads), and the micro-step's peak moment (`at_peak`): the engine's layouts
(`suite.predict.memory`) are built of these.

    timed peak = steady states + max(micro-step: activations + what the engine holds with them,
                                     boundary: gradient-reduction transients,
                                     optimizer step: its transients)
    build peak = what building the model and initialising the engine hold at once

What an engine holds during a micro-step changes as the backward goes: ZeRO-2 fills its gradient
partition, ZeRO-3 and FSDP2 release the parameters of the modules done, FSDP2 gathers each unit
as the forward and the backward reach it. The trace gives the activations at each such moment
(`Trace.moments`: the largest live bytes while exactly the first k gradients exist, and those of
the forward), and the micro-step's peak is the largest of activations plus engine at the same
moment, not the sum of their separate peaks (`at_peak`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from suite.predict.trace import Trace


def bytes_per_element(precision: str) -> int:
    """Bytes of one element in the trial's training dtype (TF32 keeps fp32 storage)."""
    return 4 if precision in ("fp32", "tf32") else 2


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    source: str


@dataclass
class Layout:
    """Where the bytes of one rank are, by when they are alive."""

    steady: list[Term] = field(default_factory=list)
    """Allocated through the timed window."""
    backward: list[Term] = field(default_factory=list)
    """Alive together with the activations at the micro-step's peak."""
    boundary: list[Term] = field(default_factory=list)
    """Alive while gradients are reduced after the boundary backward, activations freed."""
    optimizer: list[Term] = field(default_factory=list)
    """Alive during the optimizer step."""
    build: list[Term] = field(default_factory=list)
    """The peak of building the model and initialising the engine."""
    host: list[Term] = field(default_factory=list)
    """Offloaded to the host's memory (a GPU's host; counted on the device for a CPU worker)."""
    nvme: list[Term] = field(default_factory=list)
    """Swapped to the NVMe drive (the NVMe tier), per rank."""
    activations: float = 0.0
    """The micro-step's live bytes at its peak moment (with `backward`)."""

    @staticmethod
    def total(terms: list[Term]) -> float:
        return sum(t.bytes for t in terms)

    def timed_peak(self) -> float:
        return self.total(self.steady) + max(
            self.activations + self.total(self.backward), self.total(self.boundary), self.total(self.optimizer)
        )

    def build_peak(self) -> float:
        return self.total(self.build)

    def states(self) -> float:
        """The bytes no micro-batch changes: a lower bound of either peak."""
        return self.total(self.steady)


def _moments(tr: Trace, b: int, held: bool = False) -> list[tuple[int, float]]:
    """(k, activations) of the micro-step: k gradients exist (k = -1: the forward); `held`: the
    gradients not counted (the engine holds them). A trace without them (a synthetic one) has
    its peak at the start and at the end of the backward."""
    found = tr.moments(b, held)
    if found:
        return found
    act = tr.activation_bytes(b)
    return [(0, act), (len(tr.param_numels), act)]


def at_peak(
    lay: Layout,
    tr: Trace,
    b: int,
    engine: Callable[[int], list[Term]],
    more: Callable[[float], list[tuple[float, list[Term]]]] | None = None,
    held: bool = False,
) -> None:
    """The micro-step's peak moment: activations plus what the engine holds then (`engine(k)`
    once it has taken the first k gradients, k = -1 in the forward), or one of the
    `more(activations at the backward's start)` moments (activations, terms) the engine adds; sets
    `lay.activations` and adds the peak's engine terms to `lay.backward`.

    An engine takes each gradient from autograd once it exists (copies it, reduces it, frees it;
    releases its parameter): the event that makes the k-th gradient holds it beside what the
    engine held before (`engine(k - 1)`), the later ones hold what it holds after (`engine(k)`)
    without it. `held`: the engine holds every gradient from its birth and counts it itself
    (`engine(k)` beside the activations without them)."""
    moments = _moments(tr, b)
    end = next((act for k, act in moments if k == -2), max(act for _, act in moments))
    moments = [(k, act) for k, act in moments if k != -2]
    if held:
        at = [(act, k) for k, act in _moments(tr, b, True) if k != -2]
    else:
        born = [(act, k - 1 if k > 0 else k) for k, act in moments]
        at = born + [(act, k) for k, act in _moments(tr, b, True) if k > 0]
    holds: dict[int, tuple[list[Term], float]] = {}  # engine(k) and its bytes: each k is asked for once
    for k in {k for _, k in at}:
        terms = engine(k)
        holds[k] = (terms, Layout.total(terms))
    candidates = [(act, *holds[k]) for act, k in at]
    if more is not None:
        candidates += [(act, terms, Layout.total(terms)) for act, terms in more(end)]
    act, terms, _ = max(candidates, key=lambda c: c[0] + c[2])
    lay.activations = act
    lay.backward.extend(terms)


def order(tr: Trace) -> tuple[int, ...]:
    """The parameters in the order their gradients appear (a synthetic trace's: module order)."""
    return tr.grad_order or tuple(range(len(tr.param_numels)))


def arrived(tr: Trace, weight: Callable[[int], float]) -> list[float]:
    """For k = 0 up to every gradient: the total `weight` of the parameters whose gradients exist
    after the first k (an engine's `engine(k)` reads index max(k, 0): none in the forward)."""
    sums = [0.0]
    for i in order(tr):
        sums.append(sums[-1] + weight(i))
    return sums
