"""Apache Flink and Apache Spark through Beam's portable runners, from jars fetched once.

    python3 -m pipelines.engines fetch [flink] [spark]   # Maven Central -> .engines/ (once)
    python3 -m pipelines.engines status                  # what is installed, one line each
    python3 -m pipelines.run --config configs/signups.yaml --runner FlinkRunner

Beam's `FlinkRunner` and `SparkRunner` (`runners/portability/flink_runner.py`,
`spark_runner.py`) start a Java job server (`job_server.JavaJarJobServer`: `java -jar JAR`),
which runs the pipeline on an embedded Flink or Spark (`--flink_master=[local]`,
`--spark_master_url=local[N]`) or submits it to a cluster. Beam would download the job server's
jar from the internet; here `fetch` puts it in place from Maven Central: the runner's artifact
and its dependencies (`mvn dependency:copy-dependencies`), and a jar that holds only a manifest
naming them (`Main-Class`, `Class-Path`). Nothing is fetched at run time: `runner_args` adds
the installed jar to a run's options, or says in one line what is missing.

Versions: Maven Central serves Beam's Flink and Spark runners up to 2.62.0 here (2.63.0 to
2.75.0 lack a dependency, `beam-runners-java-job-service`, or the runner itself), while the
Python SDK is 2.77. The job server speaks Beam's portable Job and Fn APIs, which both
versions share; the engine tests (`tests/pipelines/test_engines.py`) run the project's jobs
through it and compare their records with the local runner's bit for bit.

Workers: `runner_args` sets `--environment_type=LOOPBACK`, so the SDK harness is the launching
process: it reads and writes this machine's paths (input, output, claims, checkpoints), and a
local secret reaches it. On a cluster with workers on other hosts (`PROCESS` or `EXTERNAL`
environments), every path must be one they all reach (gs://) and the secret one they resolve
themselves, as on Dataflow (`io.remote_preflight`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Dict, List, Sequence, Tuple

from transforms.continual import workers_here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOME = os.environ.get("DP_ENGINES", os.path.join(ROOT, ".engines"))  # where `fetch` puts them
BEAM_JAVA = "2.62.0"  # the newest Beam whose Flink and Spark runners Maven Central serves here
PARALLELISM = 2


@dataclasses.dataclass(frozen=True)
class Engine:
    """A job server to fetch: its Maven artifacts (group:artifact:version), main class, the
    JVM flags it needs on Java 17, and the Beam options that select it."""
    name: str
    runner: str
    artifacts: Tuple[str, ...]
    main: str
    jvm: Tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        return os.path.join(HOME, self.name)

    @property
    def jar(self) -> str:
        return os.path.join(self.folder, f"{self.name}-job-server.jar")

    def options(self) -> List[str]:
        """The Beam options of a run on this engine, on this machine."""
        if self.name == "flink":
            found = [f"--flink_job_server_jar={self.jar}", "--flink_master=[local]",
                     f"--parallelism={PARALLELISM}"]
        else:
            found = [f"--spark_job_server_jar={self.jar}",
                     f"--spark_master_url=local[{PARALLELISM}]"]
        return found + ["--environment_type=LOOPBACK"] + [
            f"--job_server_jvm_properties={flag}" for flag in self.jvm]


ENGINES: Dict[str, Engine] = {engine.runner: engine for engine in (
    Engine("flink", "FlinkRunner",
           (f"org.apache.beam:beam-runners-flink-1.19:{BEAM_JAVA}",
            "org.slf4j:slf4j-simple:1.7.30"),  # the job server's log, on stderr
           "org.apache.beam.runners.flink.FlinkJobServerDriver"),
    Engine("spark", "SparkRunner",
           (f"org.apache.beam:beam-runners-spark-3:{BEAM_JAVA}",
            "org.apache.spark:spark-core_2.12:3.5.0", "org.apache.spark:spark-streaming_2.12:3.5.0",
            "org.apache.spark:spark-sql_2.12:3.5.0", "org.slf4j:slf4j-api:2.0.7"),
           "org.apache.beam.runners.spark.SparkJobServerDriver",
           # Spark 3.5 reads JDK internals that Java 17 closes by default
           tuple(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in (
               "java.lang", "java.lang.invoke", "java.nio", "java.util", "sun.nio.ch"))),
)}
BY_NAME = {engine.name: engine for engine in ENGINES.values()}


def _given(beam_args: Sequence[str], option: str):
    """The last value given for `option` (`--x=v` or `--x v`), else None."""
    found = None
    for i, arg in enumerate(beam_args):
        if arg.startswith(option + "="):
            found = arg.split("=", 1)[1]
        elif arg == option and i + 1 < len(beam_args):
            found = beam_args[i + 1]
    return found


def _shown(path: str) -> str:
    """`path` relative to the current folder when inside it, else as it is."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def installed(engine: Engine) -> bool:
    return os.path.isfile(engine.jar)


def runner_args(runner: str, beam_args: Sequence[str]) -> List[str]:
    """`beam_args` with the options a run on `runner` needs here (an engine of ENGINES: its
    job server jar, an embedded engine of PARALLELISM workers, the LOOPBACK environment),
    each kept where the caller gave it; other runners: unchanged. A missing engine is a
    one-line error saying how to fetch it."""
    engine = ENGINES.get(runner)
    if engine is None:
        return list(beam_args)
    if not installed(engine):
        raise ValueError(f"`--runner {runner}` must have its job server installed (python3 -m "
                         f"pipelines.engines fetch {engine.name}); got none in "
                         f"{_shown(engine.folder)}.")
    given = {arg.split("=", 1)[0] for arg in beam_args if arg.startswith("--")}
    master = "--flink_master" if engine.name == "flink" else "--spark_master_url"
    if _given(beam_args, master) not in (None, "[local]", "[auto]") and not str(
            _given(beam_args, master)).startswith("local") and "--environment_type" not in given:
        raise ValueError(f"`--environment_type` must be given with `{master}` (LOOPBACK: the "
                         f"SDK workers are this process; PROCESS or EXTERNAL: a cluster's); "
                         f"got none.")
    added = [option for option in engine.options()
             if option.split("=", 1)[0] not in given
             or option.startswith("--job_server_jvm_properties")]
    return list(beam_args) + added


def runner_of(beam_args) -> str:
    """The class name of the runner Beam creates from `beam_args`: its last `--runner` (Beam's
    options parser keeps the last), named as Beam's `create_runner` resolves it ("flink",
    "flinkrunner" -> FlinkRunner; a qualified name -> its class name); FnApiRunner if none."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    name = PipelineOptions(list(beam_args)).view_as(StandardOptions).runner
    if not name:
        return "FnApiRunner"
    known = {known.lower(): known for known in StandardOptions.KNOWN_RUNNER_NAMES}
    return known.get(name.lower(), known.get(name.lower() + "runner", name.rsplit(".", 1)[-1]))


def local_paths(beam_args) -> bool:
    """Whether the run's workers read and write this machine's paths (`workers_here`)."""
    from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions
    environment = PipelineOptions(list(beam_args)).view_as(PortableOptions).environment_type
    return workers_here(runner_of(beam_args), environment)


def with_runner(beam_args, runner: str) -> list:
    """`beam_args` naming `runner` once, as its last `--runner` (what `runner_of` read)."""
    kept, skip = [], False
    for arg in beam_args:
        if skip:
            skip = False
        elif arg == "--runner":
            skip = True
        elif not arg.startswith("--runner="):
            kept.append(arg)
    return kept + [f"--runner={runner}"]


def prepared(beam_args: Sequence[str]) -> Tuple[List[str], bool]:
    """(`beam_args` as a run passes them to Beam: its runner named once, a Flink or Spark
    run's options from `runner_args`; whether its workers use this machine's paths)."""
    runner = runner_of(beam_args)
    args = list(beam_args)
    if any(arg.startswith("--runner") for arg in args):
        args = with_runner(args, runner)
    if runner in ENGINES:
        args = runner_args(runner, args)
        quiet_worker_shutdown()
    return args, local_paths(args)


def quiet_worker_shutdown() -> None:
    """Drops the tracebacks of Beam's LOOPBACK worker threads when the job server hangs up
    their data channel at the end of a job (gRPC CANCELLED: "Multiplexer hanging up", eight
    per Spark run); every other thread exception is printed as before. A failed job fails
    through its result's state, not through these threads."""
    import threading
    previous = threading.excepthook

    def hook(args):
        error, name = args.exc_value, getattr(args.thread, "name", "") or ""
        code = getattr(error, "code", None)
        cancelled = callable(code) and getattr(code(), "name", None) == "CANCELLED"
        if not cancelled and error is not None and "Multiplexer hanging up" in str(error):
            cancelled = True
        if cancelled and name.startswith(("read_grpc_client_inputs", "run_worker_")):
            return
        previous(args)
    threading.excepthook = hook


def manifest(main: str, jars: Sequence[str]) -> bytes:
    """A jar manifest naming `main` and the class path `jars` (absolute file URLs), its lines
    wrapped at 72 bytes as the jar specification requires."""
    def wrapped(line: str) -> bytes:
        data, out = line.encode("utf-8"), []
        out.append(data[:72])
        data = data[72:]
        while data:
            out.append(b" " + data[:71])
            data = data[71:]
        return b"\r\n".join(out) + b"\r\n"
    urls = " ".join("file:" + os.path.abspath(jar) for jar in jars)
    return (b"Manifest-Version: 1.0\r\n" + wrapped(f"Main-Class: {main}")
            + wrapped(f"Class-Path: {urls}") + b"\r\n")


def pom(artifacts: Sequence[str]) -> str:
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}"
        f"</version></dependency>" for g, a, v in (item.split(":") for item in artifacts))
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0'
            '</modelVersion><groupId>local</groupId><artifactId>engine</artifactId>'
            '<version>1</version><packaging>pom</packaging>'
            f'<dependencies>{deps}</dependencies></project>\n')


def fetch(engine: Engine, mvn: str = "mvn") -> str:
    """The engine's artifacts from Maven Central into its folder, then its manifest jar
    (written last: an interrupted fetch leaves no jar, and runs say it is missing)."""
    if shutil.which(mvn) is None:
        raise ValueError(f"`mvn` must be on the PATH to fetch {engine.name} (Maven, with "
                         f"Java 17); got none.")
    libs = os.path.join(engine.folder, "libs")
    with tempfile.TemporaryDirectory(prefix="dp-engine-") as work:
        with open(os.path.join(work, "pom.xml"), "w") as handle:
            handle.write(pom(engine.artifacts))
        staged = os.path.join(work, "libs")
        done = subprocess.run([mvn, "-q", "-B", "dependency:copy-dependencies",
                               f"-DoutputDirectory={staged}"], cwd=work,
                              capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line for line in done.stdout.splitlines() if "ERROR" in line]
            raise ValueError(f"`{engine.name}` must be served by Maven Central; got "
                             f"{(errors or ['mvn exit ' + str(done.returncode)])[0][:150]}")
        if os.path.exists(engine.jar):
            os.remove(engine.jar)
        shutil.rmtree(libs, ignore_errors=True)
        os.makedirs(engine.folder, exist_ok=True)
        shutil.move(staged, libs)
    jars = sorted(os.path.join(libs, name) for name in os.listdir(libs) if name.endswith(".jar"))
    partial = engine.jar + ".partial"
    with zipfile.ZipFile(partial, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", manifest(engine.main, jars))
    os.replace(partial, engine.jar)
    return engine.jar


def status_lines() -> List[str]:
    java = shutil.which("java")
    lines = [f"java: {java or 'missing (the job servers need Java 17)'}"]
    for engine in ENGINES.values():
        lines.append(f"{engine.name}: " + (
            f"installed ({_shown(engine.jar)}; --runner {engine.runner})"
            if installed(engine) else
            f"missing (python3 -m pipelines.engines fetch {engine.name})"))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="fetch engines' job servers from Maven Central")
    get.add_argument("names", nargs="*", metavar="|".join(sorted(BY_NAME)),
                     help="default: all")
    sub.add_parser("status", help="what is installed")
    args = parser.parse_args(argv)
    if args.command == "status":
        print("\n".join(status_lines()))
        return 0
    for name in args.names or sorted(BY_NAME):
        if name not in BY_NAME:
            print(f"error: `engine` must be one of {', '.join(sorted(BY_NAME))}; got {name!r}.",
                  file=sys.stderr)
            return 2
        try:
            path = fetch(BY_NAME[name])
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        count = len(os.listdir(os.path.join(BY_NAME[name].folder, "libs")))
        print(f"{name}: {_shown(path)} ({count} jars)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
