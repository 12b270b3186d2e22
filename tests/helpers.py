"""What several test files share: killing a run at a moment, reading back its JSON lines log, an S3 bucket's keys."""

import json
import signal
import subprocess
import time


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


def kill_when(command, ready, settle=0.0, timeout=600, **popen):
    """Start ``command`` and ``kill -9`` it as soon as ``ready()`` holds (``settle`` seconds later), or when
    ``timeout`` passed or it ended by itself."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
    deadline = time.time() + timeout
    while not ready() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    time.sleep(settle)
    process.send_signal(signal.SIGKILL)
    process.wait()
