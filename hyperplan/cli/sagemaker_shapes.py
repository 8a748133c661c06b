"""What botocore's SageMaker model says about the operations the CLI calls, written down.

``OUTPUT_TIMESTAMPS``: for each operation, the members of its answer that are timestamps (a path of
member names, ``[]`` for every item of a list). ``PAGES``: for each listing, the member its items are in;
every one pages with NextToken. ``tests/cli/test_sagemaker_client.py`` derives both from the installed
botocore's model and fails, printing the table it expects, when they differ: the model is the truth.
"""

from __future__ import annotations

OUTPUT_TIMESTAMPS: dict[str, tuple[str, ...]] = {
    "CreateTrainingPlan": (),
    "DescribeCluster": (
        "CreationTime",
        "InstanceGroups.[].AutoPatchConfig.CurrentPatchSchedule.NextPatchDate",
        "InstanceGroups.[].AutoPatchConfig.DesiredPatchSchedule.NextPatchDate",
    ),
    "DescribeTrainingJob": (
        "CreationTime",
        "TrainingStartTime",
        "TrainingEndTime",
        "LastModifiedTime",
        "SecondaryStatusTransitions.[].StartTime",
        "SecondaryStatusTransitions.[].EndTime",
        "FinalMetricDataList.[].Timestamp",
        "DebugRuleEvaluationStatuses.[].LastModifiedTime",
        "ProfilerRuleEvaluationStatuses.[].LastModifiedTime",
    ),
    "DescribeTrainingPlan": (
        "StartTime",
        "EndTime",
        "ReservedCapacitySummaries.[].StartTime",
        "ReservedCapacitySummaries.[].EndTime",
    ),
    "DescribeTrainingPlanExtensionHistory": (
        "TrainingPlanExtensions.[].ExtendedAt",
        "TrainingPlanExtensions.[].StartDate",
        "TrainingPlanExtensions.[].EndDate",
    ),
    "ExtendTrainingPlan": (
        "TrainingPlanExtensions.[].ExtendedAt",
        "TrainingPlanExtensions.[].StartDate",
        "TrainingPlanExtensions.[].EndDate",
    ),
    "ListClusterNodes": (
        "ClusterNodeSummaries.[].LaunchTime",
        "ClusterNodeSummaries.[].LastSoftwareUpdateTime",
    ),
    "ListClusters": ("ClusterSummaries.[].CreationTime",),
    "ListTrainingJobs": (
        "TrainingJobSummaries.[].CreationTime",
        "TrainingJobSummaries.[].TrainingEndTime",
        "TrainingJobSummaries.[].LastModifiedTime",
    ),
    "ListTrainingPlans": (
        "TrainingPlanSummaries.[].StartTime",
        "TrainingPlanSummaries.[].EndTime",
        "TrainingPlanSummaries.[].ReservedCapacitySummaries.[].StartTime",
        "TrainingPlanSummaries.[].ReservedCapacitySummaries.[].EndTime",
    ),
    "SearchTrainingPlanOfferings": (
        "TrainingPlanOfferings.[].RequestedStartTimeAfter",
        "TrainingPlanOfferings.[].RequestedEndTimeBefore",
        "TrainingPlanOfferings.[].ReservedCapacityOfferings.[].StartTime",
        "TrainingPlanOfferings.[].ReservedCapacityOfferings.[].EndTime",
        "TrainingPlanOfferings.[].ReservedCapacityOfferings.[].ExtensionStartTime",
        "TrainingPlanOfferings.[].ReservedCapacityOfferings.[].ExtensionEndTime",
        "TrainingPlanExtensionOfferings.[].StartDate",
        "TrainingPlanExtensionOfferings.[].EndDate",
    ),
    "StopTrainingJob": (),
}

PAGES: dict[str, str] = {
    "DescribeTrainingPlanExtensionHistory": "TrainingPlanExtensions",
    "ListClusterNodes": "ClusterNodeSummaries",
    "ListClusters": "ClusterSummaries",
    "ListTrainingJobs": "TrainingJobSummaries",
    "ListTrainingPlans": "TrainingPlanSummaries",
}
