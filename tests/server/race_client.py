"""One client process of the several-servers race (tests/server/test_several_servers.py): searches the hot
pools through one server, buys through it, extends and has the administrator cancel some of what it
bought, and prints one JSON object: what was acknowledged. Run as `python -m tests.server.race_client`."""

from __future__ import annotations

import json
import sys
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from hyperplan.cli.client import ApiError, NativeClient
from hyperplan.signing import Credentials

ROUNDS = 4


def main(argument: str) -> None:
    task = json.loads(argument)
    number, url = task["number"], task["url"]
    client: Any = boto3.client(
        "sagemaker",
        endpoint_url=url,
        region_name="us-west-2",
        aws_access_key_id=task["key"],
        aws_secret_access_key=task["secret"],
        config=Config(retries={"max_attempts": 0}),
    )
    admin = NativeClient(url, Credentials(*task["admin"]), region="us-west-2")
    done: dict[str, list[Any]] = {"bought": [], "extended": [], "cancelled": [], "refused": []}
    for round_ in range(ROUNDS):
        try:
            offerings = client.search_training_plan_offerings(
                InstanceType="ml.p5.48xlarge",
                InstanceCount=2 if number % 2 else 4,
                DurationHours=24 * (1 + number % 2),
                TargetResources=["training-job"],
            )["TrainingPlanOfferings"]
        except ClientError as exc:
            done["refused"].append(exc.response["Error"]["Code"])
            continue
        if not offerings:
            continue
        name = f"racer-{number}-{round_}"
        try:
            arn = client.create_training_plan(
                TrainingPlanName=name, TrainingPlanOfferingId=offerings[0]["TrainingPlanOfferingId"]
            )["TrainingPlanArn"]
        except ClientError as exc:
            done["refused"].append(exc.response["Error"]["Code"])
            continue
        done["bought"].append(arn)
        if round_ % 2 == 0:
            try:
                found = client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=24)
                extension = found["TrainingPlanExtensionOfferings"][0]["TrainingPlanExtensionOfferingId"]
                client.extend_training_plan(TrainingPlanExtensionOfferingId=extension)
                done["extended"].append(arn)
            except (ClientError, IndexError, KeyError) as exc:
                done["refused"].append(getattr(exc, "response", {}).get("Error", {}).get("Code", "none"))
        elif number % 3 == 0:
            try:
                admin.post(f"/api/v1/accounts/{task['account']}/plans/{name}/cancel", {"Reason": "race"})
                done["cancelled"].append(arn)
            except ApiError as exc:
                done["refused"].append(exc.code)
    print(json.dumps(done))


if __name__ == "__main__":
    main(sys.argv[1])
