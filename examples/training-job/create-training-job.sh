#!/bin/sh
# A training job on a training plan with the aws CLI, in script mode as the SageMaker Python SDK runs one:
# the code is examples/sdk/train.py, packed and uploaded as the SDK uploads source_dir, and runs in the
# job's image (here the demo fleet's, mapped to its own registry; without containers, under the server's
# Python).
#
#   PLAN=my-job-plan JOB=my-training-job sh examples/training-job/create-training-job.sh
#
# PLAN is a plan for training-job of ml.p5.48xlarge (examples/buy-plan.sh buys one). The job waits,
# Pending, until the plan is Active, then trains and puts its model in s3://my-team-bucket/output/JOB/.
# HYPERPLAN_ENDPOINT_URL names the server (default `make run`'s); examples/README.md says which keys.
set -eu
here=$(dirname "$0")
EP="--endpoint-url ${HYPERPLAN_ENDPOINT_URL:-http://127.0.0.1:8080}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The data (the "training" channel) and the code (sagemaker_submit_directory).
aws s3api head-bucket $EP --bucket my-team-bucket >/dev/null 2>&1 || aws s3 mb $EP s3://my-team-bucket
aws s3 cp $EP --no-progress "$here/numbers.csv" s3://my-team-bucket/data/numbers.csv
tar -czf "$work/sourcedir.tar.gz" -C "$here/../sdk" train.py
aws s3 cp $EP --no-progress "$work/sourcedir.tar.gz" s3://my-team-bucket/code/sourcedir.tar.gz

# The plan's ARN in ResourceConfig.TrainingPlanArn; the job's name from JOB (the command line wins over
# the file's).
PLAN_ARN=$(aws sagemaker describe-training-plan $EP --training-plan-name "${PLAN:-my-job-plan}" \
  --query TrainingPlanArn --output text)
sed "s|YOUR-PLAN-ARN|$PLAN_ARN|" "$here/training-job.json" > "$work/training-job.json"

aws sagemaker create-training-job $EP --cli-input-json "file://$work/training-job.json" \
  --training-job-name "${JOB:-my-training-job}"
