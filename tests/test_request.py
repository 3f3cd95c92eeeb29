from __future__ import annotations

from ember.request import Request, RequestStatus
from ember.sampling_params import SamplingParams


def test_token_slice_equals_slicing_all_token_ids():
    r = Request("a", [1, 2, 3, 4, 5], SamplingParams(), 0, [0], 16)
    r.output_token_ids += [6, 7, 8]
    full = r.all_token_ids()
    for start in range(len(full) + 2):
        for end in range(start, len(full) + 3):
            assert r.token_slice(start, end) == full[start:end], (start, end)


def test_finished_statuses():
    assert [s.is_finished for s in RequestStatus] == [False, False, False, True, True, True]
    r = Request("a", [1], SamplingParams(), 0, [0], 16)
    for status in RequestStatus:
        r.status = status
        assert r.is_finished == status.is_finished
