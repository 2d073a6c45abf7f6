"""Runnable jobs: `run`, `schedule`, `plan`, `report`, `demo` (command-line drivers)."""
from pipelines.logs import install_import_filter

install_import_filter()  # before any job module imports Beam
