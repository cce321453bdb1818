"""One engine: a model on one device with its KV pool, scheduler and runner. A worker process
(and `fleetctl generate`) drives it step by step."""

import dataclasses
import hashlib
import time
from concurrent.futures import wait

import torch

import fleetctl
from fleetctl.domain import Phase, Quantization
from fleetctl.engine.core.block_allocator import KV_LAYOUT_VERSION, blocks_for
from fleetctl.engine.core.block_hash import KVSalt, Numerics, PrefixDigest
from fleetctl.engine.core.decode_compile import compile_refusal, use_fleet_inductor_cache
from fleetctl.engine.core.engine_settings import EngineConfig, KVDtype
from fleetctl.engine.core.grammar import Grammars
from fleetctl.engine.core.kernel_warmup import needs_kernel_warm_up, warm_up_kernels
from fleetctl.engine.core.kv_cache import KVCache, KVCacheSpec
from fleetctl.engine.core.kv_offload import KVOffload, TierRead, open_tiers, take_tier_tokens
from fleetctl.engine.core.kv_pool_size import pool_size
from fleetctl.engine.core.kv_tiers.file_tier import TierStats
from fleetctl.engine.core.kv_window import KVWindow
from fleetctl.engine.core.model_runner import ModelRunner, StepStats
from fleetctl.engine.core.output import GenerationResult, RequestOutput, TextStream, result_of, token_finish_reason
from fleetctl.engine.core.prompt import PromptError, check_prompt
from fleetctl.engine.core.scheduler import ScheduledStep, Scheduler, SchedulerConfig
from fleetctl.engine.core.sequence import FinishReason, SamplingParams, Sequence
from fleetctl.engine.core.speculation import Speculator, engine_speculator
from fleetctl.engine.core.torch_devices import resolve_dtype, torch_device
from fleetctl.engine.model.compiled_decode import CompiledDecoder
from fleetctl.engine.model.decoder import DecoderModel
from fleetctl.engine.model.loader import load_weights
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.prepared import load_cpu_weights, weights_key
from fleetctl.engine.model.quantize import quantize_weights, resolve_quantization, weight_source
from fleetctl.engine.model.tokenizer import Tokenizer
from fleetctl.errors import FleetctlError
from fleetctl.kernels import cpu_build, ops
from fleetctl.kernels.batch_invariant import TILE as QUERY_TILE
from fleetctl.kernels.triton_support import Launch

# with nothing else to step, how long `schedule` waits for a KV tier read before returning (a worker's loop
# answers its messages in between)
TIER_READ_WAIT_S = 0.02
DIGEST_BLOCKS = 4096  # cap on a prefix digest: 64 KiB of hashes, 65,536 tokens of prefixes
SWITCHED_EAGER = "switched from prefill in place: its weights are laid out for eager steps (a restart compiles)"


class EngineBusy(FleetctlError):
    """The engine holds sequences, and what was asked of it needs it empty."""


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        start = time.perf_counter()
        self.config = config
        settings = config.settings
        self.device = torch_device(config.device)
        self.dtype = resolve_dtype(settings.dtype, self.device)
        self.model_config = ModelConfig.from_file(config.model_dir / "config.json")
        self.tokenizer = Tokenizer(config.model_dir, self.model_config.eos_token_ids)
        self.grammars = Grammars(self.tokenizer, self.model_config.vocab_size)
        self.quantization = resolve_quantization(settings.quantization, config.model_dir)
        # names the weights' layout (none, int8, int4-g64, int4-gguf, int4-gguf-mixed) for the prefix cache's salt
        # and checkpoints
        self.weight_format = weight_source(self.quantization, settings.quant_group_size, config.model_dir)
        # what an operator reads: the dtype for dense weights, else the format
        self.weights_label = str(self.dtype).removeprefix("torch.") if self.weight_format == "none" else \
            self.weight_format
        if self.device.type == "cpu":
            cpu_build.library()  # compiled before the worker reports ready, not in its first step
            weights = load_cpu_weights(config.model_dir, self.model_config, self.dtype, self.quantization,
                                       settings.quant_group_size)
        else:
            dense = load_weights(config.model_dir, self.model_config, self.dtype, self.device)
            weights = quantize_weights(dense, self.quantization, settings.quant_group_size, config.model_dir,
                                       self.model_config)
        # why decode steps run eagerly (None: compiled, each batch bucket on first use or at warm_up)
        self.eager_reason = compile_refusal(config, self.device, self.quantization is not Quantization.NONE,
                                            self.model_config)
        if self.eager_reason is not None:  # a compiled graph cannot take packed (opaque oneDNN) weights
            weights = weights.packed()
        requested_len = settings.context_limit(self.model_config.max_context)
        self.model = DecoderModel(self.model_config, weights, deterministic=settings.deterministic,
                                  long_rope=self.model_config.long_rope(requested_len))
        spec = KVCacheSpec.for_model(self.model_config, self.dtype, settings.kv_dtype)
        window = self.model_config.widest_window
        # leading blocks (or, windowed layers apart, their window slots) the scheduler gives back as sequences grow
        self.kv_window = None if window is None else KVWindow(
            window, spec.block_size, QUERY_TILE if settings.deterministic else 1, apart=bool(spec.windowed_layers))
        root = self._salt(spec).root() if settings.prefix_cache else None
        # a scratch block for the compiled step's padding rows, or for the kernels' warm-up
        scratch = self.eager_reason is None or needs_kernel_warm_up(self.device)
        blocks, window_slots = pool_size(settings, spec, self.device, config.memory_share, self.kv_window)
        self.kv_cache = KVCache(spec, blocks, self.device, root, scratch=scratch, window_slots=window_slots)
        tiers = open_tiers(settings.kv_offload_memory_bytes, settings.kv_offload_host_dir, settings.kv_offload_dir,
                           settings.kv_offload_disk_bytes) if root is not None else None
        # the node-wide tiers below the pool (prefix caching on): what it evicts is kept there, read back here
        self.offload = KVOffload(tiers, self.kv_cache, settings.kv_offload_policy) if tiers is not None else None
        self.decoder: CompiledDecoder | None = None
        self._compiled: CompiledDecoder | None = None  # the compiled decode step, kept across role switches
        if self.eager_reason is None and self.kv_cache.scratch_block is not None:
            use_fleet_inductor_cache()
            self.decoder = CompiledDecoder(self.model, self.kv_cache.scratch_block, settings.max_num_seqs)
        self.scheduler = Scheduler(
            SchedulerConfig(spec.block_size, settings.max_num_seqs, settings.max_num_batched_tokens, self.kv_window,
                            settings.session_ttl_s),
            self.kv_cache.allocator,
        )
        self.runner = ModelRunner(self.model, self.kv_cache, self.grammars, self.decoder)
        # a sequence may grow only as far as the pool could hold it alone: one that outgrew the whole pool
        # would be preempted forever and starve everything queued behind it
        self.max_model_len = min(requested_len, self.kv_cache.allocator.num_blocks * spec.block_size)
        self._seqs: dict[str, Sequence] = {}
        self._streams: dict[str, TextStream] = {}
        self.speculator = self._speculator()
        self._tier_reads: dict[str, tuple[Sequence, TierRead]] = {}  # prefixes coming off a KV tier, oldest first
        self.last_step: StepStats | None = None
        self.warmed_launches: set[Launch] = set()  # the kernel variants warm_up launched
        self.load_seconds = time.perf_counter() - start

    def _speculator(self) -> Speculator | None:
        """The drafts, where decode steps speculate: not on a prefill worker, nor where the compiled step (its batch
        buckets) or windowed layers' slots decode."""
        if self.config.prefill_only or self.decoder is not None or self.kv_window is not None:
            return None
        return engine_speculator(self.config.settings, self.config.model_dir, self.model_config.vocab_size)

    def warm_up(self) -> float:
        """Compile now what steps would otherwise compile on first use (a worker does this before it reports
        ready): every Triton kernel variant of an eager step (prefill, and decode unless compiled), and the
        compiled decode step's batch buckets. Returns the seconds taken."""
        start = time.perf_counter()
        if self.kv_cache.scratch_block is not None:
            settings = self.config.settings
            self.warmed_launches = warm_up_kernels(
                self.model, self.kv_cache, min(settings.max_num_seqs, settings.max_num_batched_tokens),
                blocks_for(self.max_model_len, self.kv_cache.spec.block_size), prefill=True,
                decode=self.decoder is None and not self.config.prefill_only)
        if self.decoder is not None:
            self.decoder.warm_up(self.kv_cache.tensor)
        return time.perf_counter() - start

    def switch_role(self, prefill_only: bool) -> float:
        """Re-lay this engine, in place, for a prefill worker (`prefill_only`: each sequence parks after its
        prefill, no decode step) or one that decodes. The weights, the KV pool and its prefix cache stay; what
        changes is whether steps park and which decode step runs. An engine that loaded as a prefill worker
        decodes eagerly (its weights were laid out for eager steps); one that compiled its decode step keeps the
        graphs for a switch back. Between two roles that decode (decode and mixed) the sequences it holds stay and
        go on from the next step; to or from prefill it must be empty, or it raises EngineBusy (a prefill worker's
        sequences are parked for a handoff). Returns the seconds taken, the warm-up of the new role's kernels
        included."""
        if self._seqs and (prefill_only or self.config.prefill_only):
            raise EngineBusy(f"the engine holds {len(self._seqs)} sequence(s): a switch to or from prefill needs it "
                             f"empty")
        start = time.perf_counter()
        self.config = dataclasses.replace(self.config, prefill_only=prefill_only)
        if self.decoder is not None:
            self._compiled = self.decoder
        self.decoder = None if prefill_only else self._compiled
        if self.decoder is None:
            self.eager_reason = compile_refusal(self.config, self.device, self.quantization is not Quantization.NONE,
                                                self.model_config) or SWITCHED_EAGER
        self.runner = ModelRunner(self.model, self.kv_cache, self.grammars, self.decoder)
        self.speculator = self._speculator()
        self.warm_up()
        return time.perf_counter() - start

    def _salt(self, spec: KVCacheSpec) -> KVSalt:
        model_dir = self.config.model_dir
        config_digest = hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
        dtype = str(self.dtype).removeprefix("torch.")
        return KVSalt(
            model=f"{weights_key(model_dir)}:{config_digest}:{self.weight_format}:{self.rope_factors}",
            # the model's dtype (what K/V are computed in), and a pool's own format beside it
            dtype=dtype if spec.kv_dtype is KVDtype.AUTO else f"{dtype}/kv-{spec.kv_dtype}",
            numerics=Numerics.DETERMINISTIC if self.config.settings.deterministic else Numerics.FAST,
            device_kind=self.device.type,
            kernels=ops.backend(self.device),
            engine_version=fleetctl.__version__,
            kv_layout=KV_LAYOUT_VERSION,
            block_size=spec.block_size,
        )

    @property
    def rope_factors(self) -> str:
        """Which of longrope's factor sets rotated this engine's keys ("short" for every other rope)."""
        return "long" if self.model.long_rope else "short"

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_prompt(ids, self.model_config.vocab_size, self.max_model_len)
        return ids

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str = "",
        output_token_ids: list[int] | None = None,
        seed: int = -1,
        session: str = "",
    ) -> Sequence:
        """Queue a request. With `output_token_ids` it is a recompute: prompt and earlier output are
        prefilled together and generation continues after them. A `session`'s blocks stay retained in the pool
        for `session_ttl_s` once it ends."""
        seq = Sequence(
            self.encode_prompt(prompt), params, request_id=request_id,
            output_token_ids=list(output_token_ids or []), seed=seed, session=session,
        )
        self._register(seq)
        if self.offload is not None:  # what the tiers hold of its prefix is read into the pool, as cached blocks
            read = self.offload.start_read(seq.token_ids, self.kv_cache.allocator.block_hashes(seq))
            if read is not None:
                seq.awaiting_tiers = True
                self._tier_reads[seq.request_id] = (seq, read)
        self.scheduler.add(seq)
        return seq

    def import_sequence(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        params: SamplingParams,
        seed: int,
        kv: torch.Tensor,
        first_block: int = 0,
        session: str = "",
    ) -> Sequence:
        """Adopt a sequence prefilled elsewhere (a KV handoff). Raises OutOfBlocks when it does not fit now."""
        seq = Sequence(list(prompt_token_ids), params, request_id=request_id,
                       output_token_ids=list(output_token_ids), seed=seed, session=session)
        self.adopt(seq, kv, first_block=first_block)
        return seq

    def adopt(self, seq: Sequence, kv: torch.Tensor, parked: bool = False, first_block: int = 0) -> None:
        """Take `seq` with kv [layers, 2, n_blocks, block_size, Hkv, d]: the K/V of every token but its
        last, from its block `first_block` on (those before were dropped: kv_window). `parked` keeps it out
        of decode (a restored prefill worker's sequence awaiting handoff). Leading blocks this engine caches
        already are shared rather than copied (so sessions restored from one checkpoint share their common
        prefix again); the copied full blocks are registered under this engine's salt, which a fleet's
        workers share (one EngineSettings for all)."""
        if seq.request_id in self._seqs:
            raise PromptError(f"request id {seq.request_id!r} is already running")
        copy_from = self.scheduler.admit_prefilled(seq, first_block)  # cached or dropped before it: no copy
        end = first_block + kv.shape[2]
        self.kv_cache.write_blocks(seq.block_table[copy_from:end], kv[:, :, copy_from - first_block :])
        self.kv_cache.allocator.cache_full_blocks(seq, copy_from * self.kv_cache.spec.block_size)
        if parked:
            self.scheduler.park(seq)
        self._register(seq)

    def attach_moved(self, seq: Sequence, blocks: list[int]) -> None:
        """Take a sequence moved here live (`session_transfer`), its K/V already written into `blocks`."""
        if seq.request_id in self._seqs:
            raise PromptError(f"request id {seq.request_id!r} is already running")
        self.scheduler.admit_moved(seq, blocks)
        self.kv_cache.allocator.cache_full_blocks(seq, 0)
        self._register(seq)

    def export_kv(self, request_id: str) -> tuple[int, torch.Tensor]:
        """The K/V of a parked sequence's cached tokens from its first block not dropped (kv_window): that
        block's index and kv [layers, 2, n_blocks, block_size, Hkv, d]."""
        seq = self.scheduler.parked[request_id]
        used = blocks_for(seq.num_cached_tokens, self.kv_cache.spec.block_size)
        return seq.num_dropped_blocks, self.kv_cache.read_blocks(seq.block_table[seq.num_dropped_blocks : used])

    def release(self, request_id: str) -> None:
        """Forget a request (finished elsewhere, handed off, or aborted) and free its blocks."""
        seq = self._seqs.pop(request_id, None)
        self._streams.pop(request_id, None)
        self._tier_reads.pop(request_id, None)  # a read in flight ends unused
        if self.speculator is not None:
            self.speculator.forget(request_id)
        if seq is None:  # an adopt that failed half-way leaves its sequence admitted but not registered
            seq = next((s for s in self.scheduler.running if s.request_id == request_id), None)
        if seq is not None:
            self.scheduler.finish(seq)

    def _register(self, seq: Sequence) -> None:
        if seq.request_id in self._seqs:
            raise PromptError(f"request id {seq.request_id!r} is already running")
        self._seqs[seq.request_id] = seq
        if self.config.detokenize:
            eos = frozenset() if seq.params.ignore_eos else self.tokenizer.eos_token_ids
            stream = TextStream(self.tokenizer, seq.params.stop, eos)
            for token in seq.output_token_ids:
                stream.push(token)
            stream.flush()
            self._streams[seq.request_id] = stream

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        """Leading tokens of `token_ids` (whole blocks) whose K/V this engine holds now."""
        return len(self.kv_cache.allocator.match(token_ids)) * self.kv_cache.spec.block_size

    def tier_io(self) -> dict[str, TierStats]:
        """What this engine read from and wrote to each KV tier so far, by tier name ({} without tiers)."""
        return self.offload.io() if self.offload is not None else {}

    def prefix_digest(self, limit: int = DIGEST_BLOCKS) -> PrefixDigest:
        """What this engine caches, for a KV-aware router (see block_hash.PrefixDigest)."""
        return self.kv_cache.allocator.digest(limit)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def sequence(self, request_id: str) -> Sequence | None:
        return self._seqs.get(request_id)

    def text_stream(self, request_id: str) -> TextStream | None:
        return self._streams.get(request_id)

    def step(self) -> list[RequestOutput]:
        """One model step; `last_step` describes it (None when nothing could be scheduled: the queue
        waits for blocks that parked or running sequences hold)."""
        scheduled = self.schedule()
        return self.run(scheduled) if scheduled is not None else []

    def schedule(self) -> ScheduledStep | None:
        self._land_tier_reads()
        if self.speculator is not None:  # each decoding sequence's draft for the step (a prefill leaves it unread)
            self.speculator.draft(self.scheduler.running, self.max_model_len)
        scheduled = self.scheduler.schedule()
        if scheduled is None and self._tier_reads:  # nothing else to run: wait a little for the oldest read
            wait([next(iter(self._tier_reads.values()))[1]], timeout=TIER_READ_WAIT_S)
            self._land_tier_reads()
            scheduled = self.scheduler.schedule()
        if scheduled is None:
            self.last_step = None
        return scheduled

    def _land_tier_reads(self) -> None:
        """Copy the KV tier reads that finished into the pool and let their sequences be admitted."""
        if self.offload is None:
            return
        for request_id, (seq, read) in list(self._tier_reads.items()):
            if read.done():
                del self._tier_reads[request_id]
                seq.tier_tokens = self.offload.land(read)
                seq.awaiting_tiers = False

    def run(self, scheduled: ScheduledStep) -> list[RequestOutput]:
        """Run a scheduled step, or some of its sequences again: a step that raised changed no sequence
        (a worker re-runs them one at a time to find the one that fails). One output per token a sequence gained
        (several where a draft was verified), in order."""
        written_from = [seq.num_cached_tokens for seq in scheduled.seqs]
        tokens, logprobs, stats = self.runner.run(scheduled)
        self.last_step = dataclasses.replace(stats, tier_tokens=take_tier_tokens(scheduled.seqs))
        decode = scheduled.phase is Phase.DECODE
        if self.speculator is not None and decode:
            self.speculator.observe(stats.request_ids, stats.drafted, stats.accepted, stats.num_tokens, stats.seconds)
        outputs = []
        for seq, new, new_logprobs, start in zip(scheduled.seqs, tokens, logprobs, written_from, strict=True):
            reason = None
            for token, token_logprobs in zip(new, new_logprobs, strict=True):  # none: a prefill chunk with more to come
                reason, delta = self._append(seq, token)
                outputs.append(RequestOutput(seq.request_id, token, delta, reason is not None, reason, token_logprobs))
                if reason:
                    break
            if decode:  # the K/V of every token it keeps but the last (a stop leaves later drafted ones unread)
                seq.num_cached_tokens = seq.num_tokens - 1
            self.kv_cache.allocator.cache_full_blocks(seq, start)
            if reason:
                self.scheduler.finish(seq)
                del self._seqs[seq.request_id]
                if self.speculator is not None:
                    self.speculator.finished(seq)
            elif decode:
                self.scheduler.trim(seq)  # the blocks a rejected draft's tokens took
            elif new and self.config.prefill_only:
                self.scheduler.park(seq)
        return outputs

    def _append(self, seq: Sequence, token: int) -> tuple[FinishReason | None, str]:
        """`token` appended to `seq` and its text streamed: why that ends the sequence (None: it goes on), and the
        text it adds."""
        seq.append_token(token)
        reason = token_finish_reason(seq, self.tokenizer.eos_token_ids, self.max_model_len)
        delta = ""
        stream = self._streams.get(seq.request_id)
        if stream is not None:
            delta = stream.push(token)
            if stream.stopped:
                reason = reason or FinishReason.STOP
            if reason:
                delta += stream.flush()
        seq.finish_reason = reason
        return reason, delta

    def generate(self, prompts: list[str | list[int]], params: SamplingParams) -> list[GenerationResult]:
        """Run a batch of prompts to completion."""
        seqs = [self.add_request(p, params) for p in prompts]
        streams = {s.request_id: self.text_stream(s.request_id) for s in seqs}
        while self.has_unfinished():
            self.step()
        return [result_of(s, streams[s.request_id]) for s in seqs]

