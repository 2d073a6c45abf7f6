"""Quiet, truthful logs for the command-line jobs.

By default a job's stderr holds only what the operator must act on: Beam's own INFO/WARNING
chatter is raised to ERROR, and the import-time notices that the optional BigQuery client
(apitools) or the GCS filesystem is missing are dropped (nothing here uses BigQuery; a gs://
path without the [gcp] extra fails with its own error). `--verbose` brings all of Beam's
logs back. The stateful transforms use a deterministic key coder (`transforms.messages.KeyCoder`),
so Beam's "key coder may not be deterministic" warning does not arise in the first place.
"""
from __future__ import annotations

import logging
import os
import sys

# apitools: the BigQuery client; GCSFileSystem: gs:// without the [gcp] extra, noticed at import
# when another google-cloud package is installed (a gs:// path then fails with its own error)
BENIGN_IMPORT_NOTICES = ("apitools not found", "Failed to import GCSFileSystem")
NOTICE_LOGGERS = ("", "apache_beam.io.filesystems")  # where Beam logs them


class _DropBenignImportNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(BENIGN_IMPORT_NOTICES)


_FILTER = _DropBenignImportNotices()


def install_import_filter() -> None:
    """Before Beam is imported: its optional-client notice is not a problem of this job."""
    for name in NOTICE_LOGGERS:  # (a filter applies to its own logger's records only)
        logging.getLogger(name).addFilter(_FILTER)


def configure(verbose: bool) -> None:
    """Quiet by default (Beam at ERROR, the library's notices printed by the CLI itself);
    `verbose`: every logger at INFO, nothing filtered."""
    if verbose:
        for name in NOTICE_LOGGERS:
            logging.getLogger(name).removeFilter(_FILTER)
        logging.basicConfig(level=logging.INFO, force=True)
        for name in ("apache_beam", "transforms"):
            logging.getLogger(name).setLevel(logging.INFO)
        for name in DUPLICATE_ERROR_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
        return
    for name in ("apache_beam", "transforms"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in DUPLICATE_ERROR_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


# Beam logs a failing DoFn's traceback here and then raises the same error to the driver, which
# the CLI reports in one line (a full disk, a read-only folder, a refused config): quiet mode
# keeps only that line. `--verbose` shows the tracebacks.
DUPLICATE_ERROR_LOGGERS = ("apache_beam.runners.common", "apache_beam.runners.worker",
                           "apache_beam.runners.portability.fn_api_runner")


def exit_now(code) -> None:
    """End a command-line job with `code` once its work is done: flush the logs and the
    standard streams, then leave without the interpreter's teardown. There, pyarrow's native
    thread pools can abort the process (std::terminate on a still-joinable thread,
    apache/arrow#34314; seen here once in about 1,500 test runs: a job that had printed its
    summary exited -6), which would turn a finished, committed job into a failure that a
    scheduler retries. Everything the jobs create (the ephemeral secret file, staging
    folders) is removed inside `main`, before this."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(0 if code is None else code if isinstance(code, int) else 1)
