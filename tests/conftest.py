import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

# The tests' shared helpers (tests/support/) import as top-level modules: `from helpers import ...`.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
# The functions the tests run in processes of their own (tests/support/at_once.py and bounded.py, the gloo ranks of
# torch.multiprocessing) start from multiprocessing's forkserver, a fresh interpreter, not as forks of this worker (whose
# threads' locks a fork would inherit). The forkserver imports the libraries they call once: each process is a fork of
# it, not a fresh interpreter spending 5 to 7 s of CPU importing torch, transformers, Composer and Streaming.
multiprocessing.set_forkserver_preload(["torch", "transformers", "composer", "vocagno.data.dataset"])

# Tests never reach the Hugging Face hub: everything they load ships in the repo.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One core per worker (pytest -n): torch's threads, the worker's and its training subprocesses', would otherwise
    # each take every core and the workers would wait on each other.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

from schedule import Schedule  # noqa: E402

from vocagno.memory import keep_freed_memory  # noqa: E402
from vocagno.core.tokenization import ASSETS, SHIPPED_TOKENIZERS, load_tokenizer  # noqa: E402

keep_freed_memory()  # the tests' in-process training and scoring, as a CPU run of train.py does


globals().update(Schedule(Path(__file__).resolve().parent / "durations.json").hooks())  # the longest files first


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist's own order (most tests first) would start multinode last
        config.option.loadscopereorder = False


@pytest.fixture(scope="session", autouse=True)
def _tokenizer_cache(tmp_path_factory):
    """Unpack the shipped tokenizers into a fresh cache, so the unpacking itself is tested every run."""
    os.environ["VOCAGNO_CACHE"] = str(tmp_path_factory.mktemp("vocagno-cache"))


@pytest.fixture(scope="session")
def tokenizers(_tokenizer_cache):
    return {name: load_tokenizer(name) for name in SHIPPED_TOKENIZERS}


@pytest.fixture(scope="session")
def math_texts():
    """Real math text: GSM8K train questions and answers, MATH problems and solutions (shipped slices)."""
    texts = []
    with open(ASSETS / "text" / "gsm8k_train_500.jsonl", encoding="utf-8") as f:
        texts += [row["text"] for row in map(json.loads, f)]
    with open(ASSETS / "text" / "math_test_100.jsonl", encoding="utf-8") as f:
        texts += [f"Problem: {row['problem']}\n\nSolution: {row['solution']}" for row in map(json.loads, f)]
    return texts


@pytest.fixture(scope="session")
def s3():
    """An S3 object store on this machine (moto's server, in a process of its own as a store is: the runs the tests
    make in their own process would otherwise share its interpreter lock), with a bucket "runs": the environment that
    points boto3 under Composer and Streaming at it, and a client."""
    import socket
    import subprocess
    import time

    import boto3

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"moto's server did not start (exit code {server.poll()})") from None
                time.sleep(0.1)
        env = {"S3_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        client = boto3.client("s3", endpoint_url=env["S3_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test")
        client.create_bucket(Bucket="runs")
        yield env, client
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A Google Cloud Storage server on this machine (gcp-storage-emulator), with a bucket "runs": the environment
    that points google-cloud-storage under Streaming at it (its default credentials: a token that never expires, so
    nothing asks Google for one), and the bucket."""
    import socket

    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with socket.socket() as probe:  # the emulator takes a port, not 0
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="runs")
    server.start()
    credentials = tmp_path_factory.mktemp("gcs") / "credentials.json"
    credentials.write_text(json.dumps({"type": "authorized_user", "client_id": "test", "client_secret": "test",
                                       "refresh_token": "test", "token": "test", "expiry": "2999-01-01T00:00:00Z"}))
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
           "GOOGLE_CLOUD_PROJECT": "test"}
    bucket = storage.Client(project="test", client_options={"api_endpoint": env["STORAGE_EMULATOR_HOST"]},
                            credentials=AnonymousCredentials()).bucket("runs")
    yield env, bucket
    server.stop()
