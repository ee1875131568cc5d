"""What a look-alike server writes to its log: uvicorn's warnings and errors (an exception's traceback), one line
per request, and the servers' own `fakes.*` lines, each with its time, on stderr (the server's log file:
`fakes.processes.server_processes.spawn` and `fakes.processes.zygote.redirect_stdio` point it there).

A failure report shows the last lines of every log; they must say what the server did. uvicorn at level warning
with no access log wrote nothing of a run but its rare warnings. The checker's polls (health, status, the
look-alike's `/_ctl` reads, hundreds per example) are left out of the access log when they succeed, or every tail
would be polls alone.
"""

from __future__ import annotations

import logging
from typing import Any

FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
ACCESS_FORMAT = '%(asctime)s.%(msecs)03d %(levelname)s %(client_addr)s "%(request_line)s" %(status_code)s'
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
POLLED_SUFFIXES = ("/health", "/status")
POLLED_PREFIX = "/_ctl/"
FIRST_ERROR_STATUS = 400


class QuietPolls(logging.Filter):
    """Drops the access line of a successful GET of a polled route; every other request is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _, method, path, _, status = args
        polled = str(path).split("?")[0].endswith(POLLED_SUFFIXES) or str(path).startswith(POLLED_PREFIX)
        return not (method == "GET" and polled and int(status) < FIRST_ERROR_STATUS)


def log_config() -> dict[str, Any]:
    """`logging.config.dictConfig` input for a server process (a fresh dict: dictConfig changes what it reads)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "default": {"()": "uvicorn.logging.DefaultFormatter", "fmt": FORMAT, "datefmt": DATE_FORMAT},
            "access": {"()": "uvicorn.logging.AccessFormatter", "fmt": ACCESS_FORMAT, "datefmt": DATE_FORMAT},
        },
        "filters": {"quiet_polls": {"()": QuietPolls}},
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"},
            "access": {
                "class": "logging.StreamHandler",
                "formatter": "access",
                "filters": ["quiet_polls"],
                "stream": "ext://sys.stderr",
            },
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            # Its own lines from warnings up: its start lines would come from every standby forked ahead of a
            # restart too (`fakes.processes.zygote`), and the log's `--- start` lines mark each start already.
            "uvicorn.error": {"level": "WARNING"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
            "fakes": {"handlers": ["default"], "level": "INFO", "propagate": False},
        },
    }


def uvicorn_logging() -> dict[str, Any]:
    """The keywords of `uvicorn.Config` (and `uvicorn.run`) that give a server this logging (no `log_level`: it
    would set the access log's level too)."""
    return {"log_config": log_config(), "access_log": True, "use_colors": False}
