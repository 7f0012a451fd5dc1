"""The training log of the lead host: one line per event, or a live bar on a terminal.

`config.logging.progress_bar` chooses: True a tqdm bar, False plain lines, None (the default)
a bar when stderr is a terminal and lines otherwise (a file, a pod log, a pipe), where a bar's
carriage-return frames would pile up into one long line. The lines are one per event: each
logged step (loss, tokens/s, MFU where the peak is known, ETA), each held-out evaluation as it
happens, and at the end where the time went. Each line written to a file or a pipe (a pod's or
a job's log) starts with the date and time (`stamp`); the run's own lines before and around
the steps (its header, resuming, compiling) go the same way (`say`).

Throughput is measured over the steps a row covers (`Throughput`): the time spent saving
checkpoints and evaluating is excluded and reported separately, and so is the first step's
(it compiles the step). The loop marks a step when it is known to have finished: when its
metrics have been read, or, for a step that had already finished when its call returned (XLA:CPU
runs a step inside the call), that return; so each row's time is its own steps' time even where
the metrics are read one step late and two steps are read back to back (at a checkpoint).
"""

import contextlib
import math
import sys
import time

AUTO = (None, "auto")


def stamp(stream) -> str:
    """'YYYY-MM-DD HH:MM:SS ' where `stream` is a file or a pipe (a pod's or job's log), so each
    line says when it happened; '' on a terminal and in memory (a notebook, a test's capture)."""
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last
        return ""
    isatty = getattr(stream, "isatty", None)
    return "" if isatty and isatty() else time.strftime("%Y-%m-%d %H:%M:%S ")


def say(text: str, stream=None) -> None:
    """One line of the run's log (`stream`, default stderr, where the progress goes), written
    at once and stamped with the time where it goes to a file (`stamp`)."""
    stream = stream or sys.stderr
    print(stamp(stream) + text, file=stream, flush=True)


def wants_bar(setting, stream=None) -> bool:
    """`config.logging.progress_bar` -> whether to draw a bar (None / 'auto': a terminal)."""
    if setting in AUTO:
        stream = stream or sys.stderr
        isatty = getattr(stream, "isatty", None)
        return bool(isatty and isatty())
    if isinstance(setting, bool):
        return setting
    raise ValueError(
        f"config.logging.progress_bar must be True, False or None (a bar on a terminal), "
        f"got {setting!r}"
    )


class Throughput:
    """Tokens/s over the steps each row covers, with paused time excluded and totalled by kind.

    `clock` is injectable (the tests drive it by hand). `settled(step, at)` marks a finished
    step (`at`: the clock when it was known finished; default now); the first one (it compiled
    the step) is counted as 'compile', not as training time. `measure(step, at)` closes the
    current window at `at`: the tokens of the steps since the last window, over the time since
    then less what `paused` excluded.
    """

    def __init__(self, tokens_per_step: int, start_step: int, clock=time.perf_counter):
        self.tokens_per_step, self.clock = tokens_per_step, clock
        self.totals = {"compile": 0.0, "steps": 0.0}
        self.mark_step, self.mark_time, self.excluded = start_step, clock(), 0.0
        self.compiled = False
        self.last_rate = None  # seconds per step of the last measured window
        self.last_paused = 0.0

    @contextlib.contextmanager
    def paused(self, kind: str):
        """Time inside is not training time; it is added to `totals[kind]`."""
        start = self.clock()
        try:
            yield
        finally:
            spent = self.clock() - start
            self.excluded, self.last_paused = self.excluded + spent, spent
            self.totals[kind] = self.totals.get(kind, 0.0) + spent

    def _active(self, at: float) -> float:
        return at - self.mark_time - self.excluded

    def _restart(self, step: int, at: float) -> None:
        self.mark_step, self.mark_time, self.excluded = step, at, 0.0

    def settled(self, step: int, at: float | None = None) -> None:
        """`step` has finished (by `at`); the first one of the run is the compile, timed on its
        own."""
        if not self.compiled:
            at = self.clock() if at is None else at
            self.compiled = True
            self.totals["compile"] += self._active(at)
            self._restart(step, at)

    def measure(self, step: int, at: float | None = None) -> dict:
        """{'tokens_per_s': ...} over the steps since the last window; starts the next one.
        A window of the compiling step alone reports that step, compile included, and
        'compiling': True (there is nothing else to measure it by)."""
        at = self.clock() if at is None else at
        steps, seconds = step - self.mark_step, self._active(at)
        self._restart(step, at)
        if steps <= 0:
            compiled = self.totals["compile"]
            return {"tokens_per_s": self.tokens_per_step / max(compiled, 1e-9), "compiling": True}
        self.totals["steps"] += seconds
        self.last_rate = seconds / steps
        return {"tokens_per_s": steps * self.tokens_per_step / max(seconds, 1e-9)}


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class TrainingLog:
    """What a run shows while it trains; does nothing on hosts other than the lead.

    `flops_per_token` and `peak_flops` (the whole mesh's peak FLOP/s) give the MFU; without a
    peak it is not shown. `stream` is where lines and the bar go (stderr).
    """

    def __init__(
        self,
        total: int,
        initial: int,
        tokens_per_step: int,
        *,
        bar=None,
        enabled: bool = True,
        stream=None,
        clock=time.perf_counter,
        flops_per_token: float = 0.0,
        peak_flops: float = 0.0,
    ):
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self.timer = Throughput(tokens_per_step, initial, clock)
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.bar, self.compiling = None, False
        if enabled and wants_bar(bar, self.stream):
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total, initial=initial, unit="step", dynamic_ncols=True, file=self.stream
            )

    def _line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            say(text, self.stream)

    def dispatched(self) -> None:
        """One more step was started (the bar's count)."""
        if self.bar is not None:
            self.bar.update(1)

    def settled(self, step: int, at: float | None = None) -> None:
        self.timer.settled(step, at)

    def compile_started(self, step: int) -> None:
        """Step `step`, the run's first, is about to be traced and compiled."""
        self._line(f"step {step}: compiling the training step")

    def compile_done(self, seconds: float) -> None:
        self._line(f"compiled the training step in {seconds:.1f} s")

    def paused(self, kind: str):
        """Context manager: checkpoint ('checkpoint') or evaluation ('eval') time, excluded."""
        return self.timer.paused(kind)

    def measure(self, step: int, at: float | None = None) -> dict:
        """The row's speed fields: tokens_per_s and, with a known peak, mfu."""
        speed = self.timer.measure(step, at)
        self.compiling = speed.pop("compiling", False)
        if not self.compiling and self.peak_flops and self.flops_per_token:
            speed["mfu"] = speed["tokens_per_s"] * self.flops_per_token / self.peak_flops
        return speed

    def row(self, step: int, row: dict) -> None:
        """A logged step: a line (or the bar's postfix)."""
        if not self.enabled:
            return
        if self.bar is not None:
            fields = {"loss": f"{row['loss']:.3f}"}
            if "tokens_per_s" in row:
                fields["tok_s"] = f"{row['tokens_per_s']:,.0f}"
            self.bar.set_postfix(fields)
            return
        line = step_line(step, self.total, row, self.timer.last_rate)
        self._line(line + ("  (compiling)" if self.compiling else ""))

    def heldout(self, step: int, loss: float, ppl: float) -> None:
        """A held-out evaluation, just done inside `paused('eval')`."""
        self._line(
            f"step {step}/{self.total}  held-out loss {loss:.4f}  PPL {ppl:.2f}  "
            f"(evaluated in {self.timer.last_paused:.1f} s)"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        totals = self.timer.totals
        parts = [f"training steps {totals['steps']:.1f} s", f"compile {totals['compile']:.1f} s"]
        parts += [f"{k} {v:.1f} s" for k, v in totals.items() if k not in ("steps", "compile")]
        self._line("time: " + ", ".join(parts))


def step_line(step: int, total: int, row: dict, seconds_per_step: float | None) -> str:
    """'step S/N  loss L  R tokens/s  MFU M %  ETA H:MM:SS' (MFU and ETA where known)."""
    parts = [f"step {step}/{total}", f"loss {row['loss']:.4f}"]
    if "tokens_per_s" in row:
        parts.append(f"{row['tokens_per_s']:,.0f} tokens/s")
    if "mfu" in row and math.isfinite(row["mfu"]):
        parts.append(f"MFU {100 * row['mfu']:.1f} %")
    if seconds_per_step is not None and step < total:
        parts.append(f"ETA {_duration((total - step) * seconds_per_step)}")
    return "  ".join(parts)
