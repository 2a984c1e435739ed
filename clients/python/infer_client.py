"""A Halcyon client as a user writes it: generated stubs, the published service config, rich errors.

What it decides: nothing of its own. gRPC's retry machinery (``clients/service_config.json``,
gRFC A6) retries what Halcyon says is retryable and waits what its ``grpc-retry-pushback-ms``
trailer says; this script only prints the answer, or the ``ErrorInfo`` reason and the
``RetryInfo`` delay of the last attempt's ``google.rpc.Status``. It is the snippet the README and
docs/reference/clients.md show, kept runnable so tests/clients runs it against a real stack.

Usage: ``python clients/python/infer_client.py [TARGET [API_KEY [MAX_OUTPUT_TOKENS]]]``
(defaults ``127.0.0.1:50051``, ``demo-key-premium``, 64). Exit 0 on an answer, 1 on an error.
"""

import sys
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from halcyon.v1 import infer_pb2, infer_pb2_grpc

defaults = ["127.0.0.1:50051", "demo-key-premium", "64"]  # target, API key, max_output_tokens
target, key, tokens = sys.argv[1:4] + defaults[len(sys.argv[1:4]) :]
config = (Path(__file__).resolve().parents[1] / "service_config.json").read_text()
channel = grpc.insecure_channel(
    target, options=[("grpc.service_config", config), ("grpc.enable_retries", 1)]
)
stub = infer_pb2_grpc.InferServiceStub(channel)
request = infer_pb2.InferRequest(model="llama-3-8b", input="hello", max_output_tokens=int(tokens))
try:
    reply = stub.Infer(request, metadata=[("x-api-key", key)], timeout=10)
    print(reply.output)
except grpc.RpcError as err:
    status = rpc_status.from_call(err)  # the google.rpc.Status in grpc-status-details-bin
    print(f"{err.code().name}: {err.details()}")
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            print(f"reason: {info.reason} {dict(info.metadata)}")
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            print(f"retry after: {retry.retry_delay.ToMilliseconds()} ms")
    sys.exit(1)
