"""Request and response bodies of the OpenAI (chat, completions, models) and Anthropic (messages) APIs.

Field names and defaults follow OpenAI's reference and vLLM's extensions (top_k, min_p, repetition_penalty,
ignore_eos, min_tokens, chat_template_kwargs, ...). Unknown fields are ignored, as OpenAI's SDK sends extras.
Sampling fields default to None so that unset ones take the model's generation_config defaults.
"""
from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# ---- shared ---------------------------------------------------------------------------------------------


class ApiModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(ApiModel):
    include_usage: bool = False


class SamplingFields(ApiModel):
    """Fields both OpenAI endpoints share; each maps onto one SamplingParams field."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


# ---- chat completions -----------------------------------------------------------------------------------

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ContentPart(ApiModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(ApiModel):
    # tool_calls, tool_call_id, name, reasoning_content ... travel to the chat template untouched
    model_config = ConfigDict(extra="allow")
    role: Role
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


# ---- completions ----------------------------------------------------------------------------------------


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None


# ---- responses (OpenAI) ---------------------------------------------------------------------------------


class PromptTokensDetails(ApiModel):
    cached_tokens: int = 0


class Usage(ApiModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class TopLogprob(ApiModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(ApiModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class CompletionLogprobs(ApiModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class AssistantMessage(ApiModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = ""


class ChatChoice(ApiModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatStreamChoice(ApiModel):
    index: int
    delta: dict[str, Any]  # only the keys this chunk carries, as OpenAI sends them
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class CompletionChoice(ApiModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ResponseHeader(ApiModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: str | None = None


class ChatCompletionResponse(ResponseHeader):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatCompletionChunk(ResponseHeader):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


class CompletionResponse(ResponseHeader):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(ApiModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ember"
    max_model_len: int | None = None


class ModelList(ApiModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- Anthropic messages ---------------------------------------------------------------------------------


class AnthropicBlock(ApiModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class AnthropicMessage(ApiModel):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicBlock]


class AnthropicTool(ApiModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)


class MessagesRequest(ApiModel):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[AnthropicBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    metadata: dict[str, Any] | None = None


class AnthropicUsage(ApiModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessagesResponse(ApiModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: AnthropicUsage
