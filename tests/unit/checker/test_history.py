"""The history on its own: pairing, per-process views, controller intervals and formatting, on a fake clock."""

from __future__ import annotations

from ckpt_model.protocol.history import Event, History


class FakeClock:
    """A monotonic clock the test moves by hand; `History` reads it once at construction (its zero)."""

    def __init__(self, start_s: float = 100.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def at(self, elapsed_s: float) -> FakeClock:
        """Set the time to `elapsed_s` after the start the tests use (100 s)."""
        self.now_s = 100.0 + elapsed_s
        return self


def history() -> tuple[History, FakeClock]:
    clock = FakeClock()
    return History(clock=clock), clock


# -- invoke / complete -------------------------------------------------------------------------------------------


def test_times_are_relative_to_the_history_start() -> None:
    events, clock = history()
    clock.at(2.5)
    event = events.note("controller", "prepared", "c1")
    assert event.time_s == 2.5
    assert (event.index, event.type, event.invoke_index) == (0, "ok", None)


def test_a_completion_is_paired_with_its_invocation() -> None:
    events, clock = history()
    invocation = events.invoke("r0", "run", {"attempt": 0})
    events.note("backend", "model_call", "r0")
    clock.at(1.0)
    completion = events.complete(invocation, "fail", {"error": {"code": "stale_attempt"}})
    assert (invocation.type, invocation.invoke_index) == ("invoke", None)
    assert completion.invoke_index == invocation.index == 0
    assert (completion.index, completion.process, completion.f, completion.type) == (2, "r0", "run", "fail")
    assert completion.value == {"error": {"code": "stale_attempt"}}
    assert events.events == (invocation, events.events[1], completion)


def test_several_open_invocations_complete_out_of_order() -> None:
    events, _ = history()
    first = events.invoke("r0", "run")
    second = events.invoke("r1", "run")
    done_second = events.complete(second, "info", "ConnectError")
    done_first = events.complete(first, "ok")
    assert (done_second.invoke_index, done_second.process) == (1, "r1")
    assert (done_first.invoke_index, done_first.process) == (0, "r0")


# -- intervals ---------------------------------------------------------------------------------------------------


def test_an_opened_note_then_a_closing_invoke_is_one_interval() -> None:
    events, clock = history()
    clock.at(1.0)
    events.note("controller", "prepared", "c1")
    clock.at(3.0)
    events.invoke("controller", "resume", "c1")
    assert events.intervals("prepared", ("resume", "crash")) == [(1.0, 3.0)]


def test_an_interval_not_yet_closed_runs_to_infinity() -> None:
    events, clock = history()
    clock.at(1.0)
    events.note("controller", "prepared", "c1")
    assert events.intervals("prepared", ("resume",)) == [(1.0, float("inf"))]


def test_several_intervals_each_close_at_the_next_closing_invoke() -> None:
    events, clock = history()
    for opened_s, closed_s, closing in ((1.0, 2.0, "resume"), (4.0, 5.0, "crash"), (7.0, None, None)):
        clock.at(opened_s)
        events.note("controller", "prepared")
        if closed_s is not None and closing is not None:
            clock.at(closed_s)
            events.invoke("controller", closing)
    assert events.intervals("prepared", ("resume", "crash")) == [(1.0, 2.0), (4.0, 5.0), (7.0, float("inf"))]


def test_intervals_ignore_other_processes_and_the_wrong_event_types() -> None:
    events, clock = history()
    clock.at(1.0)
    events.note("r0", "prepared")  # another process: not an opening
    events.invoke("controller", "prepared")  # an invoke, not a note: not an opening
    clock.at(2.0)
    events.invoke("controller", "resume")  # nothing open yet: ignored
    clock.at(3.0)
    opened = events.note("controller", "prepared")
    clock.at(3.5)
    events.note("controller", "prepared")  # already open: the first note keeps the start
    events.note("controller", "resume")  # a note, not an invoke: does not close
    events.invoke("r0", "crash")  # another process: does not close
    clock.at(6.0)
    closing = events.invoke("controller", "crash")
    events.complete(closing, "ok")
    assert opened.time_s == 3.0
    assert events.intervals("prepared", ("resume", "crash")) == [(3.0, 6.0)]


def test_no_opening_note_no_interval() -> None:
    events, _ = history()
    events.invoke("controller", "resume")
    assert events.intervals("prepared", ("resume",)) == []


# -- format ------------------------------------------------------------------------------------------------------


def test_format_shows_one_line_per_event_with_index_time_process_type_and_value() -> None:
    events, clock = history()
    clock.at(1.25)
    run = events.invoke("r0", "run", {"attempt": 0})
    events.complete(run, "ok")
    lines = events.format().splitlines()
    assert lines == [run.describe(), events.events[1].describe()]
    assert lines[0] == "#0        1.250s r0           invoke run {'attempt': 0}"
    assert lines[1] == "#1        1.250s r0           ok     run"


def test_format_keeps_only_the_last_events_and_accepts_a_selection() -> None:
    events, _ = history()
    for index in range(5):
        events.note("controller", f"step{index}")
    assert [line.split()[0] for line in events.format(last=2).splitlines()] == ["#3", "#4"]
    selection = [Event(index=9, time_s=0.0, process="p", f="f", type="info", value=None)]
    assert events.format(selection) == selection[0].describe()
    assert History(clock=FakeClock()).format() == ""
