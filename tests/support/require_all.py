"""`FLEET_REQUIRE_ALL=1` (set by `make test` and `.ci/run`): a test that skips fails instead, unless the skip
is about CUDA — a CPU machine cannot run a CUDA case, and a GPU machine cannot run a no-CUDA one. A missing
browser, Ray, schemathesis, transformers or playwright is then a red run, not a quiet `s`."""

import os

import pytest

# The reasons a test may still skip under FLEET_REQUIRE_ALL=1 (a skip's reason starts with one of them).
CUDA_REASONS = ("needs CUDA", "needs a machine without CUDA")


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def _fail_unless_cuda(report: pytest.CollectReport | pytest.TestReport) -> None:
    if os.environ.get("FLEET_REQUIRE_ALL") != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _reason(report)
    if not reason.startswith(CUDA_REASONS):
        report.outcome = "failed"
        report.longrepr = (f"FLEET_REQUIRE_ALL=1 and this test skipped: {reason}\n"
                           "Install what it needs (`make install`, `make browser`), or run with FLEET_REQUIRE_ALL=0.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    _fail_unless_cuda(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    _fail_unless_cuda(outcome.get_result())
