"""llama.cpp's own numbers on a GGUF, for `bench_quantized.py`: greedy decode tokens/s at each batch (that many
sequences decoding together, one token each per `llama_decode`, as llama.cpp's batched example runs them) and
prefill tokens/s at each prompt length, through llama-cpp-python's low-level API (its high-level `Llama` decodes
one sequence). Runs in an interpreter that has llama_cpp (not fleetctl's); prints one JSON object.

    python llama_cpp_decode.py MODEL.gguf THREADS NEW_TOKENS '[1, 16, 64]' '[500, 2000]'
"""

import json
import sys
import time
from dataclasses import dataclass

import llama_cpp as L
import numpy as np

PROMPT = b"Write a short story about a lighthouse keeper who finds a message in a bottle."
CHUNK = 2048  # tokens per llama_decode of a prompt (n_batch)


@dataclass
class Run:
    """A llama.cpp context for `seqs` sequences and a batch to feed it."""

    ctx: L.llama_context_p
    batch: L.llama_batch
    n_vocab: int

    def step(self, items: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of items (token, position, sequence, wants logits)."""
        for i, (token, position, seq, logits) in enumerate(items):
            self.batch.token[i], self.batch.pos[i], self.batch.n_seq_id[i] = token, position, 1
            self.batch.seq_id[i][0], self.batch.logits[i] = seq, logits
        self.batch.n_tokens = len(items)
        if L.llama_decode(self.ctx, self.batch):
            raise RuntimeError("llama_decode failed")

    def greedy(self, row: int) -> int:
        return int(np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,)).argmax())

    def clear(self) -> None:
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)


def decode_seconds(run: Run, prompt: list[int], seqs: int, steps: int) -> float:
    """Seconds for `steps` greedy decode steps of `seqs` sequences, after their prompts."""
    run.clear()
    run.step([(t, p, s, p == len(prompt) - 1) for s in range(seqs) for p, t in enumerate(prompt)])
    last = [run.greedy(s * len(prompt) + len(prompt) - 1) for s in range(seqs)]
    start = time.perf_counter()
    for step in range(steps):
        run.step([(last[s], len(prompt) + step, s, True) for s in range(seqs)])
        last = [run.greedy(s) for s in range(seqs)]
    return time.perf_counter() - start


def prefill_seconds(run: Run, ids: list[int]) -> float:
    run.clear()
    start = time.perf_counter()
    for at in range(0, len(ids), CHUNK):
        run.step([(t, at + j, 0, at + j == len(ids) - 1) for j, t in enumerate(ids[at:at + CHUNK])])
    return time.perf_counter() - start


def main() -> None:
    path, threads, new_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    batches, lengths = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    vocab = L.llama_model_get_vocab(model)
    buffer = (L.llama_token * 256)()
    prompt = list(buffer[:L.llama_tokenize(vocab, PROMPT, len(PROMPT), buffer, 256, True, False)])
    out: dict[str, float] = {}
    for seqs in batches:
        params = L.llama_context_default_params()
        params.n_ctx = max(4096, seqs * (len(prompt) + new_tokens + 8))
        params.n_batch, params.n_ubatch, params.n_seq_max, params.kv_unified = CHUNK, 512, seqs, True
        params.n_threads = params.n_threads_batch = threads
        run = Run(L.llama_init_from_model(model, params), L.llama_batch_init(max(CHUNK, seqs * len(prompt)), 0, seqs),
                  L.llama_vocab_n_tokens(vocab))
        decode_seconds(run, prompt, seqs, 2)
        out[f"decode{seqs}"] = seqs * new_tokens / min(decode_seconds(run, prompt, seqs, new_tokens) for _ in range(3))
        if seqs == 1:
            for length in lengths:
                ids = (prompt * (length // len(prompt) + 1))[:length]
                out[f"prefill{length}"] = length / min(prefill_seconds(run, ids) for _ in range(2))
        L.llama_batch_free(run.batch)
        L.llama_free(run.ctx)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
