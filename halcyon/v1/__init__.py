"""Generated gRPC stubs for halcyon.v1 (make proto)."""
