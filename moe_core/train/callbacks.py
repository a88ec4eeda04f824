"""What the training loop hands out: callbacks at named points (OLMo-core style), the parent
state a run starts from, and the run's result. Nothing here imports Ray or W&B."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Callback:
    """Hooks the loop calls; every method is optional."""

    def on_eval(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:  # noqa: B027
        """After each evaluation, with the metrics row (step, tokens, losses, router stats) and
        the checkpoint directory written at this step (None if the step has none): a reporter
        hands both on in one call."""

    def on_checkpoint(self, step: int, path: Path) -> None:  # noqa: B027
        """After a checkpoint directory was written (after that step's ``on_eval``)."""

    def on_resume(self, evals: Sequence[tuple[int, float]]) -> None:  # noqa: B027
        """Once, when the run resumes from a checkpoint, before any step: the (step, validation
        loss) of every eval its lineage reported up to that checkpoint (a WSD branch: its
        stable run's), oldest first; empty for a checkpoint that predates the record."""

    def should_stop(self) -> bool:
        """Return True to end the run after the current step (e.g. an ASHA stop)."""
        return False

    def on_stage(self, text: str) -> None:  # noqa: B027
        """Before each stage of work that has no steps (loading a pretrained parent, writing
        its cache), one line saying what and how large, e.g. "loading 541 MB of safetensors"."""


Hook = Callable[[dict[str, Any]], None]


class FunctionCallback(Callback):
    """Adapter: ``FunctionCallback(on_eval=fn)`` calls ``fn(metrics)`` after each eval."""

    def __init__(self, on_eval: Hook | None = None,
                 on_checkpoint: Callable[[int, Path], None] | None = None):
        self._on_eval, self._on_checkpoint = on_eval, on_checkpoint

    def on_eval(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        if self._on_eval:
            self._on_eval(metrics)

    def on_checkpoint(self, step: int, path: Path) -> None:
        if self._on_checkpoint:
            self._on_checkpoint(step, path)


@dataclass
class ParentState:
    """What a run needs from its parent: weights (numpy or torch), optionally optimizer state,
    and the LR facts the LR policies need (000 App. A.6)."""

    model_state: dict[str, Any]
    model_config: Any
    """ModelConfig of the parent."""
    peak_lr: float
    final_lr: float
    tokens: int
    optimizer_state: dict[str, Any] | None = None
    val_loss: float = float("nan")
    """The parent's final validation loss (the reference of the loss at the transition)."""
    seed: int | None = None
    """The data-order seed of the parent's live batcher (None: a cache entry from before it
    was recorded, or a pretrained parent)."""
    tokens_per_step: int | None = None
    """Tokens of one parent step as its live batcher drew them (None: as ``seed``)."""


@dataclass
class TrainResult:
    initial_val_loss: float
    val_loss: float
    train_loss: float
    tokens: int
    steps: int
    wall_s: float
    curve: list[dict[str, Any]] = field(default_factory=list)
    peak_lr: float = 0.0
    final_lr: float = 0.0
    checkpoints: dict[int, str] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "initial_val_loss", "val_loss", "train_loss", "tokens", "steps", "wall_s",
            "peak_lr", "final_lr", "params")}
