"""The Dataflow Flex Template's entry point (FLEX_TEMPLATE_PYTHON_PY_FILE): runs one
continual-release job with the template's parameters.

    python3 dataflow/main.py --config gs://BUCKET/job.yaml [--mode run|schedule]
        [--state_dir gs://BUCKET/state] [--now 2026-01-06T12:00:00Z] [any Beam pipeline option]

`--mode run` (default) is `python3 -m pipelines.run`; `--mode schedule` is
`python3 -m pipelines.schedule --state-dir ... [--now ...]`. Every other argument (the
launcher's --runner, --project, --region, --temp_location, --setup_file, ...) goes to Beam.

Both jobs commit themselves as their last stage, after every write (`pipelines.commit`:
release.json and the output sets; the scheduler's ledger, MAC'd commit marker and publication).
So a Flex Template launch, which only stages the job (the launcher passes --template_location and
the job runs after this program exits), releases exactly what a driver that waits releases; the
driver then prints that the job is staged. Where the driver waits (run directly, or as a Cloud
Run job), it also prints the run summary and writes the truncation counters into the operator
folder's summary.json.
"""
from __future__ import annotations

import argparse
import sys

MODES = ("run", "schedule")


def parser() -> argparse.ArgumentParser:
    """The template's parameters (dataflow/metadata.json lists the same names)."""
    result = argparse.ArgumentParser(prog="dataflow/main.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--config", required=True,
                        help="the job's YAML config (gs:// path, or demo:<name>)")
    result.add_argument("--mode", choices=MODES, default="run",
                        help="run: one release of all steps; schedule: continue the release "
                             "kept in --state_dir")
    result.add_argument("--state_dir",
                        help="gs:// folder of the release's checkpoints (mode schedule)")
    result.add_argument("--now",
                        help="ISO-8601 time; steps ending by then are released (mode schedule; "
                             "default: the current time)")
    return result


def driver(argv=None):
    """(module name, its argv) for the parameters in `argv`; a ValueError for a bad combination."""
    from transforms.validation import fail
    args, beam_args = parser().parse_known_args(argv)
    if args.mode == "schedule":
        if not args.state_dir:
            fail("state_dir", "given with mode schedule (the release's checkpoint folder)", None)
        return "pipelines.schedule", ["--config", args.config, "--state-dir", args.state_dir,
                                      *(["--now", args.now] if args.now else []), *beam_args]
    if args.state_dir or args.now:
        fail("state_dir" if args.state_dir else "now", "absent with mode run (it is for mode "
                                                         "schedule)",
             args.state_dir or args.now)
    return "pipelines.run", ["--config", args.config, *beam_args]


def main(argv=None) -> int:
    try:
        module, driver_argv = driver(argv)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if module == "pipelines.schedule":
        from pipelines import schedule
        return schedule.main(driver_argv)
    from pipelines import run
    return run.main(driver_argv)


if __name__ == "__main__":
    sys.exit(main())
