"""The shortest form: the SageMaker Python SDK v2, unchanged and with its defaults, against hyperplan alone.

The environment names one endpoint, keys and a region:

    AWS_ENDPOINT_URL=http://127.0.0.1:8080             # hyperplan: SageMaker, S3, CloudWatch Logs, STS
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY          # the hyperplan account's keys
    AWS_DEFAULT_REGION=us-west-2                       # the fleet's region

and the SDK's own config file (~/.config/sagemaker/config.yaml) holds two settings:

    SchemaVersion: '1.0'
    SageMaker:
      PythonSDK:
        Modules:
          TelemetryOptOut: true
          Session:
            DefaultS3Bucket: my-team-bucket

Why these two remain (README, "The SageMaker Python SDK"): without a default bucket the SDK names one
`sagemaker-REGION-ACCOUNT` and asks STS for the account at AWS's own regional STS address, which no
endpoint variable redirects; telemetry goes to AWS by a fixed address too.

Everything else is the SDK's default: the bucket is created on first use, the source is uploaded to it,
fit() streams the job's log (CloudWatch Logs) while the job waits for its plan and runs, and the model
lands in the bucket.

The checkpoint location is the one setting beyond the defaults, and only so that a job interrupted at
the end of a plan's segment resumes from its checkpoint in the next (as on SageMaker); `--hold` makes
train.py hold its first segment to the end to show it.

Usage: python fit_defaults.py PLAN_ARN DATA_DIR JOB_NAME [--hold]
"""

import sys
from pathlib import Path

import sagemaker
from sagemaker.estimator import Estimator


def main(plan_arn: str, data_dir: str, job_name: str, *flags: str) -> None:
    session = sagemaker.Session()
    inputs = session.upload_data(data_dir, key_prefix="data")  # s3://<default bucket>/data
    estimator = Estimator(
        entry_point="train.py",
        source_dir=str(Path(__file__).parent),
        # A framework image in the fleet's region: the demo fleet's [image_map] runs it from its own registry
        # (runtime podman); without containers the fleet's [images] name its Python, else the server's.
        image_uri="763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.5.1-cpu-py311",
        role="arn:aws:iam::123456789012:role/SageMakerRole",
        instance_count=1,
        instance_type="ml.p5.48xlarge",
        training_plan=plan_arn,
        hyperparameters={"epochs": 3, "scale": 2, "hold": int("--hold" in flags)},
        checkpoint_s3_uri=f"s3://{session.default_bucket()}/checkpoints/{job_name}",
    )
    estimator.fit({"training": inputs}, job_name=job_name)
    print("MODEL", estimator.model_data)


if __name__ == "__main__":
    main(*sys.argv[1:])
