"""A client of another implementation: Python's grpcio, with messages
compiled from the server's .proto files by grpcio-tools (protoc's own parser),
and the JSON mapping of protobuf's own `json_format`.

Usage: client.py PROTO_DIR HOST:PORT < requests.jsonl
Each input line is a RateLimitRequest in the protocol's JSON mapping; each
output line is the answer: the RateLimitResponse in the JSON mapping, or
{"grpc_error": CODE_NAME, "details": ...}.
"""

import importlib
import json
import os
import sys
import tempfile

import grpc
from google.protobuf import json_format
from grpc_tools import protoc


def compile_protos(proto_dir, out_dir):
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    files = []
    for root, _, names in os.walk(proto_dir):
        for name in names:
            if name.endswith(".proto"):
                files.append(os.path.relpath(os.path.join(root, name), proto_dir))
    args = [
        "protoc",
        f"-I{proto_dir}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
    ] + sorted(files)
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {files}")
    # Packages for the generated modules' imports.
    for root, dirs, _ in os.walk(out_dir):
        for d in dirs:
            open(os.path.join(root, d, "__init__.py"), "a").close()


def main():
    proto_dir, target = sys.argv[1], sys.argv[2]
    out_dir = tempfile.mkdtemp(prefix="tollgate-grpcio-")
    compile_protos(proto_dir, out_dir)
    sys.path.insert(0, out_dir)
    rls_pb2 = importlib.import_module("envoy.service.ratelimit.v3.rls_pb2")
    rls_grpc = importlib.import_module("envoy.service.ratelimit.v3.rls_pb2_grpc")
    with grpc.insecure_channel(target) as channel:
        stub = rls_grpc.RateLimitServiceStub(channel)
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            request = json_format.Parse(line, rls_pb2.RateLimitRequest())
            try:
                response = stub.ShouldRateLimit(request, timeout=10)
                out = json_format.MessageToDict(response)
            except grpc.RpcError as error:
                out = {"grpc_error": error.code().name, "details": error.details()}
            print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
