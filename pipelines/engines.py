"""Apache Flink and Apache Spark through Beam's portable runners, from jars fetched once.

    python3 -m pipelines.engines fetch [flink] [spark]   # Maven Central -> .engines/ (once)
    python3 -m pipelines.engines status                  # what is installed, one line each
    python3 -m pipelines.engines cluster [--slots 2]     # a standalone Flink cluster here
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
themselves, as on Dataflow (`remote.preflight`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Dict, List, Optional, Sequence, Tuple

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
    runner: Optional[str]  # None: a tool the engines use (Kafka, its expansion service)
    artifacts: Tuple[str, ...]
    main: str
    jvm: Tuple[str, ...] = ()
    exclude: Tuple[str, ...] = ()  # group ids left out of every artifact's dependencies

    @property
    def folder(self) -> str:
        return os.path.join(HOME, self.name)

    @property
    def jar(self) -> str:
        return os.path.join(self.folder, f"{self.name}-job-server.jar")

    @property
    def master_option(self) -> str:
        return "--flink_master" if self.name == "flink" else "--spark_master_url"

    def options(self) -> List[str]:
        """The Beam options of a run on this engine, on this machine (its job server is
        `job_server`'s)."""
        if self.name == "flink":
            found = ["--flink_master=[local]", f"--parallelism={PARALLELISM}"]
        else:
            found = [f"--spark_master_url=local[{PARALLELISM}]"]
        return found + ["--environment_type=LOOPBACK"]


# Beam's Kafka read (cross-language): its Java part runs inside the Flink job server (the
# EMBEDDED environment), so the job server's class path has it too; Confluent's schema
# registry (not served by Maven Central) is left out
KAFKA_IO = (f"org.apache.beam:beam-sdks-java-io-kafka:{BEAM_JAVA}",
            "org.apache.kafka:kafka-clients:3.9.1", "com.github.jbellis:jamm:0.4.0")
# JDK internals that Java 17 closes by default and the engines read: Spark 3.5, and Flink's
# Kryo when a streaming job checkpoints or restores state (Flink's own scripts open them too)
JAVA17_OPENS = tuple(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in (
    "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio",
    "java.text", "java.time", "java.util", "java.util.concurrent",
    "java.util.concurrent.atomic", "java.util.concurrent.locks", "sun.nio.ch"))
ENGINES: Dict[str, Engine] = {engine.runner: engine for engine in (
    Engine("flink", "FlinkRunner",
           (f"org.apache.beam:beam-runners-flink-1.19:{BEAM_JAVA}", *KAFKA_IO,
            "org.slf4j:slf4j-simple:1.7.30"),  # the job server's log, on stderr
           "org.apache.beam.runners.flink.FlinkJobServerDriver", JAVA17_OPENS,
           exclude=("io.confluent",)),
    Engine("spark", "SparkRunner",
           (f"org.apache.beam:beam-runners-spark-3:{BEAM_JAVA}",
            "org.apache.spark:spark-core_2.12:3.5.0", "org.apache.spark:spark-streaming_2.12:3.5.0",
            "org.apache.spark:spark-sql_2.12:3.5.0", "org.slf4j:slf4j-api:2.0.7"),
           "org.apache.beam.runners.spark.SparkJobServerDriver", JAVA17_OPENS),
)}
TOOLS = (
    # a Kafka broker (KRaft: no ZooKeeper) for the tests and the local Kafka jobs
    Engine("kafka", None, ("org.apache.kafka:kafka_2.13:4.4.0",
                           "org.apache.kafka:kafka-tools:4.4.0",
                           "org.apache.logging.log4j:log4j-slf4j-impl:2.25.5"), "kafka.Kafka"),
    # Beam's expansion service for the Kafka read, at the job servers' Beam version
    Engine("kafka-expansion", None, (*KAFKA_IO[:2],
                                     f"org.apache.beam:beam-sdks-java-expansion-service:"
                                     f"{BEAM_JAVA}",
                                     f"org.apache.beam:beam-sdks-java-harness:{BEAM_JAVA}",
                                     "org.slf4j:slf4j-simple:1.7.30"),
           "org.apache.beam.sdk.expansion.service.ExpansionService", exclude=("io.confluent",)),
)
BY_NAME = {engine.name: engine for engine in (*ENGINES.values(), *TOOLS)}


def free_port() -> int:
    """A free TCP port of localhost (for a server started next)."""
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, seconds: float, what: str,
                  log: str) -> None:
    """Returns once `process` accepts connections on `port`; a one-line error if it exits or
    `seconds` pass first (naming its `log`)."""
    import socket
    deadline = time.time() + seconds
    while True:
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.time() > deadline:
                raise ValueError(f"`{what}` must start within {seconds:g} s; got exit "
                                 f"{process.poll()} (its log: {log}).") from None
            time.sleep(0.2)


def stop(processes: Sequence[subprocess.Popen]) -> None:
    """Each process's group asked to end (SIGTERM), killed after 20 s."""
    import signal
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


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
    master = engine.master_option
    if _given(beam_args, master) not in (None, "[local]", "[auto]") and not str(
            _given(beam_args, master)).startswith("local") and "--environment_type" not in given:
        raise ValueError(f"`--environment_type` must be given with `{master}` (LOOPBACK: the "
                         f"SDK workers are this process; PROCESS or EXTERNAL: a cluster's); "
                         f"got none.")
    added = [option for option in engine.options() if option.split("=", 1)[0] not in given]
    return list(beam_args) + added


@contextlib.contextmanager
def job_server(beam_args: Sequence[str], start_seconds: float = 120.0):
    """A run's Beam options with the endpoint of a job server started here (a Flink or Spark
    run: `java -jar` its jar, on free ports, for the run's master), stopped when the block
    ends; other runs' options unchanged. Beam would start one itself and stop it at the
    interpreter's exit, which the project's commands skip (`logs.exit_now`): every run left
    a JVM behind."""
    engine = ENGINES.get(runner_of(beam_args))
    if engine is None or _given(beam_args, "--job_endpoint") is not None:
        yield list(beam_args)
        return
    port = free_port()
    folder = tempfile.mkdtemp(prefix=f"dp-{engine.name}-job-server-")
    master = _given(beam_args, engine.master_option)
    log = open(os.path.join(folder, "job-server.log"), "w")
    process = subprocess.Popen(
        ["java", *engine.jvm, "-jar", engine.jar, "--job-port", str(port), "--artifact-port",
         "0", "--expansion-port", "0", "--artifacts-dir", os.path.join(folder, "artifacts"),
         "--" + engine.master_option[2:].replace("_", "-"), master],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    failed = True
    try:
        wait_for_port(port, process, start_seconds, f"{engine.name} job server", log.name)
        yield list(beam_args) + [f"--job_endpoint=localhost:{port}"]
        failed = False
    finally:
        stop([process])
        log.close()
        if not failed:
            shutil.rmtree(folder, ignore_errors=True)


FLINK_STREAMING = (  # a streaming job's Flink options, unless given
    ("--checkpointing_interval", 5000),  # ms: Flink restores a failed job from its checkpoint
    # the public keys' seeds come from a Create: with checkpoints on, Beam's Flink runner keeps
    # that source open (idle) and its watermark at the start of time, so no key is released;
    # Flink 1.19 checkpoints on after a source finished
    ("--shutdown_sources_after_idle_ms", 1000))


def flink_streaming(beam_args) -> List[str]:
    """A streaming job's options on Flink: `beam_args` and each of FLINK_STREAMING not given.
    A job written to a jar to run later is refused: its release is claimed by this driver
    (`claims.ClaimedByDriver`), and the jar could run it twice."""
    if _given(beam_args, "--output_executable_path") is not None:
        raise ValueError("`--output_executable_path` must be left out for a Kafka release (it "
                         "is claimed at launch: a jar run twice would release it twice); got "
                         f"{_given(beam_args, '--output_executable_path')!r}.")
    return [*beam_args, *(f"{name}={value}" for name, value in FLINK_STREAMING
                          if _given(beam_args, name) is None)]


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
    their data and state channels at the end of a job (gRPC CANCELLED: "Multiplexer hanging
    up", eight per Spark run); every other thread exception is printed as before. A failed
    job fails through its result's state, not through these threads."""
    import threading
    previous = threading.excepthook

    def hook(args):
        error, name = args.exc_value, getattr(args.thread, "name", "") or ""
        code = getattr(error, "code", None)
        cancelled = callable(code) and getattr(code(), "name", None) == "CANCELLED"
        if not cancelled and error is not None and "Multiplexer hanging up" in str(error):
            cancelled = True
        if cancelled and name.startswith(("read_grpc_client_inputs", "read_state", "run_worker_")):
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


def pom(artifacts: Sequence[str], exclude: Sequence[str] = ()) -> str:
    excluded = "".join(f"<exclusion><groupId>{group}</groupId><artifactId>*</artifactId>"
                       f"</exclusion>" for group in exclude)
    excluded = f"<exclusions>{excluded}</exclusions>" if excluded else ""
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}"
        f"</version>{excluded}</dependency>" for g, a, v in (item.split(":")
                                                            for item in artifacts))
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
            handle.write(pom(engine.artifacts, engine.exclude))
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


class FlinkCluster:
    """A standalone Flink session cluster on this machine: a JobManager and a TaskManager
    process with `slots` task slots, started from Flink's own entry points in the Flink
    runner's jars (`fetch flink`; Maven Central does not serve Flink's distribution), on free
    ports, logs and configuration under `folder`. A context manager: the processes stop at
    its end. `master` is what `--flink_master` takes, e.g.

        with FlinkCluster(slots=2) as cluster:
            run(["--runner=FlinkRunner", f"--flink_master={cluster.master}",
                 "--environment_type=LOOPBACK"])
    """

    JOB_MANAGER = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
    TASK_MANAGER = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"

    def __init__(self, slots: int = PARALLELISM, folder: str = None, start_seconds=120.0):
        self.slots, self.start_seconds = slots, start_seconds
        self.folder = folder or tempfile.mkdtemp(prefix="dp-flink-cluster-")
        self.processes: List[subprocess.Popen] = []
        self.rest_port = None

    @property
    def master(self) -> str:
        return f"localhost:{self.rest_port}"

    def _config(self) -> str:
        self.rest_port, rpc = free_port(), free_port()
        conf = os.path.join(self.folder, "conf")
        os.makedirs(conf, exist_ok=True)
        with open(os.path.join(conf, "flink-conf.yaml"), "w") as handle:
            handle.write("\n".join([
                "jobmanager.rpc.address: localhost", f"jobmanager.rpc.port: {rpc}",
                "jobmanager.bind-host: localhost", "taskmanager.bind-host: localhost",
                "taskmanager.host: localhost", "rest.address: localhost",
                "rest.bind-address: localhost", f"rest.port: {self.rest_port}",
                f"taskmanager.numberOfTaskSlots: {self.slots}",
                f"parallelism.default: {self.slots}",
                "jobmanager.memory.process.size: 1024m",
                # a batch job's many stages each reserve sort-shuffle buffers (512 by default)
                "taskmanager.memory.process.size: 2048m",
                "taskmanager.memory.network.min: 320mb", "taskmanager.memory.network.max: 320mb",
                "taskmanager.network.sort-shuffle.min-buffers: 64",
                # a lost TaskManager is noticed in seconds (50 s by default), and a streaming
                # job restarts from its last checkpoint once slots are back
                "heartbeat.interval: 2000", "heartbeat.timeout: 8000",
                "restart-strategy.type: fixed-delay",
                "restart-strategy.fixed-delay.attempts: 20",
                "restart-strategy.fixed-delay.delay: 3 s",
                ""]))
        return conf

    def _start(self, main: str, conf: str, name: str) -> None:
        """A Flink process as Flink's scripts start it: its JVM memory flags and dynamic
        properties computed by Flink's `BashJavaUtils` from the configuration."""
        libs = os.path.join(BY_NAME["flink"].folder, "libs", "*")
        kind = "GET_TM_RESOURCE_PARAMS" if name.startswith("taskmanager") else "GET_JM_RESOURCE_PARAMS"
        found = subprocess.run(["java", "-cp", libs, "org.apache.flink.runtime.util.bash."
                                "BashJavaUtils", kind, "--configDir", conf],
                               capture_output=True, text=True, timeout=120)
        marker = "BASH_JAVA_UTILS_EXEC_RESULT:"
        results = [line[len(marker):].split() for line in found.stdout.splitlines()
                   if line.startswith(marker)]
        if len(results) < 2:
            raise ValueError(f"`Flink {name} memory` must be computable from {conf}; got "
                             f"{(found.stderr or found.stdout).strip()[-150:]!r}.")
        jvm, dynamic = results[-2], results[-1]
        log = open(os.path.join(self.folder, f"{name}.log"), "w")
        self.processes.append(subprocess.Popen(
            ["java", *JAVA17_OPENS, *jvm, "-cp", libs, main, "--configDir", conf, *dynamic],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def overview(self):
        """The cluster's REST overview (slots, jobs), or None while it does not answer."""
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://{self.master}/overview", timeout=2) as reply:
                return json.loads(reply.read().decode("utf-8"))
        except (OSError, ValueError):
            return None

    def __enter__(self) -> "FlinkCluster":
        if not installed(BY_NAME["flink"]):
            raise ValueError("`flink` must be installed for a cluster (python3 -m "
                             "pipelines.engines fetch flink); got none.")
        conf = self.conf = self._config()
        self._start(self.JOB_MANAGER, conf, "jobmanager")
        self._start(self.TASK_MANAGER, conf, "taskmanager")
        deadline = time.time() + self.start_seconds
        while time.time() < deadline:
            overview = self.overview()
            if overview and overview.get("slots-total", 0) >= self.slots:
                return self
            if any(process.poll() is not None for process in self.processes):
                break
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"`Flink cluster` must start within {self.start_seconds:g} s; got "
                           f"no {self.slots} slots (logs in {self.folder}).")

    def kill_taskmanager(self) -> None:
        """SIGKILLs the TaskManager, as a lost machine; `start_taskmanager` gives the cluster
        a new one (a job restarts from its last checkpoint on it)."""
        process = self.processes.pop()
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def start_taskmanager(self) -> None:
        self._start(self.TASK_MANAGER, self.conf, f"taskmanager-{len(self.processes)}")

    def __exit__(self, *exc) -> None:
        stop(self.processes)
        self.processes = []


def status_lines() -> List[str]:
    java = shutil.which("java")
    lines = [f"java: {java or 'missing (the job servers need Java 17)'}"]
    for engine in BY_NAME.values():
        lines.append(f"{engine.name}: " + (
            f"installed ({_shown(engine.jar)}" + (
                f"; --runner {engine.runner})" if engine.runner else ")")
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
    cluster = sub.add_parser("cluster", help="a standalone Flink cluster on this machine, "
                                             "until Ctrl-C")
    cluster.add_argument("--slots", type=int, default=PARALLELISM)
    args = parser.parse_args(argv)
    if args.command == "cluster":
        try:
            with FlinkCluster(slots=args.slots) as running:
                print(f"Flink cluster: --flink_master={running.master} ({args.slots} slots; "
                      f"logs in {running.folder}); Ctrl-C stops it", flush=True)
                while all(process.poll() is None for process in running.processes):
                    time.sleep(1)
        except KeyboardInterrupt:
            pass
        except (ValueError, RuntimeError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
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
