"""A tiny Qwen3-style tokenizer trained offline, for demos and tests that must not touch the Hugging Face hub.

`build_demo_tokenizer(out_dir)` trains a byte-level BPE (Qwen2's pre-tokenizer regex, NFC) on the English text
embedded below and writes tokenizer.json + tokenizer_config.json with ChatML special tokens and a chat template
that follows Qwen3's (system/user/assistant/tool roles, tool calls, `enable_thinking`). Deterministic: the same
files every run. `transformers.AutoTokenizer.from_pretrained(out_dir)` loads the result.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

DEMO_VOCAB_SIZE = 4096

# Qwen2/Qwen3's split regex: single digits, letters with one leading non-letter, punctuation runs, newlines.
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (content, special) in Qwen3's id order; special ones are skipped by decode(skip_special_tokens=True).
_ADDED_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

_CORPUS = """\
The small town sat at the edge of a wide river, and every morning the fog rolled in from the water before the
sun burned it away. Fishermen pushed their boats out at dawn, bakers lit their ovens, and children walked to
school along the old stone bridge. Nobody remembered who had built the bridge, but everyone agreed that it was
older than the church, older than the mill, and probably older than the town itself.

In the spring the river rose and flooded the lower fields. Farmers moved their sheep to the hills and waited.
When the water went down it left behind a layer of dark, rich mud, and the crops that grew in it were the best
in the valley. People said that the river took with one hand and gave with the other, and they were right.

A language model reads text as a sequence of tokens. A tokenizer splits the text into pieces that appear often
in its training data: common words become single tokens, while rare words are broken into several smaller
parts. Byte-level tokenizers never fail on unusual input, because any string of bytes can be written with the
two hundred and fifty-six basic byte tokens. Merges learned during training join frequent pairs into longer
tokens, so that ordinary English needs far fewer tokens than characters.

An inference engine serves many requests at the same time. The scheduler decides which requests run in each
step, the model runner executes the forward pass on the accelerator, and the sampler picks the next token from
the predicted distribution. Keys and values computed for earlier tokens are stored in a cache, split into fixed
size blocks, so that a long prompt does not have to be processed again for every new token. When two requests
share a prefix, such as the same system prompt, their blocks can be shared as well, which saves both memory
and time.

Questions are answered by looking carefully at the evidence. What happened? Where did it happen? Who was
there, and why did they do what they did? A good detective writes everything down, checks every detail twice,
and never assumes that the obvious answer is the correct one. Sometimes the smallest clue, a muddy footprint or
a clock that stopped at the wrong time, turns out to be the key to the whole mystery.

The weather today will be cloudy in the morning with a chance of light rain in the afternoon. Temperatures
will reach a high of eighteen degrees, falling to around nine degrees overnight. Tomorrow should be brighter,
with sunny spells and a gentle breeze from the west. Anyone planning a walk in the mountains should bring a warm
jacket, plenty of water, and a map, because conditions can change very quickly at higher altitudes.

To make bread you need flour, water, salt and yeast. Mix them together, knead the dough for ten minutes until
it is smooth and elastic, then leave it somewhere warm to rise. After an hour, shape it into a loaf, let it rise
again, and bake it in a hot oven for about forty minutes. The crust should be golden brown, and the loaf should
sound hollow when you tap it underneath. Let it cool before cutting, even though the smell makes waiting hard.

Mathematics describes patterns. Numbers count things, geometry measures shapes, and algebra finds unknown
values from known relationships. A function maps each input to exactly one output; a matrix arranges numbers
in rows and columns; a probability is a number between zero and one that describes how likely an event is.
Students often find these ideas difficult at first, but with practice they become familiar tools for thinking
clearly about the world.

The library was quiet except for the soft sound of pages turning. Rows of shelves stretched towards the back
wall, holding books about history, science, poetry, travel, cooking, music and art. An old librarian sat behind
the desk, stamping return dates on cards and occasionally looking up to smile at a visitor. She knew where every
book belonged, and she could usually guess which one you wanted before you asked.

Computers store information as bits, tiny switches that are either on or off. Eight bits make a byte, and a
byte can represent a number from zero to two hundred and fifty-five. Text is stored by giving every character a
number; the most common encoding today uses one to four bytes per character, so that English letters stay small
while other alphabets, symbols and emoji can still be represented. Programs read these bytes, transform them,
and write new bytes back to memory, to disk, or across the network to another machine.

Good software is written for people as much as for machines. Clear names, short functions and helpful error
messages make a program easier to understand, to test and to change. When something goes wrong, the message
should say what was expected, what was received, and what the user can do about it. Tests describe how the code
should behave, and they catch mistakes early, before they reach the people who depend on the program.

The travellers reached the coast after three long days on the road. They found a room in a small inn above the
harbour, where the owner served them fish soup, fresh bread and strong tea. From the window they could see the
lighthouse on the rocks and the ships waiting for the tide. That night a storm blew in from the sea, rattling the
shutters and sending waves crashing over the harbour wall, but by morning the sky was clear and the water calm.

Please summarise the following document. Translate this sentence into French. Write a short poem about autumn
leaves. Explain how a rainbow forms. List three advantages and three disadvantages of working from home. What is
the capital of Australia? How many legs does a spider have? Can you help me plan a birthday party for my sister?
Thank you very much for your help; I really appreciate it. You are welcome, and please let me know if you have
any other questions.
"""


def _corpus_lines() -> list[str]:
    # Case variants, with and without leading spaces ("Ġthe" vs "the"), give the trainer enough distinct
    # pairs to fill the vocabulary (about 5,000 reachable, 4,087 needed) from a few KB of text.
    lines = [line for line in _CORPUS.splitlines() if line.strip()]
    cased = lines + [line.upper() for line in lines] + [line.title() for line in lines]
    return cased + ["\n".join(line.split()) for line in cased]


def _train_backend() -> Tokenizer:
    backend = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = BpeTrainer(
        vocab_size=DEMO_VOCAB_SIZE - len(_ADDED_TOKENS),
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(_corpus_lines(), trainer=trainer)
    # Added tokens go after the learned vocabulary, as in Qwen (<|endoftext|> is the first id past the BPE).
    backend.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in _ADDED_TOKENS])
    return backend


# Follows Qwen3's template: tools go into the system turn, tool results are wrapped in a user turn, reasoning is
# kept only for assistant turns after the last real user query, and enable_thinking=false pre-fills an empty
# <think></think> block in the generation prompt.
DEMO_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with \
function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": \
<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')\
.split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + \
'\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


def _tokenizer_config() -> dict:
    # Shaped like Qwen3's tokenizer_config.json; ids follow the added tokens' order after the BPE vocabulary.
    first_id = DEMO_VOCAB_SIZE - len(_ADDED_TOKENS)
    added = {
        str(first_id + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": s}
        for i, (t, s) in enumerate(_ADDED_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": DEMO_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def build_demo_tokenizer(out_dir: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for the demo tokenizer into `out_dir` (created if needed)."""
    backend = _train_backend()
    num_tokens = backend.get_vocab_size(with_added_tokens=True)
    assert num_tokens == DEMO_VOCAB_SIZE, f"demo corpus yields {num_tokens} tokens, want {DEMO_VOCAB_SIZE}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend.save(str(out_dir / "tokenizer.json"))
    config_text = json.dumps(_tokenizer_config(), indent=2, ensure_ascii=False)
    (out_dir / "tokenizer_config.json").write_text(config_text + "\n", encoding="utf-8")
