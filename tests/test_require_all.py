"""FLEET_REQUIRE_ALL=1 turns every skip but a CUDA one into a failure (tests/support/require_all.py)."""

from pathlib import Path

import pytest

CASES = '''
import pytest

pytest.importorskip("a_module_nobody_has")
'''

TESTS = '''
import pytest

def test_without_its_browser():
    pytest.skip("Debian's chromium is not installed")

def test_on_the_wrong_machine():
    pytest.skip("needs CUDA")

@pytest.mark.skipif(True, reason="needs a machine without CUDA (this one has an NVIDIA driver)")
def test_marked_for_cpu_machines():
    pass

@pytest.mark.xfail(reason="a known gap", strict=True)
def test_expected_to_fail():
    assert False
'''


@pytest.mark.parametrize("required", ["1", "0"])
def test_only_cuda_skips_survive_require_all(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                             required: str) -> None:
    monkeypatch.setenv("FLEET_REQUIRE_ALL", required)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # where `support` is
    pytester.makeconftest('pytest_plugins = ["support.require_all"]')
    pytester.makepyfile(test_cases=TESTS, test_missing_module=CASES)
    result = pytester.runpytest_subprocess("-p", "no:textual-snapshot", "--continue-on-collection-errors")
    if required == "1":
        result.assert_outcomes(failed=1, skipped=2, xfailed=1, errors=1)
        result.stdout.fnmatch_lines(["*FLEET_REQUIRE_ALL=1 and this test skipped: Debian's chromium*"])
    else:
        result.assert_outcomes(skipped=4, xfailed=1)
