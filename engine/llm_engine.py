"""One engine: a model on one device with its KV pool, scheduler and runner. A worker process
(and `fleetctl generate`) drives it step by step."""

import time
from dataclasses import dataclass

from fleetctl.engine.config import DEFAULT_CPU_KV_BYTES, GPU_KV_FRACTION, EngineConfig
from fleetctl.engine.devices import available_memory, parse_device, resolve_dtype
from fleetctl.engine.kv_cache import KVCache, KVCacheSpec
from fleetctl.engine.model.config import ModelConfig
from fleetctl.engine.model.llama import LlamaModel
from fleetctl.engine.model.loader import load_weights
from fleetctl.engine.model.tokenizer import Tokenizer
from fleetctl.engine.output import RequestOutput, RequestState
from fleetctl.engine.runner import ModelRunner, StepStats
from fleetctl.engine.scheduler import Scheduler, SchedulerConfig
from fleetctl.engine.sequence import SamplingParams, Sequence


class PromptError(ValueError):
    """A prompt the engine cannot take: empty, longer than the context, or bad token ids."""


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    ttft_s: float
    decode_tokens_per_s: float


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        start = time.perf_counter()
        self.config = config
        self.device = parse_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model_config = ModelConfig.from_file(config.model_dir / "config.json")
        self.tokenizer = Tokenizer(config.model_dir, self.model_config.eos_token_ids)
        weights = load_weights(config.model_dir, self.model_config, self.dtype, self.device)
        self.model = LlamaModel(self.model_config, weights, deterministic=config.deterministic)
        spec = KVCacheSpec.for_model(self.model_config, self.dtype)
        self.kv_cache = KVCache(spec, self._pool_blocks(spec), self.device)
        self.scheduler = Scheduler(
            SchedulerConfig(spec.block_size, config.max_num_seqs, config.max_num_batched_tokens),
            self.kv_cache.allocator,
        )
        self.runner = ModelRunner(self.model, self.kv_cache)
        self.max_model_len = min(
            config.max_model_len or self.model_config.max_position_embeddings,
            self.model_config.max_position_embeddings,
        )
        self._states: dict[str, RequestState] = {}
        self.last_step: StepStats | None = None
        self.load_seconds = time.perf_counter() - start

    def _pool_blocks(self, spec: KVCacheSpec) -> int:
        if self.config.num_kv_blocks:
            return self.config.num_kv_blocks
        free = available_memory(self.device)
        budget = free * GPU_KV_FRACTION if self.device.type == "cuda" else min(free // 4, DEFAULT_CPU_KV_BYTES)
        if self.config.kv_memory_bytes:
            budget = min(budget, self.config.kv_memory_bytes)
        return max(1, int(budget // spec.bytes_per_block))

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise PromptError("the prompt is empty")
        if any(not 0 <= t < self.model_config.vocab_size for t in ids):
            raise PromptError(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise PromptError(
                f"the prompt is {len(ids)} tokens; this model's context is {self.max_model_len} tokens"
            )
        if not self.scheduler.fits_ever(len(ids) + 1):
            raise PromptError(f"the prompt is {len(ids)} tokens; the KV cache holds fewer")
        return ids

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str = ""
    ) -> Sequence:
        seq = Sequence(self.encode_prompt(prompt), params, request_id=request_id)
        if seq.request_id in self._states:
            raise PromptError(f"request id {seq.request_id!r} is already running")
        self._states[seq.request_id] = RequestState(
            seq, self.tokenizer, self.tokenizer.eos_token_ids, self.max_model_len
        )
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> None:
        state = self._states.pop(request_id, None)
        if state is not None:
            self.scheduler.finish(state.seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        if scheduled is None:
            return []
        tokens, self.last_step = self.runner.run(scheduled)
        outputs = []
        for seq, token in zip(scheduled.seqs, tokens, strict=True):
            seq.append_token(token)
            state = self._states[seq.request_id]
            out = state.on_token(token)
            if out.finished:
                seq.finish_reason = out.finish_reason
                self.scheduler.finish(seq)
                del self._states[seq.request_id]
            outputs.append(out)
        return outputs

    def state_of(self, request_id: str) -> RequestState | None:
        return self._states.get(request_id)

    def generate(self, prompts: list[str | list[int]], params: SamplingParams) -> list[GenerationResult]:
        """Run a batch of prompts to completion."""
        seqs = [self.add_request(p, params) for p in prompts]
        states = {s.request_id: self._states[s.request_id] for s in seqs}
        while self.has_unfinished():
            self.step()
        return [result_of(states[s.request_id]) for s in seqs]


def result_of(state: RequestState) -> GenerationResult:
    seq = state.seq
    first, last = seq.first_token_time or seq.arrival_time, seq.last_token_time or seq.arrival_time
    decoded = len(seq.output_token_ids) - 1
    return GenerationResult(
        request_id=seq.request_id,
        text=state.text,
        token_ids=list(seq.output_token_ids),
        finish_reason=seq.finish_reason.value if seq.finish_reason else "abort",
        prompt_tokens=len(seq.prompt_token_ids),
        ttft_s=first - seq.arrival_time,
        decode_tokens_per_s=decoded / (last - first) if decoded > 0 and last > first else 0.0,
    )



