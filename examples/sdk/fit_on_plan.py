"""The SageMaker Python SDK v2 against hyperplan, unchanged: an Estimator on a training plan, with its data
in a bucket the fleet file keeps on another S3-compatible server. For hyperplan's own buckets the
shorter form is fit_defaults.py (one endpoint variable, the SDK's defaults, logs streamed).

Point the SDK at hyperplan and at an S3-compatible server through the environment:

    AWS_ENDPOINT_URL_SAGEMAKER=http://127.0.0.1:8080   # hyperplan
    AWS_ENDPOINT_URL_S3=http://127.0.0.1:9000          # the S3-compatible server the fleet maps the bucket to
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_DEFAULT_REGION (the hyperplan account's keys)

What the SDK needs beyond that:
- an explicit `output_path` and `code_location`, so that it never calls STS or creates a default bucket;
- `logs=False` in `fit()`: job logs come from `hyperplan jobs logs NAME`, not CloudWatch;
- the telemetry opt-out in the SDK's config (SAGEMAKER_USER_CONFIG_OVERRIDE), on a machine with no
  route to AWS.

Usage: python fit_on_plan.py PLAN_ARN BUCKET JOB_NAME
"""

import sys
from pathlib import Path

import boto3
import sagemaker
from sagemaker.estimator import Estimator


def main(plan_arn: str, bucket: str, job_name: str) -> None:
    session = sagemaker.Session(boto_session=boto3.Session())
    estimator = Estimator(
        entry_point="train.py",
        source_dir=str(Path(__file__).parent),
        image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/train:latest",
        role="arn:aws:iam::123456789012:role/SageMakerRole",
        instance_count=1,
        instance_type="ml.p5.48xlarge",
        training_plan=plan_arn,
        output_path=f"s3://{bucket}/output",
        code_location=f"s3://{bucket}/code",
        hyperparameters={"epochs": 3, "scale": 2},
        sagemaker_session=session,
    )
    estimator.fit({"training": f"s3://{bucket}/data"}, job_name=job_name, logs=False)
    print("MODEL", estimator.model_data)


if __name__ == "__main__":
    main(*sys.argv[1:4])
