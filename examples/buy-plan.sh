#!/bin/sh
# Buy a one-day training plan of ml.p5.48xlarge with the aws CLI: the offering that starts soonest.
#
#   sh examples/buy-plan.sh my-cluster-plan hyperpod-cluster 2    # for examples/hyperpod
#   sh examples/buy-plan.sh my-job-plan training-job 1            # for examples/training-job
#
# A plan serves one target, as on AWS: a HyperPod cluster's instance groups, or training jobs.
# HYPERPLAN_ENDPOINT_URL names the server (default `make run`'s); examples/README.md says which keys.
set -eu
NAME=$1 TARGET=$2 COUNT=$3
EP="--endpoint-url ${HYPERPLAN_ENDPOINT_URL:-http://127.0.0.1:8080}"

# The search ranks its offerings by how well they pack the calendar; the soonest is taken here.
OFFERING=$(aws sagemaker search-training-plan-offerings $EP --instance-type ml.p5.48xlarge \
  --instance-count "$COUNT" --duration-hours 24 --target-resources "$TARGET" \
  --query 'sort_by(TrainingPlanOfferings, &ReservedCapacityOfferings[0].StartTime)[0].TrainingPlanOfferingId' \
  --output text)
aws sagemaker create-training-plan $EP --training-plan-name "$NAME" --training-plan-offering-id "$OFFERING" \
  --query TrainingPlanArn --output text
aws sagemaker describe-training-plan $EP --training-plan-name "$NAME" \
  --query '[Status, ReservedCapacitySummaries[0].[AvailabilityZone, StartTime, EndTime]]' --output text
