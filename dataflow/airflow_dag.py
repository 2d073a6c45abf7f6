"""Airflow DAG: the scheduled release of one job through the Flex Template
(apache-airflow-providers-google). Copy it into the DAGs folder and set the constants.

Each DAG run launches dataflow/metadata.json's template with mode schedule and `now` = the end
of the run's data interval, so a late or repeated run releases exactly the steps complete by
then (re-running spends nothing). max_active_runs=1: runs of one release never overlap (the
state directory's commit marker refuses the second of two concurrent runs anyway).

The job commits its checkpoint and publishes its records as its last stage (the launcher only
stages it), and wait_until_finished=True makes the task fail when the job fails: a run that lost
the commit race to another fails its job with "another run already committed steps from ...",
having published nothing.
"""
from __future__ import annotations

import datetime

from airflow import DAG
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator

PROJECT = "my-project"
REGION = "europe-west1"
BUCKET = "my-bucket"
JOB = "active_users"
TEMPLATE = f"gs://{BUCKET}/templates/dp-continual-release.json"  # gcloud flex-template build
SERVICE_ACCOUNT = f"dp-release@{PROJECT}.iam.gserviceaccount.com"

with DAG(
    dag_id=f"dp_continual_release_{JOB}",
    start_date=datetime.datetime(2026, 1, 5, tzinfo=datetime.timezone.utc),
    schedule="@hourly",                # the config's steps.size_seconds (here 3600)
    catchup=False,
    max_active_runs=1,
    tags=["dp-continual-release"],
) as dag:
    release = DataflowStartFlexTemplateOperator(
        task_id="release_complete_steps",
        project_id=PROJECT,
        location=REGION,
        wait_until_finished=True,
        body={
            "launchParameter": {
                "jobName": f"dp-{JOB.replace('_', '-')}-{{{{ ts_nodash | lower }}}}",
                "containerSpecGcsPath": TEMPLATE,
                "parameters": {
                    "config": f"gs://{BUCKET}/configs/{JOB}.yaml",
                    "mode": "schedule",
                    "state_dir": f"gs://{BUCKET}/state/{JOB}",
                    "now": "{{ data_interval_end.isoformat() }}",
                },
                "environment": {
                    "tempLocation": f"gs://{BUCKET}/tmp",
                    "serviceAccountEmail": SERVICE_ACCOUNT,
                },
            },
        },
    )
