from __future__ import annotations

import pytest

from tests.parity.models import CONFIGS


@pytest.fixture(params=sorted(CONFIGS))
def arch(request):
    return request.param
