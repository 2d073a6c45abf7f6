"""Run a continual-release job from a YAML config.

    python3 -m pipelines.run --config configs/active_users.yaml [any Beam pipeline option]

Reads events (JSON lines, CSV or Parquet, columns mapped by `input.fields`), runs the configured
transform, and writes
- public: records (Parquet / JSON lines / CSV) and `release.json` (the release manifest: id,
  budget, mechanism, descriptor) under `output.path/<job>/`;
- operator-only (NOT private: raw input records, exact counts): dead letters under
  `output.path/<job>-operator/`, with a README.txt saying so;
and prints where they are. Every run is a new release with its own noise: running the same data
twice spends the budget twice. Without a configured secret, a local run draws a fresh secret
(0600 temporary file, removed afterwards). Without --runner it uses the in-process FnApiRunner
(the default DirectRunner first tries to download Prism, which fails offline).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import config as job_config
from pipelines import (budget, commit, engines, gate, io, job_release, kafka_local, local_dofns,
                       local_pubsub, local_watermark, logs, remote, storage, stream)
from pipelines.checkpoints import read_json, write_text
from pipelines.operator_summary import describe, operator_summary
from pipelines.plan_command import COMMAND as PLAN_COMMAND
from pipelines.plan_command import plan_arguments
from transforms import registry
from transforms.mechanisms import ConstantNoiseSource
from transforms.continual import LOCAL_RUNNERS  # noqa: F401 (Beam's local runners)
from transforms.secret import SecretRef
from transforms.steps import TimeSteps
from transforms.streams.count import magnitude

@contextlib.contextmanager
def ephemeral_secret():
    """A fresh 256-bit secret in a 0600 temporary file for one local run, removed afterwards."""
    handle, path = tempfile.mkstemp(prefix="dp-secret-")
    try:
        os.fchmod(handle, 0o600)
        os.write(handle, secrets.token_hex(32).encode("ascii"))
        os.close(handle)
        yield SecretRef(path=path)
    finally:
        os.remove(path)


def build_transform(job: job_config.JobConfig, secret: SecretRef = None, release_id=None,
                    mechanism=None, secret_fingerprint=None, noise_source=None,
                    noise_version=None, checkpoint=None):
    """The configured transform: `release_spec` bound to a secret. `secret` overrides the
    config's (`noise_source`: an injected source instead, e.g. the report's exact totals)."""
    if secret is None and noise_source is None:
        if job.secret.stored:
            job_config.fail("secret.stored", "used with a state directory "
                                             "(python3 -m pipelines.schedule)", True)
        if not job.secret.configured:
            job_config.fail("secret", "configured (env, path or gcp_secret) for this runner", "none")
        secret = job.secret.ref()
    spec = job_release.release_spec(job, release_id, mechanism, noise_version)
    return registry.SPECS[job.transform].transform_class()(
        spec=spec, secret=secret, noise_source=noise_source, insecure=job.secret.insecure,
        secret_fingerprint=secret_fingerprint, checkpoint=checkpoint)


def release_manifest(transform, ledger: dict = None) -> dict:
    """What the public folder says about its release (no secret, no data-dependent count);
    `ledger`: its source's budget ledger after it (`budget.charge`)."""
    display = {k: v for k, v in transform.display_data().items() if k != "secret"}
    return {"release_id": transform.release_id, "private": transform.private,
            "descriptor": transform.descriptor, "display": display,
            **({"budget": ledger} if ledger else {})}


def build(pipeline, job: job_config.JobConfig, transform=None, public_folder=None,
          operator_folder=None, passed=None) -> list:
    """The whole job: one release of all steps, written into `public_folder` and
    `operator_folder` (default: the job's own folders). Returns the writes (PCollections of
    written file names). With `passed` (a guard, `commit.guard`), nothing is written before
    the guard passed."""
    elements, dead = io.read_elements(pipeline, job)
    transform = transform or build_transform(job)  # (elements: timestamped, event time)
    if passed is not None:  # every output of the transform waits for the job's claim
        transform.claimed_by(passed)
    result = elements | job.transform >> transform
    verdict = gate.decide(  # of records (one per public key and step) + dead letters
        pipeline, gate.Gate.of(job, transform.plan, private=transform.noisy), transform,
        elements, dead, dead + [result.dead_letters], after=passed)
    records = gate.gated(result.records, verdict, "InputGate")
    # the same records, once the input's dead letters passed the gate (else the job fails)
    writes = io.write_records(records, job,
                              os.path.join(public_folder or job.public_path, "records"))
    dead_letters = dead + [result.dead_letters]  # (writes: file names, per format)
    if passed is not None:
        dead_letters = [commit.guarded(dead + [result.dead_letters]
                                       | "AllDeadLettersChecked" >> beam.Flatten(), passed,
                                       "CheckedDeadLetters")]
    writes.append(io.write_dead_letters(
        dead_letters, os.path.join(operator_folder or job.operator_path, "dead_letters")))
    return writes


def build_release(pipeline, job: job_config.JobConfig, transform, staging, ledger=None):
    """`build` into the staging folders, then the job's last stage commits them (release.json,
    the operator README and summary, the swap of the output sets) once every write finished:
    the job commits itself, also when its launcher does not wait for it (a Flex Template)."""
    passed = commit.guard(pipeline, commit.release_claim(job, transform.release_id,
                                                         staging.root),
                          "ClaimRelease") if transform.private else None
    writes = build(pipeline, job, transform, staging.public, staging.operator, passed)
    commit.after_writes(pipeline, writes, commit.CommitRun(
        staging, release_manifest(transform, ledger), transform.private),
                        "CommitRelease", execution=passed)


def main(argv=None) -> int:
    local_dofns.remember_specs()  # Beam's lookup of a DoFn's state and timers, once per DoFn
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True,
                        help="the job's YAML config (see docs/operations.md)")
    parser.add_argument("--verbose", action="store_true",
                        help="show Beam's own logs (quiet by default)")
    parser.add_argument("--json", action="store_true",
                        help="print the run summary as one JSON object on stdout")
    parser.add_argument("--continue", dest="continue_release", action="store_true",
                        help="streaming: continue the stopped release in the job's folder "
                             "from its last checkpointed step")
    args, beam_args = parser.parse_known_args(argv)
    logs.configure(args.verbose)
    runner = engines.runner_of(beam_args)
    try:
        job = job_config.load(args.config)
        if job.input.kind == "pubsub" and runner in engines.ENGINES:
            job_config.fail("--runner", "DirectRunner or DataflowRunner for a Pub/Sub input "
                                        "(Beam reads Pub/Sub in Python on those only)", runner)
        if job.input.kind == "kafka" and runner != "FlinkRunner":
            job_config.fail("--runner", "FlinkRunner for a Kafka input (docs/engines.md)",
                            runner if any(a.startswith("--runner") for a in beam_args)
                            else "none")
        if job.input.kind == "kafka" and args.continue_release:
            job_config.fail("--continue", "left out for a Kafka input (Flink restores a "
                                          "failed job from its own checkpoints; a stopped "
                                          "Kafka release ends)", "--continue")
        if job.input.kind == "kafka":  # Flink's streaming options (no jar to run later)
            beam_args = engines.flink_streaming(beam_args)
        beam_args, local = engines.prepared(beam_args)  # Flink, Spark: the installed jars
        if not job.secret.configured and not local:
            job_config.fail("secret", f"configured (env, path or gcp_secret) for the remote runner {runner} "
                                      "(a fresh local secret cannot reach its workers)", "none")
        if job.input.unbounded:
            if not args.continue_release:
                stream.refuse_published_folder(job)
        else:
            io.check_bounded_options(beam_args)
            if job.steps.unbounded:  # one run has a last step: a release without one goes on
                job_config.fail("steps.horizon", "a number of steps for a one-off batch run (a "
                                                 "release with no horizon continues with "
                                                 "python3 -m pipelines.schedule)", "unbounded")
            commit.refuse_other_config(job, args.config)
            if args.continue_release:
                job_config.fail("--continue", "used with a streaming job (input.kind pubsub; "
                                              "a batch release continues with "
                                              "python3 -m pipelines.schedule)", "files")
        io.preflight(job, local, runner)
    except ValueError as error:
        print(f"error: {gate.one_line(error)}", file=sys.stderr)
        return 2
    if not any(a.startswith("--runner") for a in beam_args):
        # Beam's local streaming runner reads Pub/Sub; FnApiRunner is the fast batch one
        beam_args = ["--runner=DirectRunner" if job.input.unbounded else "--runner=FnApiRunner",
                     *beam_args]
    try:
        with engines.job_server(beam_args) as beam_args:  # Flink, Spark: until the summary
            if job.input.unbounded:
                return run_stream(job, args, beam_args, runner in LOCAL_RUNNERS)
            return run_release(job, args, beam_args)
    except ValueError as error:
        print(f"error: {gate.one_line(error)}", file=sys.stderr)
        return 2
    except Exception as error:  # a full disk, a read-only or forbidden folder: one line
        line = gate.one_line(error) if gate.refused(error) else \
            storage.storage_error(error, [job.output.path])
        if line is None and job is not None:
            line = io.read_failure(error, job)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2


def run_release(job: job_config.JobConfig, args, beam_args) -> int:
    """`main` once the config is loaded: the release, its commit (the job's last stage) and the
    run summary, read from the committed set."""
    with contextlib.ExitStack() as stack:
        secret = None if job.secret.configured else stack.enter_context(ephemeral_secret())
        try:
            transform = build_transform(job, secret)
            ledger = budget.charge(job, transform)  # before anything is claimed or published
        except ValueError as error:
            print(f"error: {gate.one_line(error)}", file=sys.stderr)
            return 2
        staging = commit.OutputStaging(job)  # finishes or removes what killed runs left
        pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
        build_release(pipeline, job, transform, staging, ledger)
        try:
            result = pipeline.run()
            if commit.staged_only(beam_args):
                staged = {"job": job.job, "staged": True, "release_id": transform.release_id,
                          "commits": [job.public_path, job.operator_path]}
                print(json.dumps(staged, indent=2, sort_keys=True) if args.json else
                      f"release {transform.release_id}: job staged, not run; when it runs, its "
                      f"last stage commits {job.public_path} and {job.operator_path}")
                return 0
            result.wait_until_finish()  # the job committed its output sets as its last stage
        except Exception as error:  # the gate's refusal: where its dead letters are
            if not gate.refused(error):
                raise
            details = os.path.join(staging.operator, "refusal.txt")
            write_text(details, f"{gate.one_line(error)}\nThis run's dead letters: "
                                f"{os.path.join(staging.operator, 'dead_letters')}-*.jsonl "
                                f"(operator-only; the job's next run removes them).\n")
            raise gate.GarbageInput(gate.headline(gate.one_line(error), details)) from None
    public_folder, operator_folder = commit.committed_folders(job)  # one set, resolved once
    try:
        committed = read_json(os.path.join(public_folder, "release.json"))["release_id"]
    except (OSError, IOError, ValueError, KeyError, TypeError):
        committed = None
    if committed != transform.release_id:
        job_config.fail("output", f"this run's committed set (release {transform.release_id}; "
                                  f"another run of job {job.job} switched the folders: runs of "
                                  f"one job must not overlap)", committed)
    operator = operator_summary(result, operator_folder, job, args.config)
    write_text(os.path.join(operator_folder, "summary.json"), json.dumps(
        dict(operator, release_id=transform.release_id,
             config=commit.config_identity(args.config)), indent=2, sort_keys=True))
    public = dict(public_summary(transform, job, public_folder), budget_ledger=ledger)
    summary = {"job": job.job, "public": public, "operator_not_private": operator}
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    print(describe_run(job, transform, public, operator))
    if not transform.private:
        print(f"release {transform.release_id}: INSECURE demo release (fixed seed): records "
              f"are marked private: false", file=sys.stderr)
    return 0


DRAIN_SECONDS = 60.0  # how long a complete local streaming job may take to drain


def run_stream(job: job_config.JobConfig, args, beam_args, local: bool) -> int:
    """`main` for unbounded input (`pipelines.stream`): launches the streaming job; on a local
    runner, follows it, printing each step as it is published, until every step of the horizon
    is (or the job fails, or Ctrl-C cancels it: no later step is released)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions
    kafka = job.input.kind == "kafka"  # on Flink: followed here, checkpointed by Flink
    options = PipelineOptions(beam_args)
    options.view_as(StandardOptions).streaming = True
    if options.view_as(GoogleCloudOptions).update and stream.checkpointed(job):
        job_config.fail("--update", "left out for a checkpointed streaming release (an "
                                    "updated job keeps its Beam state under a new execution: "
                                    "drain it, then --continue)", "--update")
    with contextlib.ExitStack() as stack:
        secret = None if job.secret.configured else stack.enter_context(ephemeral_secret())
        checkpoint = stream.checkpoint_folder(job) if stream.checkpointed(job) else None
        continuation = None
        try:
            if args.continue_release:
                transform, continuation = continued_stream(job, checkpoint)
            else:
                transform = build_transform(job, secret, checkpoint=checkpoint)
            if job.input.kind == "pubsub" and local:  # the emulator or Google Cloud, first
                remote.pubsub_reachable()
            ledger = budget.charge(job, transform)  # (a continuation: in the ledger already)
        except ValueError as error:
            print(f"error: {gate.one_line(error)}", file=sys.stderr)
            return 2
        if continuation is not None and continuation.complete:
            if not continuation.republished:
                print(f"error: `--continue` must be used on a release with steps left (release "
                      f"{transform.release_id} published all {job.steps.horizon}); got "
                      f"'complete'.", file=sys.stderr)
                return 2
            print(f"release {transform.release_id}: steps {continuation.republished} "
                  f"republished from their checkpoints; all {job.steps.horizon} steps are "
                  f"published (the release is complete)", flush=True)
            return 0
        manifest = dict(release_manifest(transform, ledger), input=io.input_binding(job),
                        source=job.input.kind)
        pipeline = beam.Pipeline(options=options)
        expansion = stack.enter_context(kafka_local.ExpansionService()).address \
            if kafka else None
        driver_claim = stream.build(pipeline, job, transform, manifest, not local,
                                    continuation, expansion)
        before = set(stream.published_steps(job)) if local or kafka else set()
        if local:  # Beam's local Pub/Sub reader: large messages, transient faults retried
            local_pubsub.install(blind=local_pubsub.blind_seconds(job.input.subscription),
                                 continuation=continuation is not None)  # a killed pull's
            local_dofns.install()  # and the project's DoFns kept between bundles
            local_watermark.pace(local_watermark.Pacer(local_watermark.deadlines(
                job.steps.time_steps(), 0 if continuation is None else continuation.first,
                transform.config.allowed_lateness_seconds,
                transform.config.release_delay_steps)))
            local_pubsub.record(None if checkpoint is None else stream.ReceiptLog(
                checkpoint, transform.config, transform.execution))
        if driver_claim is not None:
            driver_claim.claim()  # last before the job runs: a failure to build claims nothing
        result = pipeline.run()
        where = (f"release {transform.release_id}: "
                 + (f"continued from step {continuation.first} (its checkpoint verified); "
                    if continuation is not None else "")
                 + f"streaming from {job.input.source_name}; "
                 f"each step is published under {stream.steps_folder(job.public_path)}/ once "
                 f"every public key's record of it is in (" + (
                     f"{job.steps.horizon} steps" if not job.steps.unbounded else
                     "no horizon: until stopped, steps") + f" of {job.steps.size_seconds:g} s "
                 f"from {TimeSteps.iso(job.steps.origin)})")
        print(where if not args.json else json.dumps(
            {"job": job.job, "release_id": transform.release_id, "streaming": True,
             "steps": stream.steps_folder(job.public_path)}, sort_keys=True), flush=True)
        if not local and not kafka:
            return 0
        watch = stream.Watch(result)
        try:
            if not transform.private:
                print(f"release {transform.release_id}: INSECURE demo release (fixed seed): "
                      f"records are marked private: false; values are noisy running totals "
                      f"and can be negative", file=sys.stderr, flush=True)
            code = stream.follow(job, watch, sys.stdout if not args.json else sys.stderr,
                                 transform.config.release_delay_steps, before=before)
            if code == 0 and local:  # every step is published: what the job read and had not
                # released leaves as dead letters (late, outside the horizon) before it ends
                local_pubsub.drain()
                watch.thread.join(DRAIN_SECONDS)
        except KeyboardInterrupt:
            code = 130
        finally:
            watch.stop()
        published = stream.published_steps(job)
        summary = stream.operator_summary(job, published, transform.config.release_delay_steps)
        write_text(os.path.join(job.operator_path, "summary.json"),
                   json.dumps(summary, indent=2, sort_keys=True))
        if code == 2:
            text = str(watch.error)
            marker = text.find("`Pub/Sub` must answer")
            line = text[marker:].splitlines()[0] if marker >= 0 else text.splitlines()[-1]
            print(f"error: the streaming job failed: {gate.one_line(ValueError(line))}",
                  file=sys.stderr)
            return 2
        print(f"release {transform.release_id}: {len(published)} " + (
              f"of {job.steps.horizon} " if not job.steps.unbounded else "") + "steps "
              "published" + ("" if code == 0 else " (stopped" + (
                  " before the horizon's end" if not job.steps.unbounded else "") + (
                  ": --continue resumes it from its last checkpointed step)"
                  if transform.checkpoint is not None and not kafka
                  else ": the release ends here)"))
              + f"; operator-only (NOT private): {job.operator_path}/summary.json, "
                f"dead_letters-*.jsonl", flush=True)
        return 0 if code == 0 else 1


def continued_stream(job: job_config.JobConfig, checkpoint: str):
    """(the transform, its `stream.Continuation`) that continue the stopped streaming release
    in the job's folder: refused unless the config reads and releases as the release was
    started (its descriptor and input binding), with its secret, from a verified checkpoint."""
    release = stream.published_release(job)
    if release is None:
        job_config.fail("--continue", f"used where a release of job {job.job} was published "
                                      f"(none in {job.public_path})", job.output.path)
    if checkpoint is None:
        job_config.fail("--continue", "used with a count or sum (the other transforms' "
                                      "streaming releases are not checkpointed)", job.transform)
    if not job.secret.configured:
        job_config.fail("secret", "the release's own secret, configured (env, path, "
                                  "gcp_secret or seed), to continue it", "none")
    if release.get("source", "pubsub") != "pubsub":
        job_config.fail("--continue", f"used on a Pub/Sub release (this one read "
                                      f"{release.get('source')!r}: Flink restores a Kafka "
                                      f"release from its own checkpoints; a stopped one ends)",
                        release.get("source"))
    transform = build_transform(job, release_id=release.get("release_id"),
                                checkpoint=checkpoint)
    for name, now in (("descriptor", transform.descriptor),
                      ("input", io.input_binding(job))):
        if release.get(name) != json.loads(json.dumps(now)):
            job_config.fail("config", f"the one release {transform.release_id} was started "
                                      f"with (its {name} differs: a release continues on the "
                                      f"terms it was published with)", name)
    continuation = stream.Continuation(job, transform)
    continuation.republished = continuation.republish(job, transform)
    return transform, continuation


def plan_command(descriptor: dict, max_state_bytes_per_key: int = None) -> str:
    """The `pipelines.plan` command that prints the table `auto` chose from for one released
    stream's descriptor (the state budget is not in the descriptor: pass it when it is not the
    default): `plan_command.plan_arguments`, the arguments `plan --config` plans the job with too (a
    sum's carry its grid: the plan prints the errors in the job's value units)."""
    return " ".join([PLAN_COMMAND, *plan_arguments(descriptor, max_state_bytes_per_key)])


def plan_commands(transform, max_state_bytes_per_key: int = None) -> str:
    """`plan_command` of each stream the release publishes (a composed release: one per part,
    labelled)."""
    return "; ".join((f"{label}: " if label else "") + plan_command(descriptor,
                                                                    max_state_bytes_per_key)
                     for label, descriptor in transform.plan_declarations())


def public_summary(transform, job: job_config.JobConfig, public_folder: str,
                   shown_folder: str = None, records_prefix: str = "records",
                   released: int = None) -> dict:
    """What the run released; everything here is public (data-independent or DP). The records
    are read from `public_folder`; the paths name `shown_folder` (default: the job's public
    folder; the scheduler's: its release's published folder, records `records-steps-*`, and
    `released`, the steps released so far: default all)."""
    chosen = ("auto: " + ("the lowest MaxSE for this budget and these bounds" if not
                          job.steps.unbounded else "no horizon: the horizon-free mechanism "
                          "with the least error") + "; the table: "
              + plan_commands(transform, job.mechanism.max_state_bytes_per_key)
              ) if job.mechanism.name == "auto" else "configured"
    columns = io.released_columns(public_folder, {"stddev": float, "key": str},
                                  records_prefix)
    stddevs = columns["stddev"]
    records, max_se = len(stddevs), max(stddevs, default=0.0)
    if job.public_keys is None:  # selected keys: records start late, or never; the steps'
        # own stddev (data-independent), as every record of the step carries it
        count = job.steps.horizon if released is None else released
        mechanism = transform.config.build(noise_source=ConstantNoiseSource(0.0))
        deviations = mechanism.noise_std()[:count]  # = the records' (`RecordMaker.std`)
        max_se = float(max(deviations, default=0.0)) * transform.value_scale
    shown = shown_folder or job.public_path
    return {"release_id": transform.release_id, "private": transform.private,
            "transform": job.transform, **transform.summary(), "why": chosen,
            "max_se": max_se,
            "records": records, "steps": job.steps.shown_horizon,
            **_keys_summary(transform, job, columns["key"]),
            "records_path": os.path.join(shown, records_prefix) + "-*."
                            + (job.output.formats[0] if len(job.output.formats) == 1
                               else "{" + ",".join(job.output.formats) + "}"),
            "manifest": os.path.join(shown, "release.json")}


def _keys_summary(transform, job, keys: list) -> dict:
    """The public keys' count, or, keys selected privately, the rule and how many keys the
    records (`keys`: their key column) hold (public: they are the published keys)."""
    if job.public_keys is not None:
        return {"public_keys": len(job.public_keys)}
    published = len(set(keys))
    rule, scale = transform.selection, transform.value_scale
    return {"public_keys": None, "selected_keys": published,
            "selection": {"threshold": rule["threshold"] * scale, "delta": rule["delta"],
                          "max_keys_per_unit": rule["max_keys_per_unit"],
                          "contribution_bound": rule["contribution_bound"] * scale}}


def keys_text(public: dict) -> str:
    """"6 public key(s)", or the keys selected privately and their rule (value units)."""
    if public.get("public_keys") is not None:
        return f"{public['public_keys']} public key(s)"
    rule = public["selection"]
    return (f"{public['selected_keys']} key(s) selected privately (a key is published from "
            f"the first step its noisy running total reaches {rule['threshold']:g}; "
            f"selection delta {rule['delta']:g})")


def gate_note(transform) -> str:
    """Which part of the budget the input gate took (`pipelines.gate`), or nothing."""
    gate = getattr(transform, "gate", None)
    if gate is None:
        return ""
    return f", of which {budget_text(gate['budget'])} on the input gate"


def budget_text(budget: dict) -> str:
    """A budget as the configs and `plan` write it: "epsilon=1, delta=1e-06"."""
    return ", ".join(f"{name}={value:g}" for name, value in budget.items() if value is not None)


COARSE_GRID = 10  # a value grid coarser than the value range / this is pointed out


def coarse_grid_note(job) -> list:
    """A line when a sum's or mean's value grid is coarse for its range (from the config
    alone): each value moves by up to half a grid step, and the released totals and their
    intervals are those of the rounded values."""
    g = job.bounds.get("value_resolution")
    if g is None or "max_value" not in job.bounds:
        return []
    largest = magnitude(job.bounds["max_value"], job.bounds.get("min_value"))
    if g * COARSE_GRID <= largest:
        return []
    return [f"  NOTE: value_resolution {g:g} is coarse for values up to {largest:g}: each "
            f"value is rounded to a multiple of it (by up to {g / 2:g}), and the totals and "
            f"their intervals are those of the rounded values"]


def describe_run(job, transform, public: dict, operator: dict) -> str:
    """The run summary `pipelines.run` prints (and `pipelines.schedule`, whose `public` also
    holds its run's steps: `released_before`, `released_after`, `spent`, `checkpoint`; its
    `operator` is None when nothing ran)."""
    scheduled = "released_after" in public
    if "se_times_count" in public:  # a mean: its parts' errors (data-independent)
        error = (f"MaxSE of the parts: sum {public['part_max_se']['sum']:.2f}, count "
                 f"{public['part_max_se']['count']:.2f}; the mean's standard error about "
                 f"{public['se_times_count']:,.0f} / C for a key whose count is C (records "
                 f"where C is too noisy carry half the value range)")
    elif scheduled and not public["released_after"]:
        error = "MaxSE: no step released yet"
    else:
        error = (f"MaxSE {public['max_se']:.2f} (largest per-step standard deviation"
                 + (" of the steps released so far" if scheduled and public["released_after"]
                    < job.steps.horizon else "") + ")")
    horizon = f"horizon {job.steps.horizon}" if not job.steps.unbounded else \
        f"no horizon (up to {job.steps.horizon} steps)"
    lines = [f"job {job.job}: {job.transform} with {public['mechanism']} "
             f"{json.dumps(public['mechanism_params'], sort_keys=True)} ({public['why']})",
             f"  {horizon} x {job.steps.size_seconds:g} s, "
             f"{keys_text(public)}, noise {public['noise']}, {error}"]
    lines += coarse_grid_note(job)
    if scheduled:
        lines.append(f"release {public['release_id']}: steps released {public['released_before']}"
                     f" -> {public['released_after']} " + (
                         f"of {job.steps.horizon} (" if not job.steps.unbounded else
                         "(no horizon; ") + f"{public['new_steps']} new); budget spent: "
                     f"{public['spent']}")
        if public.get("state_bytes_per_key_now"):
            lines.append(f"state: {public['state_bytes_per_key_now']:,} B per key at step "
                         f"{public['released_after']} (a release with no horizon: it grows "
                         f"with the steps released)")
    elif transform.private:
        lines.append(f"release {public['release_id']}: a new release with fresh noise; it spent "
                     f"{budget_text(public['budget_spent'])} on this data" + (
                         " (again, if this data was released before)" if not
                         public.get("budget_ledger") else "") + gate_note(transform))
    if public.get("budget_ledger"):
        lines.append(budget.summary_line(public["budget_ledger"]))
    every = "every released step" if scheduled else "every step"
    lines += [f"records:      {public['records_path']} ({public['records']} records: every "
              + ("public key at " if public.get("public_keys") is not None else
                 "selected key from its selection step on, at ") + f"{every})",
              f"manifest:     {public['manifest']}"]
    if scheduled:
        lines += [f"checkpointed records: {pattern}" for pattern in public["checkpointed"]]
        if operator is None:
            lines.append("operator-only (NOT private, exact counts of the data): nothing ran "
                         "(no newly complete step)")
        else:
            lines += [f"operator-only (not private): "
                      f"{public['checkpoint']}/dead_letters-*.jsonl",
                      f"operator-only (NOT private, exact counts of this run's steps "
                      f"{public['released_before']} -> {public['released_after']}): "
                      f"{describe(operator, 'in these steps')}"]
    else:
        lines += [f"operator-only (not private): "
                  f"{os.path.join(job.operator_path, 'dead_letters')}-*.jsonl, summary.json",
                  f"operator-only (NOT private, exact counts of the data): {describe(operator)}"]
    for warning in ("horizon_warning", "truncation_warning", "keys_warning", "delta_note"):
        if operator is not None and operator.get(warning):
            lines.append(operator[warning])
    if scheduled and public["released_after"] >= job.steps.horizon:
        lines.append(f"release complete: all {job.steps.horizon} steps are released (the "
                     f"release ends here; a later run publishes nothing new)")
    return "\n".join(lines)


if __name__ == "__main__":
    logs.exit_now(main())
