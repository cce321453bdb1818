"""llama.cpp's batch-1 decode on prompts given as token ids, plain and with its prompt-lookup speculation
(`LlamaPromptLookupDecoding` of llama-cpp-python), for `bench_speculative.py`: greedy, decode tokens/s from the
first token to the last. Runs in an interpreter that has llama_cpp (not fleetctl's); prints one JSON object
{"plain": [tok/s per prompt], "lookup": [...]}.

    python llama_cpp_lookup.py MODEL.gguf THREADS NEW_TOKENS DRAFT_TOKENS '[[ids...], ...]'
"""

import json
import sys
import time

from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding


def decode_tokens_per_s(llm: Llama, prompt: list[int], new_tokens: int) -> float:
    """Greedy decode of `new_tokens` after `prompt`, timed from its first token (the prefill left out)."""
    llm.reset()
    times = []
    for _ in llm.create_completion(prompt, max_tokens=new_tokens, temperature=0.0, stream=True):
        times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def main() -> None:
    model, threads, new_tokens, draft_tokens, prompts = sys.argv[1:6]
    context = 8192
    out = {}
    for name, draft in (("plain", None), ("lookup", LlamaPromptLookupDecoding(num_pred_tokens=int(draft_tokens)))):
        llm = Llama(model, n_threads=int(threads), n_ctx=context, n_batch=2048, draft_model=draft, verbose=False,
                    logits_all=draft is not None)
        out[name] = [decode_tokens_per_s(llm, ids, int(new_tokens)) for ids in json.loads(prompts)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
