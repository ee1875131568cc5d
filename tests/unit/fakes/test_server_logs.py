"""A look-alike server's logging: every request is logged except the checker's successful polls."""

from __future__ import annotations

import io
import logging
import logging.config

import pytest

from fakes.gym.server_logs import QuietPolls, log_config


def access_record(method: str, path: str, status: int) -> logging.LogRecord:
    """An access record as uvicorn makes one: its arguments are client, method, path, HTTP version, status."""
    args = ("127.0.0.1:5000", method, path, "1.1", status)
    return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None)


@pytest.mark.parametrize(
    ("method", "path", "status", "kept"),
    [
        ("GET", "/health", 200, False),
        ("GET", "/ng-control/v1/checkpoint/status", 200, False),
        ("GET", "/_ctl/calls", 200, False),
        ("GET", "/ng-control/v1/checkpoint/status?x=1", 200, False),
        ("GET", "/ng-control/v1/checkpoint/status", 401, True),
        ("POST", "/ng-control/v1/checkpoint/prepare", 200, True),
        ("POST", "/_ctl/hold", 200, True),
        ("POST", "/run", 200, True),
        ("GET", "/v1/models", 200, True),
    ],
)
def test_quiet_polls_drops_only_successful_gets_of_polled_routes(
    method: str, path: str, status: int, kept: bool
) -> None:
    assert QuietPolls().filter(access_record(method, path, status)) is kept


def test_a_record_that_is_no_access_line_is_kept() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "plain %s", ("text",), None)

    assert QuietPolls().filter(record) is True


def test_the_config_logs_requests_and_the_servers_own_lines_with_their_time(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    saved = {name: logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "fakes")}
    state = {name: (logger.handlers[:], logger.level, logger.propagate) for name, logger in saved.items()}
    try:
        logging.config.dictConfig(log_config())
        logging.getLogger("uvicorn.access").handle(access_record("POST", "/run", 500))
        logging.getLogger("uvicorn.access").handle(access_record("GET", "/health", 200))
        logging.getLogger("fakes.gym.control.work_runner").info("background checkpoint work ended")
        logging.getLogger("uvicorn.error").info("Started server process")
    finally:
        for name, (handlers, level, propagate) in state.items():
            saved[name].handlers, saved[name].propagate = handlers, propagate
            saved[name].setLevel(level)

    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith('INFO 127.0.0.1:5000 "POST /run HTTP/1.1" 500 Internal Server Error')
    assert lines[1].endswith("INFO fakes.gym.control.work_runner: background checkpoint work ended")
    assert all(line[:4].isdigit() for line in lines)  # each starts with its date and time
