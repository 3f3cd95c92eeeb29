"""One record per request, owned by the scheduler."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from ember.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3  # eos, stop token or stop string
    FINISHED_LENGTH = 4  # max_tokens or the context window
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= _FIRST_FINISHED

    @property
    def finish_reason(self) -> str | None:
        return {3: "stop", 4: "length", 5: "abort"}.get(int(self))


# a module constant: looking a member up on its enum class costs ~0.1 us, and this is read per request per step
_FIRST_FINISHED = RequestStatus.FINISHED_STOPPED

# an output token sampled by a step still running on the device (async scheduling): counted in every length, fed to
# the next step from the device copy of the sample, never hashed, detokenized or sent; replaced when the step ends
PLACEHOLDER_TOKEN_ID = -1


@dataclass(slots=True, eq=False)
class Request:
    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    eos_token_ids: list[int]
    max_tokens: int  # resolved against the context window
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 until admitted
    block_ids: list[int] = field(default_factory=list)
    group_block_ids: list[list[int]] = field(default_factory=list)  # KV groups after the first (sliding windows)
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0  # leading blocks already entered in the prefix cache
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    num_placeholders: int = 0  # trailing PLACEHOLDER_TOKEN_IDs in output_token_ids (0 or 1)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_known_tokens(self) -> int:
        """num_tokens without the placeholders of a step still in flight."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) - self.num_placeholders

    def token_at(self, i: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < n else self.output_token_ids[i - n]

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_token_ids()[start:end] without copying the rest of the sequence."""
        prompt, n = self.prompt_token_ids, len(self.prompt_token_ids)
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return self.output_token_ids[start - n:end - n]
        return prompt[start:] + self.output_token_ids[:end - n]

    @property
    def is_finished(self) -> bool:
        return self.status >= _FIRST_FINISHED
