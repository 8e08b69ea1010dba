"""Runs each kernel test once per implementation of the module's ``OP`` on this host.

Implementations the host cannot run (missing ISA, variant not built, extension unavailable)
are reported as skips with the reason; the emulated Arm64 lane runs the aarch64 ones.
"""

from __future__ import annotations

import pytest
import torch

from anycore.kernels.dispatch import implementations, make_op


def pytest_generate_tests(metafunc):
    if "impl" in metafunc.fixturenames:
        op = metafunc.module.OP
        params = [
            pytest.param(name, id=name, marks=[pytest.mark.skip(reason=f"{name}: {why}")] if why else [])
            for name, why in implementations(op)
        ]
        metafunc.parametrize("impl", params)


@pytest.fixture
def kernel(request, impl):
    return make_op(request.module.OP, impl)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _tol(dtype: torch.dtype) -> dict:
    return {"rtol": 1e-5, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1.6e-2}


@pytest.fixture
def tol():
    """assert_close tolerances per dtype: fp32 tight, bf16 about one bf16 ulp."""
    return _tol
