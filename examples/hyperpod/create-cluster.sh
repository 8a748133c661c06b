#!/bin/sh
# A HyperPod cluster on a training plan with the aws CLI: the controller group on on-demand capacity and
# a worker group on the plan, as cluster-config.json describes them.
#
#   PLAN=my-cluster-plan sh examples/hyperpod/create-cluster.sh
#
# PLAN is a plan for hyperpod-cluster of ml.p5.48xlarge (examples/buy-plan.sh buys one). The cluster's
# subnets are one in each zone of the demo fleet, so that a plan in any of them can serve the group.
# HYPERPLAN_ENDPOINT_URL names the server (default `make run`'s); examples/README.md says which keys.
set -eu
here=$(dirname "$0")
EP="--endpoint-url ${HYPERPLAN_ENDPOINT_URL:-http://127.0.0.1:8080}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The lifecycle script, where the groups' LifeCycleConfig.SourceS3Uri points.
aws s3api head-bucket $EP --bucket my-team-bucket >/dev/null 2>&1 || aws s3 mb $EP s3://my-team-bucket
aws s3 cp $EP --no-progress "$here/on_create.sh" s3://my-team-bucket/hyperpod/lifecycle/on_create.sh

# The plan's ARN in the worker group's TrainingPlanArn.
PLAN_ARN=$(aws sagemaker describe-training-plan $EP --training-plan-name "${PLAN:-my-cluster-plan}" \
  --query TrainingPlanArn --output text)
sed "s|YOUR-PLAN-ARN|$PLAN_ARN|" "$here/cluster-config.json" > "$work/cluster-config.json"

aws sagemaker create-cluster $EP --cli-input-json "file://$work/cluster-config.json"
