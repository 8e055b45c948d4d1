"""The end-to-end tests use the interop harnesses (built by `make interop-java` / `make interop-go`): the
same fixtures as tests/interop, which fail (never skip) when a harness or its toolchain is missing."""

from tests.interop.conftest import go_harness, java_harness

__all__ = ["go_harness", "java_harness"]
