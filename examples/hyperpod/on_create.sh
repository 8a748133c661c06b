#!/bin/sh
# OnCreate: run once on each new node of the cluster, in a copy of the group's LifeCycleConfig.SourceS3Uri,
# before the node is Running. Exit 0 and the node is Running; any other status fails it, with what the
# script wrote to its error output as the node's message.
#
# On a Slurm cluster the lifecycle scripts make the controller group's node run slurmctld and the workers'
# run slurmd (AWS's samples read the node's group from /opt/ml/config/resource_config.json). This one
# shows what a script finds here: its group in HYPERPLAN_INSTANCE_GROUP, and the end of the plan's
# capacity in SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP (epoch seconds; 0 on on-demand
# capacity). It leaves its line in ~/node-role.txt for `hyperplan clusters exec` to read.
set -eu
group=${HYPERPLAN_INSTANCE_GROUP:-unknown}
case "$group" in
  controller-machine) role=controller ;;   # slurmctld, on on-demand capacity that never ends
  *) role=compute ;;                       # slurmd, on the plan's capacity while its segment lasts
esac
echo "$role node of $group, capacity until ${SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP:-0}" \
  | tee "$HOME/node-role.txt"
