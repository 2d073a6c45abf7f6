"""Packaging: `pip install .` locally; `--setup_file ./setup.py` ships it to Dataflow workers."""
import setuptools

setuptools.setup(
    name="dp-continual-release",
    version="0.1.0",
    description="Differentially private continual release (running counts) for Apache Beam",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["transforms", "transforms.*",
                                               "pipelines", "pipelines.*", "configs"]),
    package_data={"pipelines": ["demo_data/*.jsonl", "demo_data/*.txt"],
                  "configs": ["*.yaml", "streaming/*.yaml"]},
    include_package_data=True,
    install_requires=[
        "apache-beam>=2.60,<3",
        "numpy>=1.24",
        "pyarrow>=14.0.1",
        "pyyaml>=6",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3", "scipy>=1.10", "dp-accounting>=0.4", "wheel",
                 "matplotlib>=3.5", "hypothesis>=6.100",
                 # the live streaming test reads from the local Pub/Sub emulator
                 "google-cloud-pubsub>=2.18,<3",
                 # the Kafka tests produce their events with it (pipelines.kafka_local)
                 "confluent-kafka>=2.3,<3"],
        "report": ["matplotlib>=3.5"],
        # benchmarks/table.py's first row: PipelineDP's one-shot Count beside ours
        "bench": ["pipeline-dp==0.3.1"],
        # streaming jobs from Pub/Sub (pipelines.stream, the local emulator's demo)
        "pubsub": ["google-cloud-pubsub>=2.18,<3"],
        # Dataflow: GCP I/O for the runner and secrets from Google Secret Manager
        "gcp": ["apache-beam[gcp]>=2.60,<3", "google-cloud-secret-manager>=2.16,<3"],
    },
)
