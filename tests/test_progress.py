"""simplace.progress: status notes, the throttled line (in place on a terminal, plain lines
in a log), the calibration step counter, and a search's progress line on top of them."""

import io
import math

from simplace.progress import Line, Progress, Throttle, bar, format_duration, note
from simplace.search import ProgressLine


class Clock:
    """A clock the test moves by hand (no sleeping, no timing)."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_note_is_a_bracketed_stderr_line(capsys):
    note("tracing mlp (training step)...")
    assert capsys.readouterr().err == "  [tracing mlp (training step)...]\n"


def test_bar_and_durations():
    assert bar(0.5, 8) == "[####....]"
    assert bar(1.7, 4) == "[####]" and bar(-1, 4) == "[....]"
    assert format_duration(42.4) == "42s" and format_duration(187) == "3m07s"


def test_throttle_says_yes_once_per_period():
    clock = Clock()
    every = Throttle(3.0, clock)
    assert every() and not every()
    clock.t += 2.9
    assert not every() and every(force=True)
    clock.t += 3.0
    assert every()


def test_line_redraws_in_place_on_a_terminal_and_blanks_leftovers():
    clock, out = Clock(), Tty()
    line = Line(out, clock=clock)
    assert line.update("a long first text")
    assert not line.update("too soon")  # within 0.2 s
    clock.t += 0.2
    assert line.update("short")
    line.close()
    assert out.getvalue() == "\ra long first text" + "\rshort" + " " * 12 + "\n"


def test_line_writes_plain_lines_to_a_log_every_ten_seconds():
    clock, out = Clock(), io.StringIO()
    line = Line(out, clock=clock)
    line.update("first")
    clock.t += 5
    line.update("dropped")
    clock.t += 5
    line.update("second")
    line.close()  # nothing to end: every update was a whole line
    assert out.getvalue() == "first\nsecond\n"


def test_a_line_without_stream_is_silent():
    line = Line(None)
    assert not line.update("x", force=True)
    line.close()


def test_progress_counts_weighted_steps_with_time_left():
    clock, out = Clock(), io.StringIO()
    p = Progress(4.0, stream=out, clock=clock)
    assert math.isnan(p.eta_s())
    clock.t += 10
    p.step(1.0, "first device")
    assert p.eta_s() == 30.0
    clock.t += 10
    p.add_total(4.0)
    p.step(3.0, "model", force=True)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[######..................]  25.0%  10s elapsed, 30s left  first device"
    assert lines[1].startswith("[############............]  50.0%  20s elapsed, 20s left")


def test_search_bar_on_a_log_is_plain_lines_and_messages_go_to_the_callback():
    out = io.StringIO()
    line = ProgressLine("rl-gnn", None, bar=True, total=8, unit="episodes", stream=out)
    line.show(2, 4.0, 0.0125, 0.015, "mean", elapsed_s=3, budget_s=60)
    line.show(3, 4.0, 0.0125, 0.015, "mean")  # throttled
    line.close()
    assert out.getvalue() == ("rl-gnn [######..................] 2/8 episodes, 4/s, best "
                              "12.5 ms, mean 15 ms, 3/60 s\n")
    said = []
    msgs = ProgressLine("local", said.append)
    msgs.show(100, 50.0, 0.01, math.inf)
    msgs.show(200, 50.0, 0.01, math.inf)  # within 3 s
    msgs.show(300, 50.0, 0.01, 0.02, force=True)
    assert said == ["local: 100 evaluations (50/s), best 10 ms, current -",
                    "local: 300 evaluations (50/s), best 10 ms, current 20 ms"]
