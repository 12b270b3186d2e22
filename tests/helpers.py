"""What several test files read back: a run's JSON lines log, and an S3 bucket's keys."""

import json


def read_log(path):
    """step -> metrics, the last line written for a step winning (a resumed run writes its steps again)."""
    steps = {}
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        steps.setdefault(row.pop("step"), {}).update(row)
    return steps


def bucket_keys(client, prefix, bucket="runs"):
    """The keys under ``prefix`` in the bucket of conftest's ``s3`` server, sorted."""
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))
