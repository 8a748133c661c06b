"""What the commands print, rendered into a fixed-width console and compared with tests/cli/golden/.

After a deliberate change of output, regenerate with HYPERPLAN_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType

from hyperplan.cli.views.accounts import (
    AccountSettings,
    AccountsTable,
    KeyRevoked,
    LedgerTable,
    MasterKeyRotated,
    NewKey,
)
from hyperplan.cli.views.buckets import BucketChanged, BucketsTable
from hyperplan.cli.views.clock import ClockLine
from hyperplan.cli.views.clusters import ClusterDetail, ClustersTable, GroupPlansTable, NodesTable
from hyperplan.cli.views.fleet import FleetTable
from hyperplan.cli.views.invoices import InvoiceDecided, InvoicesTable
from hyperplan.cli.views.jobs import JobDetail, JobsTable, JobStatus
from hyperplan.cli.views.plans import (
    ExtensionOffers,
    ExtensionsTable,
    Offerings,
    OfferingsAcross,
    PlanDetail,
    PlanHistory,
    PlansTable,
    PlanStatus,
)
from hyperplan.cli.views.registries import CredentialsDeleted, CredentialsSet, RegistriesTable
from hyperplan.cli.views.users import KeyChanged, KeysTable, NewAccessKey, NewUser, UsersTable
from hyperplan.cli.views.webhooks import DeliveriesTable, NewWebhook, WebhookDeleted, WebhooksTable

GOLDEN = Path(__file__).parent / "golden"

BUCKET = {
    "Name": "vision-data",
    "Kind": "directory",
    "Owners": [{"AccountId": "123456789012", "AccountName": "vision"}],
    "OwnedByAdministrators": False,
    "Grants": [
        {"Account": "*", "AccountName": "*", "Access": "read"},
        {"Account": "210987654321", "AccountName": "speech", "Access": "write"},
    ],
    "Access": "write",
    "Location": "/srv/hyperplan/s3/vision-data",
}
T0 = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)
ACCESS_KEY = {
    "AccessKeyId": "AKHPNEWKEY0000000000",
    "AccountId": "123456789012",
    "AccountName": "vision",
    "UserName": "alice",
    "Status": "Active",
    "CreatedAt": "2026-12-01T11:30:00Z",
}
USER = {
    "AccountId": "123456789012",
    "AccountName": "vision",
    "UserName": "alice",
    "Owner": True,
    "CreatedAt": "2026-12-01T11:30:00Z",
    "ActiveKeys": 1,
    "InactiveKeys": 1,
}
T1 = datetime(2026, 12, 3, 11, 30, tzinfo=UTC)
PLAN_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/llm-pretrain"


def render(view: RenderableType) -> str:
    out = StringIO()
    Console(width=100, file=out, color_system=None, force_terminal=False, legacy_windows=False).print(view)
    # Rich pads a table's title to the table's width; trailing spaces are invisible and fragile in a file.
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())


def segment(**extra: Any) -> dict[str, Any]:
    return {
        "ReservedCapacityArn": "arn:aws:sagemaker:us-east-1:123456789012:reserved-capacity/llm-pretrain-rc-1",
        "Status": "Scheduled",
        "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 4,
        "InstanceType": "ml.p5.48xlarge",
        "StartTime": T0,
        "EndTime": T1,
        **extra,
    }


PLAN = {
    "TrainingPlanName": "llm-pretrain",
    "TrainingPlanArn": PLAN_ARN,
    "Status": "Scheduled",
    "StatusMessage": "Paid; starts 2026-12-01 11:30 UTC",
    "TargetResources": ["training-job"],
    "TotalInstanceCount": 4,
    "InUseInstanceCount": 0,
    "AvailableInstanceCount": 4,
    "UpfrontFee": "15744.00",
    "CurrencyCode": "USD",
    "StartTime": T0,
    "EndTime": T1,
    "ReservedCapacitySummaries": [segment()],
}

OFFERING = {
    "TrainingPlanOfferingId": "tpo-0123456789abcdef",
    "UpfrontFee": "15744.00",
    "CurrencyCode": "USD",
    "DurationHours": 48,
    "DurationMinutes": 0,
    "ReservedCapacityOfferings": [
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceCount": 4,
            "InstanceType": "ml.p5.48xlarge",
            "StartTime": T0,
            "EndTime": T1,
            "DurationHours": 48,
            "DurationMinutes": 0,
        }
    ],
}

JOB = {
    "TrainingJobName": "train-7b",
    "TrainingJobStatus": "Failed",
    "SecondaryStatus": "Failed",
    "FailureReason": "AlgorithmError: exit code 3 [see the logs]",
    "ResourceConfig": {"InstanceCount": 2, "InstanceType": "ml.p5.48xlarge", "TrainingPlanArn": PLAN_ARN},
    "ModelArtifacts": {"S3ModelArtifacts": "file:///data/models/train-7b/output/model.tar.gz"},
    "CreationTime": T0,
    "SecondaryStatusTransitions": [
        {"Status": "Starting", "StartTime": T0, "EndTime": T0, "StatusMessage": "Preparing the instances"},
        {"Status": "Failed", "StartTime": T0, "StatusMessage": "Training job failed"},
    ],
}

DELIVERY = {
    "DeliveryId": 12,
    "TrainingPlanName": "llm-pretrain",
    "Kind": "StatusChanged",
    "Status": "Pending",
    "Attempts": 2,
    "DeliveredAt": None,
    "NextAttemptAt": "2026-12-01T11:35:00Z",
    "LastError": "HTTP 503",
}

VIEWS: dict[str, RenderableType] = {
    "accounts_new_key": NewKey(
        {
            "AccountName": "vision",
            "AccountId": "123456789012",
            "AccessKeyId": "AKID1",
            "SecretAccessKey": "s3cr3t",
        }
    ),
    "accounts_table": AccountsTable(
        [
            {
                "Name": "vision",
                "AccountId": "123456789012",
                "Admin": False,
                "PaymentMode": "budget",
                "Budget": "250000.00",
                "OsUser": "hp-123456789012",
                "OsUid": 70001,
                "OsGid": 70001,
                "AccessKeys": [
                    {"AccessKeyId": "AKID1", "RevokedAt": None},
                    {"AccessKeyId": "AKID2", "RevokedAt": "2026-11-30T10:00:00Z"},
                    {"AccessKeyId": "AKID3", "RevokedAt": None, "Status": "Inactive"},
                ],
            },
            {
                "Name": "admin",
                "AccountId": "000000000000",
                "Admin": True,
                "PaymentMode": "auto",
                "Budget": "0.00",
                "AccessKeys": [],
            },
        ]
    ),
    "accounts_settings": AccountSettings(
        {
            "Name": "vision",
            "PaymentMode": "budget",
            "Budget": "250000.00",
            "Spend": "15744.00",
            "Quotas": {
                "MaxActivePlans": 5,
                "MaxReservedInstancesPerType": 16,
                "MaxReservedSharePerType": 0.5,
                "MaxReservedInstanceHoursPer30Days": 20000,
                "MaxOnDemandInstancesPerType": 8,
                "MaxOnDemandSharePerType": 0.5,
            },
            "RateLimits": {
                "search": {"Rate": 0.5, "Burst": 4, "Set": "account"},
                "purchase": {"Rate": 5, "Burst": 50, "Set": "fleet"},
                "read": {"Rate": 100, "Burst": 1000, "Set": "account"},
            },
        }
    ),
    "accounts_key_revoked": KeyRevoked("AKID2"),
    "accounts_master_key_rotated": MasterKeyRotated(
        {"AccessKeysResealed": 7, "WebhooksResealed": 2, "RegistryCredentialsResealed": 1}
    ),
    "accounts_ledger": LedgerTable(
        "vision",
        [
            {
                "At": "2026-12-01T11:00:00Z",
                "Amount": "250000.00",
                "BudgetAfter": "250000.00",
                "InvoiceId": None,
                "Description": "Budget set",
            },
            {
                "At": "2026-12-01T11:05:00Z",
                "Amount": "-15744.00",
                "BudgetAfter": "234256.00",
                "InvoiceId": 7,
                "Description": "Plan llm-pretrain",
            },
            {
                "At": "2026-12-01T12:00:00Z",
                "Amount": "-5.53",
                "BudgetAfter": "234250.47",
                "InvoiceId": None,
                "Description": "On-demand training job eval: 2 x ml.m5.12xlarge in us-west-2a, hour 1, at "
                "2.765 USD per instance-hour",
            },
        ],
    ),
    "clock_accelerated": ClockLine({"Now": "2026-12-01T11:30:00Z", "Kind": "accelerated", "TimeScale": 60}),
    "clock_advanced": ClockLine({"Now": "2026-12-02T11:30:00Z", "Kind": "manual", "EventsRun": 3}),
    "fleet_table": FleetTable(
        {
            "Region": "us-east-1",
            "Now": "2026-12-01T00:00:00+00:00",
            "Zones": [
                {
                    "AvailabilityZone": "us-east-1a",
                    "AvailabilityZoneId": "use1-az1",
                    "Subnets": ["subnet-0a1b2c3d4e5f60001", "subnet-0a1b2c3d4e5f60002"],
                },
                {"AvailabilityZone": "us-east-1b", "AvailabilityZoneId": "use1-az2", "Subnets": []},
            ],
            "Pools": [
                {
                    "InstanceType": "ml.p5.48xlarge",
                    "AvailabilityZone": "us-east-1a",
                    "InstanceCount": 8,
                    "ReservableCount": 8,
                    "PricePerInstanceHour": "82.00",
                    "CurrencyCode": "USD",
                    "VCpus": 192,
                    "MemoryGiB": 2048,
                    "Accelerators": 8,
                    "AcceleratorKind": "NVIDIA H100",
                    "BookedNow": 4,
                    "Utilisation": 0.25,
                    "BookedProfile": [
                        {"Start": "2026-12-01T00:00:00+00:00", "Booked": 4},
                        {"Start": "2026-12-03T00:00:00+00:00", "Booked": 8},
                        {"Start": "2026-12-04T00:00:00+00:00", "Booked": 0},
                    ],
                },
                {
                    "InstanceType": "ml.g5.xlarge",
                    "AvailabilityZone": "us-east-1b",
                    "InstanceCount": 4,
                    "ReservableCount": 0,
                    "PricePerInstanceHour": "1.41",
                    "CurrencyCode": "USD",
                    "VCpus": 4,
                    "MemoryGiB": 16,
                    "Accelerators": 0,
                    "AcceleratorKind": None,
                    "BookedNow": 0,
                    "Utilisation": 0.0,
                    "BookedProfile": [],
                },
            ],
        },
        7,
    ),
    "invoices_table": InvoicesTable(
        [
            {
                "InvoiceId": 7,
                "AccountName": "vision",
                "TrainingPlanName": "llm-pretrain",
                "Amount": "15744.00",
                "CurrencyCode": "USD",
                "Status": "Pending",
                "DueAt": "2026-12-01T11:30:00Z",
                "SettledAt": None,
                "Note": "",
            }
        ]
    ),
    "invoices_approved": InvoiceDecided({"InvoiceId": 7, "TrainingPlanName": "llm-pretrain"}, "approved"),
    "plans_offerings": Offerings([OFFERING]),
    "plans_no_offering": Offerings([]),
    # A search across types answers through the native API: times in ISO 8601, each offering its type.
    "plans_offerings_across": OfferingsAcross(
        {
            "TrainingPlanOfferings": [
                {
                    **OFFERING,
                    "InstanceType": "ml.p5.48xlarge",
                    "InstanceCount": 4,
                    "ReservedCapacityOfferings": [
                        {
                            "AvailabilityZone": "us-east-1a",
                            "InstanceCount": 4,
                            "InstanceType": "ml.p5.48xlarge",
                            "StartTime": "2026-12-01T11:30:00Z",
                            "EndTime": "2026-12-03T11:30:00Z",
                            "DurationHours": 48,
                            "DurationMinutes": 0,
                        }
                    ],
                }
            ],
            "Truncated": True,
        }
    ),
    "plans_detail": PlanDetail(PLAN),
    "plans_table": PlansTable([PLAN]),
    "plans_status": PlanStatus(
        {"TrainingPlanName": "llm-pretrain", "Status": "Failed", "StatusMessage": "Cancelled"}
    ),
    "plans_history": PlanHistory(
        {
            "TrainingPlanName": "llm-pretrain",
            "Events": [
                {
                    "At": "2026-12-01T11:00:00Z",
                    "Kind": "Created",
                    "Status": "Pending",
                    "Message": "Bought",
                    "User": {"UserName": "alice", "AccountName": "vision"},
                },
                {"At": "2026-12-01T11:30:00Z", "Kind": "Activated", "Status": "Active", "Message": ""},
            ],
        }
    ),
    "plans_extension_offers": ExtensionOffers(
        "llm-pretrain",
        [
            {
                "TrainingPlanExtensionOfferingId": "tpeo-1",
                "AvailabilityZone": "us-east-1a",
                "StartDate": T1,
                "EndDate": datetime(2026, 12, 10, 11, 30, tzinfo=UTC),
                "UpfrontFee": "55104.00",
                "CurrencyCode": "USD",
            }
        ],
    ),
    "plans_no_extension": ExtensionOffers("llm-pretrain", []),
    "plans_extensions": ExtensionsTable(
        [
            {
                "StartDate": "2026-12-03T11:30:00Z",
                "EndDate": "2026-12-10T11:30:00Z",
                "Status": "Scheduled",
                "PaymentStatus": "Paid",
                "UpfrontFee": "55104.00",
                "CurrencyCode": "USD",
            }
        ]
    ),
    "clusters_table": ClustersTable(
        [
            {
                "ClusterName": "research",
                "ClusterStatus": "InService",
                "CreationTime": T0,
                "TrainingPlanArns": [PLAN_ARN],
            }
        ]
    ),
    "clusters_detail": ClusterDetail(
        {
            "ClusterName": "research",
            "ClusterStatus": "InService",
            "ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abc123",
            "InstanceGroups": [
                {
                    "InstanceGroupName": "workers",
                    "InstanceType": "ml.p5.48xlarge",
                    "CurrentCount": 2,
                    "TargetCount": 4,
                    "Status": "InService",
                    "TrainingPlanArn": PLAN_ARN,
                    "TrainingPlanStatus": "Active",
                },
                {
                    "InstanceGroupName": "controller",
                    "InstanceType": "ml.m5.xlarge",
                    "CurrentCount": 1,
                    "TargetCount": 1,
                    "Status": "InService",
                },
            ],
        }
    ),
    "clusters_nodes": NodesTable(
        "research",
        [
            {
                "InstanceGroupName": "workers",
                "InstanceId": "i-0001",
                "PrivateDnsHostname": "ip-10-0-0-1",
                "InstanceType": "ml.p5.48xlarge",
                "InstanceStatus": {"Status": "Running"},
                "LaunchTime": T0,
            }
        ],
    ),
    "clusters_group_plans": GroupPlansTable(
        {
            "ClusterName": "research",
            "InstanceGroupName": "workers",
            "InstanceType": "ml.p5.48xlarge",
            "TargetCount": 4,
            "CurrentCount": 2,
            "Plans": [
                {
                    "TrainingPlanArn": PLAN_ARN,
                    "TrainingPlanName": PLAN_ARN.rsplit("/", 1)[-1],
                    "Primary": True,
                    "Status": "Active",
                    "ActiveNow": False,
                    "CapacityNow": 0,
                    "Serving": 0,
                },
                {
                    "TrainingPlanArn": PLAN_ARN + "-more",
                    "TrainingPlanName": PLAN_ARN.rsplit("/", 1)[-1] + "-more",
                    "Primary": False,
                    "Status": "Active",
                    "ActiveNow": True,
                    "CapacityNow": 2,
                    "Serving": 2,
                },
            ],
        }
    ),
    "jobs_table": JobsTable(
        [{**JOB, "TrainingPlanArn": PLAN_ARN}, {**JOB, "TrainingJobName": "on-demand-run"}]
    ),
    "jobs_detail": JobDetail(JOB),
    "jobs_detail_image": JobDetail(
        {
            **JOB,
            "AlgorithmSpecification": {"TrainingImage": "local/python:3"},
            "ResolvedImage": "127.0.0.1:5000/hyperplan/python:3",
        }
    ),
    "jobs_status": JobStatus(
        {"TrainingJobName": "train-7b", "TrainingJobStatus": "Stopping", "SecondaryStatus": "Stopping"}
    ),
    "webhooks_new": NewWebhook(
        {
            "WebhookId": 3,
            "AccountName": "vision",
            "Url": "https://hooks.example/plan-events",
            "Secret": "whsec_abc",
        }
    ),
    "webhooks_table": WebhooksTable(
        [
            {
                "WebhookId": 3,
                "AccountName": "vision",
                "Url": "https://hooks.example/plan-events",
                "CreatedAt": "2026-12-01T11:00:00Z",
                "PendingDeliveries": 1,
            }
        ]
    ),
    "webhooks_deliveries": DeliveriesTable({"WebhookId": 3, "Deliveries": [DELIVERY]}),
    "webhooks_deleted": WebhookDeleted({"WebhookId": 3}),
    "buckets_table": BucketsTable(
        [
            BUCKET,
            {
                "Name": "datasets",
                "Kind": "s3",
                "Owners": [],
                "OwnedByAdministrators": True,
                "Grants": [],
                "Access": "write",
                "Location": "http://127.0.0.1:9000/datasets-prod",
            },
        ]
    ),
    "buckets_granted": BucketChanged(BUCKET, "granted"),
    "keys_new": NewAccessKey(ACCESS_KEY | {"SecretAccessKey": "s3cr3t-shown-once"}),
    "keys_table": KeysTable(
        [ACCESS_KEY, ACCESS_KEY | {"AccessKeyId": "AKHPOLDKEY0000000000", "Status": "Inactive"}]
    ),
    "keys_deactivated": KeyChanged(ACCESS_KEY | {"Status": "Inactive"}, "deactivated"),
    "users_new": NewUser(
        {
            "User": USER | {"UserName": "bob", "Owner": False},
            "AccessKey": ACCESS_KEY | {"UserName": "bob", "SecretAccessKey": "s3cr3t-shown-once"},
        }
    ),
    "users_table": UsersTable([USER, USER | {"UserName": "bob", "Owner": False, "InactiveKeys": 0}]),
    "registries_table": RegistriesTable(
        [
            {"Host": "127.0.0.1:5000", "Insecure": True, "InFleet": True, "Username": None},
            {
                "Host": "registry.example.com",
                "Insecure": False,
                "InFleet": False,
                "Username": "puller",
                "CredentialsSetAt": "2026-12-01T11:30:00Z",
            },
        ]
    ),
    "registries_credentials_set": CredentialsSet({"Host": "registry.example.com", "Username": "puller"}),
    "registries_credentials_deleted": CredentialsDeleted({"Host": "registry.example.com"}),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_renders_as_its_golden_file(name: str) -> None:
    text = render(VIEWS[name])
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("HYPERPLAN_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


def test_text_from_the_server_is_printed_as_it_is_never_read_as_markup() -> None:
    # A failure reason with Rich markup in it must neither vanish nor restyle the rest of the line.
    text = render(JobDetail({**JOB, "FailureReason": "bad value [bold]x[/bold] in [red]config"}))
    assert "bad value [bold]x[/bold] in [red]config" in text
