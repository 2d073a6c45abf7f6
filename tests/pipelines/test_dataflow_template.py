"""The Dataflow Flex Template in dataflow/: metadata.json, the Dockerfile's launcher variables,
the launcher's parameters and the Airflow DAG agree with one another and with the repository."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATAFLOW = os.path.join(ROOT, "dataflow")
WORKDIR = "/template"   # the Dockerfile's WORKDIR: the repository root inside the image


def metadata():
    with open(os.path.join(DATAFLOW, "metadata.json"), encoding="utf-8") as handle:
        return json.load(handle)


def launcher():
    spec = importlib.util.spec_from_file_location("dataflow_main",
                                                  os.path.join(DATAFLOW, "main.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dockerfile():
    """(FROM images, ENV name -> value with ARGs substituted, COPY sources)."""
    with open(os.path.join(DATAFLOW, "Dockerfile"), encoding="utf-8") as handle:
        text = re.sub(r"\\\n", " ", handle.read())
    args, env, images, copies = {}, {}, [], []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), env.get(m.group(1), "")),
                      rest)
        if word == "ARG":
            name, _, value = rest.partition("=")
            args[name] = value
        elif word == "ENV":
            name, _, value = rest.partition("=")
            env[name] = value.strip('"')
        elif word == "FROM":
            images.append(rest.split()[0])
        elif word == "COPY":
            copies.extend(rest.split()[:-1])
    return images, env, copies


def in_repo(image_path):
    assert image_path.startswith(WORKDIR + "/"), image_path
    return os.path.join(ROOT, image_path[len(WORKDIR) + 1:])


def test_metadata_parameters_are_complete():
    meta = metadata()
    assert meta["name"] and meta["description"]
    names = [p["name"] for p in meta["parameters"]]
    assert len(set(names)) == len(names)
    for parameter in meta["parameters"]:
        assert set(parameter) <= {"name", "label", "helpText", "isOptional", "regexes"}
        for field in ("name", "label", "helpText"):
            assert isinstance(parameter[field], str) and parameter[field].strip(), parameter
        for regex in parameter.get("regexes", []):
            re.compile(regex)
    required = [p["name"] for p in meta["parameters"] if not p.get("isOptional", False)]
    assert required == ["config"]


def test_metadata_names_are_the_launchers_options():
    parser = launcher().parser()
    options = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    meta = metadata()["parameters"]
    assert {p["name"] for p in meta} == set(options)
    for parameter in meta:
        action = options[parameter["name"]]
        assert action.option_strings == ["--" + parameter["name"]]  # the launcher passes --name=
        assert action.required == (not parameter.get("isOptional", False))
        if action.choices:
            (regex,) = parameter["regexes"]
            assert {c for c in action.choices if re.fullmatch(regex, c)} == set(action.choices)
            assert not re.fullmatch(regex, "other")


@pytest.mark.parametrize("name, good, bad", [
    ("config", ["gs://b/configs/a.yaml", "demo:active_users"], ["configs/a.yaml", "demo:../x"]),
    ("state_dir", ["gs://b/state/a"], ["/tmp/state", "state"]),
    ("now", ["2026-01-06T12:00:00Z", "2026-01-06T12:00:00+00:00", "2026-01-06T12:00:00.5Z"],
     ["2026-01-06T12:00:00", "yesterday", "1767700800"]),
])
def test_metadata_regexes(name, good, bad):
    (parameter,) = [p for p in metadata()["parameters"] if p["name"] == name]
    (regex,) = parameter["regexes"]
    assert all(re.fullmatch(regex, v) for v in good)
    assert not any(re.fullmatch(regex, v) for v in bad)


def test_every_now_the_regex_accepts_the_scheduler_parses():
    from pipelines.config import parse_time
    (regex,) = [p["regexes"][0] for p in metadata()["parameters"] if p["name"] == "now"]
    for value in ("2026-01-06T12:00Z", "2026-01-06T12:00:00.25-05:30"):
        assert re.fullmatch(regex, value)
        parse_time("now", value)


def test_dockerfile_points_the_launcher_at_files_of_the_repository():
    images, env, copies = dockerfile()
    assert images[0].startswith("gcr.io/dataflow-templates-base/python311-template-launcher-base")
    py_file, setup_file = env["FLEX_TEMPLATE_PYTHON_PY_FILE"], env["FLEX_TEMPLATE_PYTHON_SETUP_FILE"]
    assert os.path.isfile(in_repo(py_file)) and in_repo(py_file) == os.path.join(DATAFLOW,
                                                                                 "main.py")
    assert os.path.isfile(in_repo(setup_file)) and in_repo(setup_file) == os.path.join(
        ROOT, "setup.py")
    for source in copies:                  # everything copied exists
        assert os.path.exists(os.path.join(ROOT, source)), source
    # the image holds what the package and its sdist need (setup.py reads README.md)
    assert {"setup.py", "README.md", "MANIFEST.in", "transforms", "pipelines",
            "dataflow"} <= set(copies)


def test_the_launcher_runs_the_drivers():
    main = launcher()
    assert main.driver(["--config", "gs://b/a.yaml", "--runner=DataflowRunner"]) == (
        "pipelines.run", ["--config", "gs://b/a.yaml", "--runner=DataflowRunner"])
    assert main.driver(["--config=gs://b/a.yaml", "--mode=schedule", "--state_dir=gs://b/s",
                        "--now=2026-01-06T12:00:00Z", "--project=p"]) == (
        "pipelines.schedule", ["--config", "gs://b/a.yaml", "--state-dir", "gs://b/s",
                               "--now", "2026-01-06T12:00:00Z", "--project=p"])
    # a Flex Template launch stages the job; the job commits itself (tests/pipelines/test_commit.py)
    assert main.driver(["--config=gs://b/a.yaml", "--mode=schedule", "--state_dir=gs://b/s",
                        "--template_location=gs://b/staging/job"])[1][-1] == \
        "--template_location=gs://b/staging/job"
    for module, _ in (main.driver(["--config", "x"]),
                      main.driver(["--config", "x", "--mode", "schedule", "--state_dir", "s"])):
        assert importlib.util.find_spec(module) is not None
        assert callable(getattr(importlib.import_module(module), "main"))


@pytest.mark.parametrize("argv, pattern", [
    (["--config", "x", "--mode", "schedule"], r"^`state_dir` must be given with mode schedule"),
    (["--config", "x", "--state_dir", "gs://b/s"], r"^`state_dir` must be absent with mode run"),
    (["--config", "x", "--now", "2026-01-06T12:00:00Z"], r"^`now` must be absent with mode run"),
])
def test_the_launcher_refuses(argv, pattern, capsys):
    main = launcher()
    with pytest.raises(ValueError, match=pattern):
        main.driver(argv)
    assert main.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `") and err.count("\n") == 1


def test_the_launcher_runs_a_demo_job(tmp_path):
    """End to end through the launcher (in-process runner, bundled demo config and data)."""
    import yaml
    with open(os.path.join(ROOT, "configs", "active_users.yaml"), encoding="utf-8") as handle:
        raw = yaml.safe_load(handle)
    raw["output"] = {"path": str(tmp_path / "out"), "formats": ["jsonl"]}
    raw["secret"] = {"seed": 3, "insecure": True}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert launcher().main(["--config", str(config)]) == 0
    assert os.path.isfile(tmp_path / "out" / raw["job"] / "release.json")


def dag_launch_parameters():
    with open(os.path.join(DATAFLOW, "airflow_dag.py"), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    imports = {alias.name: node.module for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) for alias in node.names}
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "DataflowStartFlexTemplateOperator"]
    return imports, calls


def test_the_dag_launches_the_template_with_its_parameters():
    imports, calls = dag_launch_parameters()
    assert imports["DataflowStartFlexTemplateOperator"] == \
        "airflow.providers.google.cloud.operators.dataflow"
    assert len(calls) == 1
    keywords = {k.arg: k.value for k in calls[0].keywords}
    assert {"task_id", "project_id", "location", "body"} <= set(keywords)
    body = keywords["body"]
    launch = dict(zip((k.value for k in body.keys), body.values))["launchParameter"]
    launch = dict(zip((k.value for k in launch.keys), launch.values))
    assert {"jobName", "containerSpecGcsPath", "parameters"} <= set(launch)
    passed = dict(zip((k.value for k in launch["parameters"].keys), launch["parameters"].values))
    meta = {p["name"]: p for p in metadata()["parameters"]}
    assert set(passed) == set(meta)
    mode = passed["mode"]
    assert isinstance(mode, ast.Constant) and re.fullmatch(meta["mode"]["regexes"][0],
                                                           mode.value)
    assert mode.value == "schedule"


def test_scheduling_commands_use_the_templates_parameters():
    """SCHEDULING.md's `flex-template run --parameters` names are metadata.json's, and the
    Cloud Run job's launcher arguments are options the launcher takes (or Beam's)."""
    with open(os.path.join(DATAFLOW, "SCHEDULING.md"), encoding="utf-8") as handle:
        text = handle.read().replace("\\\n", " ")
    names = {p["name"] for p in metadata()["parameters"]}
    given = re.findall(r"--parameters (\S+)", text)
    assert given
    for parameters in given:
        assert {item.split("=", 1)[0] for item in parameters.split(",")} <= names, parameters
    launched = re.findall(r"--args=/template/dataflow/main\.py,(\S+)", text)
    assert launched
    module, argv = launcher().driver(launched[0].split(","))
    assert module == "pipelines.schedule" and "--state-dir" in argv


def test_the_image_build_context_holds_what_the_dockerfile_copies_and_no_more():
    """.dockerignore lets through exactly the sources of dataflow/Dockerfile's COPY lines
    (the build context would otherwise upload .engines/, .git/ and output/)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    copied = set()
    for line in open(os.path.join(root, "dataflow", "Dockerfile")):
        if line.startswith("COPY "):
            copied.update(line.split()[1:-1])
    rules = [line.strip() for line in open(os.path.join(root, ".dockerignore"))
             if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    assert allowed == copied, (allowed, copied)
