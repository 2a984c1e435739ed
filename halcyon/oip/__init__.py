"""Generated stubs for the Open Inference Protocol (KServe v2 gRPC, package inference) (make proto)."""
